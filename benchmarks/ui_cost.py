"""What the console costs to keep open, by cluster size, against a no-draw baseline.

For each size N (default 2, 8, 32, 64) in one run:

1. ``sparkconsole demo --serve --nodes N`` runs the simulated Sparks in their own process, and one
   REAL OpenSSH sshd on loopback (``tests/lab/sshd.py``) is added as node N+1: through it the
   console follows ``docker logs -f`` of a real container (the local Docker engine) printing
   about 5,000 lines/s.
2. The console runs in tmux at 200x60 polling every node every second
   (``benchmarks/ui_console.py`` wraps Textual's frame and the node poll to time them; the
   product carries no hooks). After a warm-up it is measured for ``--seconds``:
   CPU share of one core (psutil on the console's process), CPU per node refresh (CPU seconds /
   polls finished in the window), frame time (median and p95 of Textual's update: layout,
   compositor, terminal write).
3. The log of the chatty container is opened (the command palette), and measured again; then the
   key latency: ``?`` sent with ``tmux send-keys`` until the help is on the pane (capture-pane
   every 5 ms), Esc until it is gone, ``--keys`` times (median and p90).
4. The baseline: the same pollers on the same connections at the same interval, parsing every
   sample and drawing nothing (``ui_console.py --poll-only``), for the same time.
5. The serving poll's cost (issue 24): the same console on the same cluster with ``--no-serving``
   (no engine discovery, no ``/metrics`` reads), measured the same way right after. Every demo
   Spark runs at least one vLLM engine (the story's ``embeddings`` on each worker, three on the
   head), so at 32 Sparks the console reads 34 engine pages every third tick.

The ratios ``console / baseline`` (what drawing adds) and ``serving on / off`` (what the serving
poll adds) are the claims; absolute numbers move with the machine and whatever else runs on it.

    .venv/bin/python benchmarks/ui_cost.py [--sizes 2,8,32,64] [--seconds 20] [--keys 10] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.lab.docker import docker, ensure_dockerd, ensure_image  # noqa: E402
from tests.lab.sshd import LabSshd  # noqa: E402

PY = sys.executable
SPARKCONSOLE = str(Path(PY).with_name("sparkconsole"))
SESSION = "sc-uicost"
CHATTY = "sctest-uicost-chatty"
LINES_PER_S = 5000
WARMUP_S = 8.0


def _tmux(*args: str, check: bool = True) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, check=check).stdout


def _pane() -> str:
    return _tmux("capture-pane", "-p", "-t", SESSION, check=False)


def _wait(condition, timeout: float, what: str, step: float = 0.1) -> None:
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise TimeoutError(f"timed out waiting for {what}; the pane shows:\n{_pane()}")
        time.sleep(step)


def start_demo(n: int, work: Path) -> tuple[subprocess.Popen, Path]:
    inventory = work / f"demo-{n}.toml"
    proc = subprocess.Popen([SPARKCONSOLE, "demo", "--serve", "--nodes", str(n), "--inventory", str(inventory)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                            env={**os.environ, "SPARKCONSOLE_STATE_DIR": str(work / "state")})
    _wait(lambda: (inventory.exists() and inventory.stat().st_size > 0) or proc.poll() is not None, 120,
          "the demo cluster")
    if proc.poll() is not None:
        raise RuntimeError(f"demo --serve exited: {proc.stderr.read().decode() if proc.stderr else ''}")
    return proc, inventory


def stop(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)  # what stops demo --serve (SIGINT may be ignored in a background job)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


def lab_block(sshd: LabSshd) -> str:
    return (f'\n[[nodes]]\nname = "lab-log"\nhost = "{sshd.host}"\nport = {sshd.port}\nuser = "{sshd.user}"\n'
            f'role = "worker"\nknown_hosts = "{sshd.known_hosts}"\nidentity = "{sshd.user_key}"\n')


def start_chatty() -> None:
    ensure_dockerd()
    image = ensure_image()
    docker("rm", "-f", CHATTY, check=False)
    per_tick = LINES_PER_S // 10
    docker("run", "-d", "--name", CHATTY, image, "sh", "-c",
           f"i=0; while :; do seq $i $((i + {per_tick - 1})); i=$((i + {per_tick})); sleep 0.1; done")


def console_process() -> psutil.Process:
    pane_pid = int(_tmux("display", "-p", "-t", SESSION, "#{pane_pid}").strip())
    root = psutil.Process(pane_pid)
    for proc in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            if "benchmarks.ui_console" in " ".join(proc.cmdline()):
                return proc
    raise RuntimeError("the console process was not found in the tmux pane")


def cpu_over(proc: psutil.Process, seconds: float) -> tuple[float, float, float]:
    """(cpu seconds, start, end) of ``proc`` over a window of ``seconds``."""
    t0 = proc.cpu_times()
    start = time.time()
    time.sleep(seconds)
    t1 = proc.cpu_times()
    end = time.time()
    return (t1.user + t1.system) - (t0.user + t0.system), start, end


def key_latencies(count: int) -> list[float]:
    out = []
    for _ in range(count):
        start = time.perf_counter()
        _tmux("send-keys", "-t", SESSION, "?")
        _wait(lambda: "Rebind any key" in _pane(), 10, "the help", step=0.005)
        out.append(time.perf_counter() - start)
        _tmux("send-keys", "-t", SESSION, "Escape")
        _wait(lambda: "Rebind any key" not in _pane(), 10, "the help to close", step=0.005)
        time.sleep(0.2)
    return out


def window_stats(stats: dict, start: float, end: float) -> dict:
    frames = [d for t, d in stats["frames"] if start <= t <= end]
    polls = [t for t in stats["polls"] if start <= t <= end]
    return {"frames": len(frames), "polls": len(polls),
            "frame_ms_median": 1000 * statistics.median(frames) if frames else None,
            "frame_ms_p95": 1000 * sorted(frames)[int(0.95 * (len(frames) - 1))] if frames else None}


def console_command(work: Path, stats_path: Path, config: Path, *extra: str) -> str:
    env = f"SPARKCONSOLE_STATE_DIR={shlex.quote(str(work / 'state'))}"
    tail = "".join(f" {shlex.quote(a)}" for a in extra)
    return (f"cd {shlex.quote(str(ROOT))} && env {env} {shlex.quote(PY)} -m benchmarks.ui_console "
            f"--stats {shlex.quote(str(stats_path))} -- --config {shlex.quote(str(config))} --interval 1{tail}")


def idle_cpu(work: Path, config: Path, seconds: float, name: str, *extra: str) -> tuple[float, dict]:
    """The console's CPU share over ``seconds`` after the warm-up, in its first view, nothing opened."""
    stats_path = work / f"stats-{name}.json"
    try:
        _tmux("kill-session", "-t", SESSION, check=False)
        _tmux("new-session", "-d", "-s", SESSION, "-x", "200", "-y", "60",
              console_command(work, stats_path, config, *extra))
        _wait(lambda: "polling every 1 s" in _pane(), 60, "the console")
        proc = console_process()
        time.sleep(WARMUP_S)
        cpu, start, end = cpu_over(proc, seconds)
        _tmux("send-keys", "-t", SESSION, "q")
        _wait(lambda: stats_path.exists(), 30, "the console to exit")
    finally:
        _tmux("kill-session", "-t", SESSION, check=False)
    return 100 * cpu / seconds, window_stats(json.loads(stats_path.read_text()), start, end)


def measure(n: int, seconds: float, keys: int, work: Path, sshd: LabSshd) -> dict:
    demo, inventory = start_demo(n, work)
    config = work / f"console-{n}.toml"
    config.write_text(inventory.read_text() + lab_block(sshd))
    stats_path = work / f"stats-{n}.json"
    command = console_command(work, stats_path, config)
    try:
        _tmux("kill-session", "-t", SESSION, check=False)
        _tmux("new-session", "-d", "-s", SESSION, "-x", "200", "-y", "60", command)
        _wait(lambda: "polling every 1 s" in _pane(), 60, "the console")
        proc = console_process()
        time.sleep(WARMUP_S)
        view = "table" if "running  alerts" in _pane() else "cards"
        cpu, start, end = cpu_over(proc, seconds)
        _tmux("send-keys", "-t", SESSION, "v")  # the other view, measured the same way
        time.sleep(3.0)
        other_cpu, _, _ = cpu_over(proc, seconds)
        _tmux("send-keys", "-t", SESSION, "v")
        _tmux("send-keys", "-t", SESSION, "C-p")
        time.sleep(0.5)
        _tmux("send-keys", "-t", SESSION, "-l", f"Tail log of {CHATTY}")
        time.sleep(1.0)
        _tmux("send-keys", "-t", SESSION, "Enter")
        _wait(lambda: CHATTY in _pane() and "Rebind" not in _pane(), 30, "the log screen")
        time.sleep(3.0)
        log_cpu, log_start, log_end = cpu_over(proc, seconds)
        latencies = key_latencies(keys)
        _tmux("send-keys", "-t", SESSION, "q")
        _wait(lambda: stats_path.exists(), 30, "the console to exit")
    finally:
        _tmux("kill-session", "-t", SESSION, check=False)
    stats = json.loads(stats_path.read_text())
    base_path = work / f"baseline-{n}.json"
    subprocess.run([PY, "-m", "benchmarks.ui_console", "--stats", str(base_path), "--poll-only", str(config),
                    "--seconds", str(seconds + WARMUP_S)], cwd=ROOT, check=True,
                   env={**os.environ, "SPARKCONSOLE_STATE_DIR": str(work / "state")})
    base = json.loads(base_path.read_text())
    base_polls = len(base["polls"])
    # the serving poll on and off on the same cluster, nothing opened, interleaved (on, off, on,
    # off) so that a change in the machine's load falls on both
    on, off = [], []
    for i in range(2):
        on.append(idle_cpu(work, config, seconds, f"on-{n}-{i}")[0])
        off.append(idle_cpu(work, config, seconds, f"off-{n}-{i}", "--no-serving")[0])
    serving_on, serving_off = statistics.mean(on), statistics.mean(off)
    stop(demo)
    idle = window_stats(stats, start, end)
    logging = window_stats(stats, log_start, log_end)
    base_cpu_per_poll = base["cpu_s"] / base_polls if base_polls else None
    return {
        "nodes": n,
        "view": view,
        "console_cpu_pct": 100 * cpu / seconds,
        "other_view_cpu_pct": 100 * other_cpu / seconds,
        "console_cpu_ms_per_refresh": 1000 * cpu / idle["polls"] if idle["polls"] else None,
        "refreshes_per_s": idle["polls"] / seconds,
        "frame_ms_median": idle["frame_ms_median"], "frame_ms_p95": idle["frame_ms_p95"],
        "frames_per_s": idle["frames"] / seconds,
        "baseline_cpu_pct": 100 * base["cpu_s"] / (base["end"] - base["start"]),
        "baseline_cpu_ms_per_refresh": None if base_cpu_per_poll is None else 1000 * base_cpu_per_poll,
        "with_log_cpu_pct": 100 * log_cpu / seconds,
        "with_log_frame_ms_median": logging["frame_ms_median"],
        "key_ms_median": 1000 * statistics.median(latencies),
        "key_ms_p90": 1000 * sorted(latencies)[int(0.9 * (len(latencies) - 1))],
        "serving_on_cpu_pct": serving_on,
        "serving_off_cpu_pct": serving_off,
    }


def table(rows: list[dict]) -> str:
    def f(v, digits=1):
        return "—" if v is None else f"{v:.{digits}f}"

    head = ("| Sparks | view chosen | console CPU % of a core | baseline (no draw) % | ratio | the other view: "
            "CPU % | CPU ms / refresh (console · baseline) | refreshes/s | frame ms (median · p95) | with a 5k "
            "lines/s log: CPU % | key latency ms (median · p90) | serving poll on · off: CPU % | ratio |")
    lines = [head, "|" + "---|" * 13]
    for r in rows:
        ratio = r["console_cpu_pct"] / r["baseline_cpu_pct"] if r["baseline_cpu_pct"] else None
        lines.append(
            f"| {r['nodes']} + 1 | {r['view']} | {f(r['console_cpu_pct'])} | {f(r['baseline_cpu_pct'])} | "
            f"{f(ratio, 2)}× | {f(r['other_view_cpu_pct'])} | "
            f"{f(r['console_cpu_ms_per_refresh'], 2)} · {f(r['baseline_cpu_ms_per_refresh'], 2)} | "
            f"{f(r['refreshes_per_s'])} | {f(r['frame_ms_median'], 2)} · {f(r['frame_ms_p95'], 2)} | "
            f"{f(r['with_log_cpu_pct'])} | {f(r['key_ms_median'], 0)} · {f(r['key_ms_p90'], 0)} | "
            f"{f(r['serving_on_cpu_pct'])} · {f(r['serving_off_cpu_pct'])} | "
            f"{f(r['serving_on_cpu_pct'] / r['serving_off_cpu_pct'] if r['serving_off_cpu_pct'] else None, 2)}× |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="2,8,32,64")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--keys", type=int, default=10)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if not shutil.which("tmux"):
        print("ui_cost: needs tmux", file=sys.stderr)
        return 2
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    rows = []
    with tempfile.TemporaryDirectory(prefix="sc-uicost-") as tmp:
        work = Path(tmp)
        sshd = LabSshd(work / "sshd", alias="lab-log")
        sshd.start()
        try:
            start_chatty()
            for n in sizes:
                rows.append(measure(n, args.seconds, args.keys, work, sshd))
                if not args.json:
                    print(f"measured {n} Sparks", file=sys.stderr)
        finally:
            docker("rm", "-f", CHATTY, check=False)
            sshd.stop()
    print(json.dumps(rows, indent=2) if args.json else table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
