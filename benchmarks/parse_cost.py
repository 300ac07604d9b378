"""What parsing costs the console per tick and per log line, against an honest naive baseline.

Two measurements, both on real text (no network, no sshd):

1. Probe tick: ``split_tick`` + ``assemble_sample`` (every parser) on a tick framed exactly as
   the probe frames it. The GB10-specific sections are the real GB10 fixtures in
   ``tests/fixtures/real/gb10`` (nvidia-smi table, --query-gpu CSV, --query-compute-apps CSV,
   ibdev2netdev, ip addr, docker ps); no raw GB10 ``/proc/meminfo``, ``df``, ``uptime``,
   ``hostname``/``uname``/``nproc`` is public, so those come from THIS machine, captured once.
   Compared side by side:
     - cadence tick (sparkconsole): the sections ``sections_for_tick(1)`` asks for, the rest
       carried over from the previous sample;
     - every section every tick (the baseline: no cadence, re-read everything each refresh).
   Plus each parser on its own, in µs.

2. vLLM log: :class:`sparkconsole.logs.vllm.VllmLogTracker` on the real logs in
   ``tests/fixtures/real/vllm-logs`` and the GB10 start-up excerpt, headers stripped.
     - incremental (sparkconsole): ``feed(line)`` then read ``report``, for every line;
     - naive baseline: a stateless poller re-parses its capture window (the last 200 lines, as
       spark-vllm-tui's ``docker logs --tail 200``-style capture does) every time a line arrives,
       i.e. ``parse_vllm_log(window)`` per new line;
     - one stateless refresh: a full 200-line window re-parsed once (what such a poller pays per
       refresh whether or not anything new arrived), against the incremental cost of one line.
   Both paths must reach the same final report on every log (checked).

Run from the repository root::

    .venv/bin/python benchmarks/parse_cost.py [--json] [--min-time 0.2]
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sparkconsole.logs.vllm import VllmLogTracker, parse_vllm_log  # noqa: E402
from sparkconsole.probe import parsers as p  # noqa: E402
from sparkconsole.probe.assemble import assemble_sample  # noqa: E402
from sparkconsole.probe.script import MARK, SECTION_BY_NAME, SECTIONS, sections_for_tick, split_tick  # noqa: E402

REAL = ROOT / "tests" / "fixtures" / "real"
WINDOW = 200  # lines a stateless poller captures per refresh

GB10_FILES = {
    "gpu": "gb10/nvidia-smi_query-gpu_csv_header_partial_gb10.txt",
    "gpu-apps": "gb10/nvidia-smi_query-compute-apps_vllm_gb10.txt",
    "nvidia-smi": "gb10/nvidia-smi_gb10_idle_desktop.txt",
    "ibdev2netdev": "gb10/ibdev2netdev_port1_up.txt",
    "ip-addr": "gb10/ip_addr_show_enp1s0f1np1_static.txt",
    "docker-ps": "gb10/docker_ps_format_gb10.txt",
}
LOCAL_SECTIONS = ("hostname", "uname", "nproc", "uptime", "meminfo", "df")


def strip_fixture_header(text: str) -> str:
    """Drop the collectors' ``# source:``/``# what:``... lines (as tests/conftest.py does)."""
    keep = [ln for ln in text.splitlines()
            if not ln.startswith(("# source:", "# what:", "# machine:", "# when:", "# rc:", "# vllm:"))]
    return "\n".join(keep) + "\n"


def real_fixture(rel: str) -> str:
    return strip_fixture_header((REAL / rel).read_text(encoding="utf-8"))


# ------------------------------------------------------------------------------ timing


def per_call_s(fn: Callable[[], object], min_time: float, repeats: int = 5) -> float:
    """Median over ``repeats`` of the mean seconds per call in a loop of at least ``min_time``."""
    fn()  # warm
    n = 1
    while True:  # calibrate the loop size
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        dt = time.perf_counter() - t0
        if dt >= min_time / 4:
            break
        n *= 2
    n = max(1, int(n * (min_time / max(dt, 1e-9))))
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter() - t0) / n)
    return statistics.median(samples)


# ------------------------------------------------------------------------------ probe ticks


def tick_texts() -> tuple[dict[str, str], dict[str, str]]:
    """Section name -> output text, and name -> where it came from."""
    texts: dict[str, str] = {}
    origin: dict[str, str] = {}
    for name, rel in GB10_FILES.items():
        texts[name] = real_fixture(rel)
        origin[name] = f"real GB10 fixture {rel}"
    for name in LOCAL_SECTIONS:
        out = subprocess.run(["/bin/sh", "-c", SECTION_BY_NAME[name].shell()], capture_output=True,
                             text=True, env={**os.environ, "LC_ALL": "C"}, timeout=30)
        texts[name] = out.stdout.rstrip("\n")
        origin[name] = "this machine (no public GB10 capture)"
    return texts, origin


def frame(texts: dict[str, str], names: tuple[str, ...], seq: int = 1) -> list[str]:
    """The lines of one tick, between ``begin`` and ``end``, as the probe writes them."""
    lines: list[str] = []
    for name in names:
        lines.append(f"{MARK} section {name}")
        lines.extend(texts[name].splitlines())
        lines.append(f"{MARK} rc {name} 0")
    return lines


def probe_ticks(min_time: float) -> dict[str, object]:
    texts, origin = tick_texts()
    ordered = tuple(s.name for s in SECTIONS)
    all_names = tuple(n for n in ordered if n in texts)
    steady_names = tuple(n for n in sections_for_tick(1) if n in texts)
    full_lines = frame(texts, all_names)
    steady_lines = frame(texts, steady_names)
    first = assemble_sample("spark-1", 1.0, split_tick(full_lines))
    if first.gpus == () or first.meminfo is None or not first.links:
        raise RuntimeError("the GB10 tick did not assemble into a sample with GPUs, memory and links")

    def full_tick() -> object:
        return assemble_sample("spark-1", 2.0, split_tick(full_lines), previous=first)

    def steady_tick() -> object:
        return assemble_sample("spark-1", 2.0, split_tick(steady_lines), previous=first)

    full_s = per_call_s(full_tick, min_time)
    steady_s = per_call_s(steady_tick, min_time)

    single: dict[str, Callable[[str], object]] = {
        "hostname": p.parse_hostname,
        "uname": p.parse_uname,
        "nproc": p.parse_nproc,
        "uptime": p.parse_uptime,
        "meminfo": p.parse_meminfo,
        "gpu": lambda t: p.gpus_from_query(p.parse_nvidia_smi_csv(t)),
        "gpu-apps": p.parse_nvidia_smi_csv,
        "nvidia-smi": p.parse_nvidia_smi_table,
        "ibdev2netdev": p.parse_ibdev2netdev,
        "ip-addr": p.parse_ip_addr,
        "docker-ps": p.parse_docker_ps,
        "df": p.parse_df,
    }
    parsers_us = {}
    for name in all_names:
        text = texts[name]
        fn = single[name]
        parsers_us[name] = round(per_call_s(lambda fn=fn, text=text: fn(text), min_time / 4) * 1e6, 2)
    split_us = per_call_s(lambda: split_tick(full_lines), min_time / 2) * 1e6
    return {
        "sections_full": list(all_names),
        "sections_cadence": list(steady_names),
        "section_origin": origin,
        "lines_full_tick": len(full_lines),
        "lines_cadence_tick": len(steady_lines),
        "full_tick_us": round(full_s * 1e6, 1),
        "cadence_tick_us": round(steady_s * 1e6, 1),
        "full_over_cadence": round(full_s / steady_s, 2),
        "split_tick_full_us": round(split_us, 1),
        "parser_us": parsers_us,
        "share_of_2s_interval_pct": round(full_s / 2.0 * 100, 4),
    }


# ------------------------------------------------------------------------------ vLLM logs


def vllm_logs() -> dict[str, list[str]]:
    files = sorted((REAL / "vllm-logs").glob("*.log"))
    files.append(REAL / "gb10" / "vllm_serve_startup_log_excerpt_gb10.txt")
    out = {}
    for f in files:
        text = strip_fixture_header(f.read_text(encoding="utf-8", errors="replace"))
        out[f.name] = text.rstrip("\n").split("\n")
    return out


def vllm_cost(min_time: float) -> dict[str, object]:
    logs = vllm_logs()
    total_lines = sum(len(v) for v in logs.values())

    def incremental() -> None:
        for lines in logs.values():
            t = VllmLogTracker()
            for line in lines:
                t.feed(line)
                t.report  # noqa: B018 - the UI reads the report after every line (worst case)

    def bulk() -> None:
        for lines in logs.values():
            t = VllmLogTracker()
            t.feed_lines(lines)
            t.report  # noqa: B018

    def naive() -> None:
        for lines in logs.values():
            for i in range(1, len(lines) + 1):
                parse_vllm_log("\n".join(lines[max(0, i - WINDOW):i]))

    # Same answers both ways (the longest log is under WINDOW lines, so the window is the log).
    for name, lines in logs.items():
        t = VllmLogTracker()
        for line in lines:
            t.feed(line)
        whole = parse_vllm_log("\n".join(lines[-WINDOW:]))
        if t.report.contract_dict() != whole.contract_dict():
            raise RuntimeError(f"{name}: incremental and whole-log parses disagree")

    inc_s = per_call_s(incremental, min_time) / total_lines
    bulk_s = per_call_s(bulk, min_time) / total_lines
    naive_s = per_call_s(naive, min_time) / total_lines

    # One stateless refresh: a full 200-line window. The real logs are shorter than that, so the
    # window is the tail of all of them back to back (the tracker treats each banner as a restart).
    stream = [line for lines in logs.values() for line in lines]
    window_text = "\n".join(stream[-WINDOW:])
    window_s = per_call_s(lambda: parse_vllm_log(window_text), min_time)

    return {
        "logs": len(logs),
        "lines": total_lines,
        "longest_log_lines": max(len(v) for v in logs.values()),
        "incremental_us_per_line": round(inc_s * 1e6, 2),
        "incremental_lines_per_s": round(1 / inc_s),
        "bulk_us_per_line": round(bulk_s * 1e6, 2),
        "bulk_lines_per_s": round(1 / bulk_s),
        "naive_us_per_new_line": round(naive_s * 1e6, 2),
        "naive_lines_per_s": round(1 / naive_s),
        "naive_over_incremental": round(naive_s / inc_s, 1),
        "window_lines": min(WINDOW, len(stream)),
        "window_reparse_us": round(window_s * 1e6, 1),
        "window_reparse_over_one_incremental_line": round(window_s / inc_s, 1),
    }


# ------------------------------------------------------------------------------ output


def machine_line() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores {cpu}, Linux {platform.release()}, Python {platform.python_version()}"


def print_report(r: dict[str, object]) -> None:
    t: dict = r["probe_tick"]  # type: ignore[assignment]
    v: dict = r["vllm_log"]  # type: ignore[assignment]
    print("parse_cost — parsers on real text, no network")
    print(f"machine: {r['machine']}")
    print(f"date:    {r['date']}")
    print()
    print("1. probe tick: split_tick + assemble_sample (all parsers)")
    print(f"   GB10 sections from the real fixtures: {', '.join(GB10_FILES)}")
    print(f"   from this machine (no public GB10 capture): {', '.join(LOCAL_SECTIONS)}")
    print()
    print(f"   {'variant':52} {'sections':>8} {'lines':>6} {'µs/tick':>9} {'ratio':>8}")
    print(f"   {'cadence tick (sparkconsole: sections_for_tick(1))':52} {len(t['sections_cadence']):8d}"
          f" {t['lines_cadence_tick']:6d} {t['cadence_tick_us']:9.1f} {'1.0×':>8}")
    print(f"   {'every section every tick (no-cadence baseline)':52} {len(t['sections_full']):8d}"
          f" {t['lines_full_tick']:6d} {t['full_tick_us']:9.1f} {t['full_over_cadence']:7.1f}×")
    print(f"   a full tick is {t['share_of_2s_interval_pct']:.3f}% of a 2 s refresh interval; "
          f"split_tick alone {t['split_tick_full_us']:.1f} µs")
    print("   each parser alone (µs): " + ", ".join(f"{k} {u:.1f}" for k, u in t["parser_us"].items()))
    print()
    print(f"2. vLLM log: {v['logs']} real logs, {v['lines']} lines (longest {v['longest_log_lines']})")
    print()
    print(f"   {'variant':58} {'µs/line':>9} {'lines/s':>10} {'ratio':>8}")
    print(f"   {'incremental VllmLogTracker, report read after every line':58}"
          f" {v['incremental_us_per_line']:9.2f} {v['incremental_lines_per_s']:10,d} {'1.0×':>8}")
    print(f"   {'incremental, whole log fed then one report':58}"
          f" {v['bulk_us_per_line']:9.2f} {v['bulk_lines_per_s']:10,d}"
          f" {v['bulk_us_per_line'] / v['incremental_us_per_line']:7.2f}×")
    print(f"   {f'naive: re-parse the capture window (≤{WINDOW} lines) per new line':58}"
          f" {v['naive_us_per_new_line']:9.2f} {v['naive_lines_per_s']:10,d} {v['naive_over_incremental']:7.1f}×")
    print()
    print(f"   one stateless refresh (re-parse a {v['window_lines']}-line window): {v['window_reparse_us']:.0f} µs"
          f" = {v['window_reparse_over_one_incremental_line']:.0f}× the incremental cost of one new line")
    print("   (the naive ratio grows with the window: these real logs are short, so it is averaged over")
    print(f"   windows of 1..{v['longest_log_lines']} lines; with a full {WINDOW}-line window every refresh"
          " pays the line above)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the tables")
    ap.add_argument("--min-time", type=float, default=0.2, help="seconds per timing loop (default 0.2)")
    args = ap.parse_args(argv)
    report = {
        "benchmark": "parse_cost",
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": machine_line(),
        "probe_tick": probe_ticks(args.min_time),
        "vllm_log": vllm_cost(args.min_time),
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_report(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
