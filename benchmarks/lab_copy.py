"""Copy throughput over the lab's fast link, and time to first data for the lab's two hosts.

Builds the two-host lab of ``tests/lab/hosts.py`` (network namespaces with their own sshd and
Docker engine, a veth fast link ``enp1s0f1np1`` at MTU 9000; no image needed here) and measures,
side by side in one run:

1. **Copy over the fast link**, host A → host B, of one model laid out as the Hugging Face cache
   lays it out (``blobs/`` + ``snapshots/REV/`` links), ``--size-mb`` of random data in
   ``--files`` files. Run on host A, each round removing B's copy first, rounds interleaved:

   (w) the wizard's command, exactly as :func:`sparkconsole.remote.rsync_dir` builds it
       (``rsync -a --partial -L --exclude blobs/ --info=progress2 -e 'ssh -o BatchMode=yes'``);
   (b) a bare ``rsync -aL`` of the same snapshot files over the same ssh;
   (s) the ssh pipe alone (``tar -ch`` of the same files piped through ``ssh`` into ``tar -x``):
       what any ssh-based copy can reach on these two cores.

   Every copy is checked (B holds plain files of the right sizes) before it counts.

2. **Time to first data**: from nothing connected to the first complete sample of each host,
   through the console's own path (``ClusterPoller`` over ``SshTransport``: asyncssh connect,
   the long-lived probe, its first tick with every section, parse, assemble), both hosts at once;
   beside it the same first tick through a fresh OpenSSH ``ssh`` per host, one after the other
   (the peers' way) and at once.

Run from the repository root as root (it creates namespaces)::

    .venv/bin/python benchmarks/lab_copy.py [--size-mb 512] [--files 4] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sparkconsole.config import load_config  # noqa: E402
from sparkconsole.probe.poller import ClusterPoller  # noqa: E402
from sparkconsole.probe.script import SECTIONS, probe_command  # noqa: E402
from sparkconsole.remote import rsync_dir  # noqa: E402
from tests.lab.hosts import LOGIN_HOME, Lab, leftovers  # noqa: E402

REPO = f"{LOGIN_HOME}/.cache/huggingface/hub/models--bench--copy"  # the login user's cache, as on DGX OS
REV = "0123456789abcdef0123456789abcdef01234567"


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def make_model(lab: Lab, size_mb: int, files: int) -> int:
    """The HF cache layout on host A: random blobs, snapshot links to them; returns the bytes."""
    per = size_mb // files
    script = (f"set -e; mkdir -p {REPO}/blobs {REPO}/snapshots/{REV} {REPO}/refs; echo {REV} > {REPO}/refs/main; "
              f"for i in $(seq 1 {files}); do head -c {per}M /dev/urandom > {REPO}/blobs/blob$i; "
              f"ln -sf ../../blobs/blob$i {REPO}/snapshots/{REV}/model-0000$i-of-0000{files}.safetensors; done")
    lab.a.run_as_user("sh", "-c", script, timeout=600)
    return per * files * 1024 * 1024


def copy_variants(lab: Lab) -> dict[str, tuple[str, str]]:
    b = f"{lab.user}@{lab.b.fast_ip}"  # node to node as the login user: the lab refuses root, as DGX OS does
    dest = REPO
    wizard = rsync_dir(REPO, b, dest).shell()
    bare = f"rsync -aL {REPO}/snapshots/ {b}:{dest}/snapshots/"
    tar = (f"tar -ch -C {REPO}/snapshots . | ssh -o BatchMode=yes {b} "
           + shlex.quote(f"mkdir -p {dest}/snapshots && tar -x -C {dest}/snapshots"))
    return {"w": ("the wizard's rsync (rsync_dir)", wizard), "b": ("bare rsync -aL", bare),
            "s": ("ssh pipe: tar -ch, ssh, tar -x", tar)}


def check_copy(lab: Lab, want_bytes: int) -> None:
    out = lab.b.run("find", f"{REPO}/snapshots", "-type", "f", "-printf", "%s\\n").stdout.split()
    links = lab.b.run("find", f"{REPO}/snapshots", "-type", "l").stdout.split()
    got = sum(int(x) for x in out)
    if got != want_bytes or links:
        raise RuntimeError(f"the copy on {lab.b.name} is wrong: {got} bytes of {want_bytes}, {len(links)} links")


def bench_copy(lab: Lab, size_mb: int, files: int, rounds: int) -> dict[str, dict[str, float | str]]:
    total = make_model(lab, size_mb, files)
    variants = copy_variants(lab)
    times: dict[str, list[float]] = {k: [] for k in variants}
    for r in range(rounds):
        order = list(variants)[r % len(variants):] + list(variants)[:r % len(variants)]
        for key in order:
            lab.b.run_as_user("sh", "-c", f"rm -rf {REPO} && mkdir -p {REPO} && sync")  # the wizard makes it first
            lab.a.sh("sync")
            t0 = time.perf_counter()
            lab.a.run_as_user("sh", "-c", variants[key][1], timeout=900)
            times[key].append(time.perf_counter() - t0)
            check_copy(lab, total)
    base = _median(times["b"])
    return {k: {"what": variants[k][0], "command": variants[k][1], "median_s": _median(times[k]),
                "best_s": min(times[k]), "mb_per_s": total / 1e6 / _median(times[k]),
                "vs_bare": _median(times[k]) / base} for k in variants}


async def _first_data_poller(config) -> dict[str, float]:
    poller = ClusterPoller(config)
    t0 = time.perf_counter()
    got: dict[str, float] = {}

    async def one(name: str) -> None:
        state = await poller.pollers[name].poll_once()
        if state.sample is None:
            raise RuntimeError(f"{name}: no sample: {state.status} {state.reason}")
        got[name] = time.perf_counter() - t0

    try:
        await asyncio.gather(*(one(n) for n in poller.pollers))
    finally:
        await poller.close()
    return got


def _ssh_argv(lab: Lab, node) -> list[str]:
    return ["ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes", "-o",
            f"UserKnownHostsFile={lab.known_hosts}", "-o", "IdentitiesOnly=yes", "-i", str(lab.key),
            f"{lab.user}@{node.host}", probe_command()]


def _first_data_ssh(lab: Lab, config, parallel: bool) -> dict[str, float]:
    line = (" ".join(s.name for s in SECTIONS) + "\n").encode()
    t0 = time.perf_counter()
    got: dict[str, float] = {}
    procs = {}
    for n in config.nodes:
        procs[n.name] = subprocess.Popen(_ssh_argv(lab, n), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL)
        if not parallel:
            out, _ = procs[n.name].communicate(line, timeout=60)
            if b"::sparkprobe:: end 1" not in out:
                raise RuntimeError(f"{n.name}: no complete tick over ssh")
            got[n.name] = time.perf_counter() - t0
    if parallel:
        for n in config.nodes:
            procs[n.name].stdin.write(line)
            procs[n.name].stdin.close()
        for n in config.nodes:
            out = procs[n.name].stdout.read()
            procs[n.name].wait(timeout=60)
            if b"::sparkprobe:: end 1" not in out:
                raise RuntimeError(f"{n.name}: no complete tick over ssh")
            got[n.name] = time.perf_counter() - t0
    return got


def bench_first_data(lab: Lab, rounds: int) -> dict[str, dict[str, float | str]]:
    config = load_config(lab.config_path)
    runs: dict[str, list[dict[str, float]]] = {"poller": [], "ssh-seq": [], "ssh-par": []}
    for r in range(rounds):
        order = ["poller", "ssh-seq", "ssh-par"]
        order = order[r % 3:] + order[:r % 3]
        for key in order:
            if key == "poller":
                runs[key].append(asyncio.run(_first_data_poller(config)))
            else:
                runs[key].append(_first_data_ssh(lab, config, parallel=key == "ssh-par"))
    what = {"poller": "sparkconsole ClusterPoller (asyncssh, both at once)",
            "ssh-seq": "fresh OpenSSH ssh per host, one after the other",
            "ssh-par": "fresh OpenSSH ssh per host, both at once"}
    out: dict[str, dict[str, float | str]] = {}
    for key, rs in runs.items():
        both = [max(x.values()) for x in rs]
        out[key] = {"what": what[key], "both_median_s": _median(both),
                    **{f"{n}_median_s": _median([x[n] for x in rs]) for n in rs[0]}}
    base = out["poller"]["both_median_s"]
    for v in out.values():
        v["vs_poller"] = float(v["both_median_s"]) / float(base)  # type: ignore[arg-type]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mb", type=int, default=512)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ttfd-rounds", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("lab_copy.py: needs root (it creates network namespaces)", file=sys.stderr)
        return 2
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sclab-bench-") as tmp:
        t0 = time.perf_counter()
        lab = Lab.create(Path(tmp) / "lab", with_image=False)
        up_s = time.perf_counter() - t0
        try:
            copy = bench_copy(lab, args.size_mb, args.files, args.rounds)
            ttfd = bench_first_data(lab, args.ttfd_rounds)
        finally:
            problems = lab.down() + leftovers(lab)
    result = {"machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs",
              "lab_up_s": up_s, "size_mb": args.size_mb, "files": args.files, "rounds": args.rounds,
              "copy": copy, "first_data": ttfd, "cleanup_problems": problems}
    if args.json:
        print(json.dumps(result, indent=1))
        return 0 if not problems else 1
    print(f"lab up in {up_s:.1f} s on {result['machine']}; fast link enp1s0f1np1, MTU 9000 (veth)")
    print(f"\ncopy A -> B over the fast link: {args.size_mb} MB random data in {args.files} files "
          f"(HF cache layout), median of {args.rounds} interleaved rounds")
    print("| | variant | median s | best s | MB/s | time vs bare rsync |\n|---|---|---:|---:|---:|---:|")
    for k, v in copy.items():
        print(f"| ({k}) | {v['what']} | {v['median_s']:.2f} | {v['best_s']:.2f} | {v['mb_per_s']:.0f} | "
              f"{v['vs_bare']:.2f}x |")
    print(f"\ntime to first data, 2 lab hosts, from nothing connected (median of {args.ttfd_rounds} rounds; "
          "first tick = every probe section)")
    print("| variant | both hosts s | lab-a s | lab-b s | vs the console |\n|---|---:|---:|---:|---:|")
    for v in ttfd.values():
        print(f"| {v['what']} | {v['both_median_s']:.2f} | {v['lab-a_median_s']:.2f} | {v['lab-b_median_s']:.2f} | "
              f"{v['vs_poller']:.2f}x |")
    print(f"\n(w) runs: {copy['w']['command']}")
    if problems:
        print(f"cleanup left: {problems}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
