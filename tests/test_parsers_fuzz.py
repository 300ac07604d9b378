"""No parser raises on any text: arbitrary text, and text built from fragments of the real fixtures.

The parsers' safety net is switched off (STRICT) so a bug surfaces here as an exception.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkconsole.probe import parsers as p
from sparkconsole.probe.assemble import assemble_sample
from sparkconsole.probe.samples import CsvTable
from sparkconsole.probe.script import SECTION_BY_NAME, SectionOutput
from tests.conftest import FIXTURES, strip_fixture_header

FIXTURE_FILES = sorted(
    f for d in ("real/gb10", "real/h200", "h200x2", "ray", "docker") for f in (FIXTURES / d).iterdir()
    if f.suffix in (".txt", ".xml")
)
FRAGMENT_LINES = sorted({ln for f in FIXTURE_FILES
                         for ln in strip_fixture_header(f.read_text(encoding="utf-8")).splitlines()})

TEXT_PARSERS = [
    p.parse_meminfo, p.parse_nvidia_smi_table, p.parse_nvidia_smi_csv, p.parse_ibdev2netdev,
    p.parse_ib_ports, p.parse_ip_addr_json, p.parse_ip_addr_text, p.parse_ip_addr, p.parse_docker_ps,
    p.parse_docker_stats, p.parse_ray_status, p.parse_df, p.parse_uptime, p.parse_hostname, p.parse_uname,
    p.parse_nproc, p.parse_docker_version, p.tool_error, p.first_line,
]

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Lines from the fixtures, mutated a little: cut, joined, with separators and odd values spliced in.
_splice = st.sampled_from(["|", ",", " / ", "[N/A]", "N/A", "Not Supported", "MiB", "%", "==>", "(Up)",
                           ":", "{", "}", "[", "]", '"', "\t", "  ", "\x00", "é", "**", "nan", "1e999",
                           "-1", "99999999999999999999"])


@st.composite
def fragment_text(draw: st.DrawFn) -> str:
    lines = draw(st.lists(st.sampled_from(FRAGMENT_LINES), min_size=0, max_size=25))
    out = []
    for line in lines:
        action = draw(st.integers(0, 4))
        if action == 1 and line:
            cut = draw(st.integers(0, len(line)))
            line = line[:cut]
        elif action == 2:
            at = draw(st.integers(0, len(line)))
            line = line[:at] + draw(_splice) + line[at:]
        elif action == 3:
            line = line.replace(draw(st.sampled_from([" ", ",", "|", ":"])), draw(_splice))
        out.append(line)
    return "\n".join(out)


@pytest.fixture(autouse=True)
def strict_parsers(monkeypatch):
    monkeypatch.setattr(p, "STRICT", True)


def _all(text: str) -> None:
    for fn in TEXT_PARSERS:
        fn(text)
    p.parse_nvidia_smi_csv(text, fields=["index", "name", "memory.used [MiB]"])
    t = p.parse_nvidia_smi_csv(text)
    gpus = p.gpus_from_query(t)
    p.processes_from_query(t, gpus)


@SETTINGS
@given(st.text(max_size=2000))
def test_arbitrary_text(text):
    _all(text)


@SETTINGS
@given(fragment_text())
def test_fixture_fragments(text):
    _all(text)


@SETTINGS
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                    lambda kids: st.lists(kids, max_size=5) | st.dictionaries(
                        st.sampled_from(["ifname", "mtu", "flags", "addr_info", "family", "local", "prefixlen",
                                         "operstate", "Names", "State", "Status", "ID", "Name", "CPUPerc",
                                         "MemUsage", "address", "ifindex"]) | st.text(max_size=5),
                        kids, max_size=6),
                    max_leaves=30))
def test_json_shaped_input(value):
    """ip -j and docker --format json with any types where strings or numbers are expected."""
    text = json.dumps(value)
    p.parse_ip_addr_json(text)
    p.parse_ip_addr(text)
    p.parse_docker_ps(text)
    p.parse_docker_stats(text)
    if isinstance(value, dict):
        one_line = "\n".join([text, json.dumps(value)])
        p.parse_docker_ps(one_line)
        p.parse_docker_stats(one_line)


@SETTINGS
@given(st.lists(st.dictionaries(st.text(max_size=15) | st.sampled_from(
    ["index", "name", "memory.total", "pid", "used_gpu_memory", "gpu_bus_id", "process_name"]),
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10), max_size=6), max_size=4))
def test_query_mappers_any_values(rows):
    t = CsvTable(rows=tuple(rows))
    gpus = p.gpus_from_query(t)
    p.processes_from_query(t, gpus)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(list(SECTION_BY_NAME)), st.tuples(fragment_text(), st.sampled_from(
    [0, 1, 2, 124, 127, None])), max_size=len(SECTION_BY_NAME)))
def test_assemble_any_sections(secs):
    sections = {n: SectionOutput(n, t, rc) for n, (t, rc) in secs.items()}
    s = assemble_sample("n", 1.0, sections)
    s2 = assemble_sample("n", 2.0, sections, previous=s)
    json.dumps(s2.to_dict())


def test_nothing_in_deep_json():
    deep = "[" * 100_000 + "]" * 100_000  # json's recursion limit
    assert p.parse_ip_addr_json(deep) == ()
    assert p.parse_docker_ps("{" * 50_000) == ()


# ---- 10,000 mutated real outputs through every parser of the console and the wizard (issue 14) ------

_FUZZ_N = 10_000
_FUZZ_SEED = 14
_JUNK = ["\x00", "\x1b[31m", "\x1b[0m", "\r", "\t", "\ufffd", "é", "💥", "%", "|", ",", ":", "=", "/", "{", "}",
         "[", "]", '"', "'", "(Up)", "(Down)", "N/A", "[N/A]", "Not Supported", "nan", "inf", "-1", "1e999",
         "99999999999999999999999", "0x", "MiB", "GiB", "GB/s", "it/s", "s/it", "::sparkdeploy::", "rc", "section",
         "Traceback (most recent call last):", "ERROR", "WARNING", "INFO", "(RayWorkerWrapper pid=1)", "\\", "$(x)"]


def _fuzz_bases() -> list[str]:
    """Real outputs (every text fixture) and what the demo cluster's tools print for the wizard's
    own commands (recon, rsync --info=progress2, hf download, the Hub's tree, find, sha256sum)."""
    import asyncio

    from sparkconsole.deploy.recon import recon_command
    from sparkconsole.sim import Shell, SimClock, build

    bases = [strip_fixture_header(f.read_text(encoding="utf-8", errors="replace"))
             for f in sorted(FIXTURES.rglob("*"))
             if f.is_file() and f.suffix in (".txt", ".log", ".xml", ".json", ".prom")]

    async def sim_outputs() -> list[str]:
        clock = SimClock.frozen()
        sh = Shell(build("story", clock=clock), "spark-1a32")
        snap = "/root/.cache/huggingface/hub/models--Qwen--Qwen3-Embedding-0.6B"
        cmds = [recon_command("Qwen/Qwen3.5-122B-A10B-FP8").shell(),
                f"rsync -a --partial -L --exclude blobs/ --info=progress2 {snap}/ /root/copy/",
                f"find -L {snap}/snapshots -type f -printf '%s %P\\n'", f"sha256sum {snap}/snapshots/*/*",
                "hf download Qwen/Qwen3-Embedding-0.6B", "docker ps -a --format '{{json .}}'", "ray status"]
        out = []
        for c in cmds:
            task = asyncio.ensure_future(sh.capture(c))
            while not task.done():
                clock.advance(5.0)
                await asyncio.sleep(0)
            o, e, _rc = task.result()
            out.append(o + e)
        return out

    return bases + [t for t in asyncio.run(sim_outputs()) if t.strip()]


def _mutate(rng, bases: list[str]) -> str:
    lines = rng.choice(bases).splitlines()
    if lines:
        a = rng.randrange(len(lines))
        lines = lines[a:a + rng.randint(1, 60)]
    if rng.random() < 0.3:  # lines of another output spliced in
        other = rng.choice(bases).splitlines()
        if other:
            at = rng.randint(0, len(lines))
            lines[at:at] = other[:rng.randint(1, 8)]
    for _ in range(rng.randint(0, 8)):
        if not lines:
            lines.append("")
        i = rng.randrange(len(lines))
        ln = lines[i]
        op = rng.randrange(8)
        if op == 0:
            lines[i] = ln[:rng.randint(0, len(ln))]  # cut
        elif op == 1:
            at = rng.randint(0, len(ln))
            lines[i] = ln[:at] + rng.choice(_JUNK) + ln[at:]
        elif op == 2:
            lines.insert(i, ln)  # repeated
        elif op == 3:
            lines[i] = "".join(rng.choice("0123456789") if c.isdigit() and rng.random() < 0.5 else c for c in ln)
        elif op == 4:
            lines[i] = ln.replace(" ", rng.choice(["", "  ", "\t", ",", "|"]))
        elif op == 5:
            del lines[i]
        elif op == 6:
            lines[i] = ln.encode()[: rng.randint(0, len(ln.encode()))].decode("utf-8", errors="replace")
        else:
            lines[i] = "".join(chr(rng.randrange(0, 0x3000)) for _ in range(rng.randint(1, 30)))
    sep = rng.choice(["\n", "\n", "\n", "\r\n", "\r"])
    return sep.join(lines)


class _Progress:
    """Stands in for the runner: the progress lines the Weights step reads from a job's log."""

    def __init__(self) -> None:
        self.events: list[tuple] = []

    def progress(self, *args) -> None:
        self.events.append(args)


def _every_parser():
    from sparkconsole.deploy import engines, netenv, recon
    from sparkconsole.deploy import weights as W
    from sparkconsole.deploy.steps import Weights
    from sparkconsole.logs import follow
    from sparkconsole.logs.vllm import VllmLogTracker, parse_vllm_log
    from sparkconsole.planner.overheads import parse_version
    from sparkconsole.services import parse_systemctl_show
    from sparkconsole.serving.metrics import parse_metrics, window_quantile

    runner = _Progress()
    step = Weights(type("F", (), {"runner": runner})())  # a flow with only the runner's progress

    def tracker(text: str) -> None:
        t = VllmLogTracker()
        for ln in text.splitlines():
            t.feed(ln, source="w")
        assert t.report is not None

    def recon_facts(text: str) -> None:
        f = recon.facts_from_output("n", text, now=1.0)
        f2 = recon.NodeFacts.from_json(json.loads(json.dumps(f.to_json())))
        netenv.check_links([f, f2])
        ip = f.fast_ip() or "192.168.200.12"
        netenv.node_env(f, ip) if f.fast_ip() else None

    out = [(fn.__name__, fn) for fn in TEXT_PARSERS]
    out += [
        ("parse_nvidia_smi_csv+query", lambda t: p.processes_from_query(p.parse_nvidia_smi_csv(t),
                                                                          p.gpus_from_query(p.parse_nvidia_smi_csv(t)))),
        ("parse_vllm_log", parse_vllm_log), ("VllmLogTracker", tracker),
        ("recon.facts_from_output+netenv", recon_facts), ("recon.parse_gids", recon.parse_gids),
        ("recon.parse_images", recon.parse_images), ("recon.parse_ss", recon.parse_ss),
        ("recon.parse_cgroups", recon.parse_cgroups),
        ("engines.parse_engine_output", lambda t: engines.parse_engine_output("img", t, 0)),
        ("weights.parse_tree", W.parse_tree), ("weights.parse_sizes", W.parse_sizes),
        ("weights.parse_sha256sum", W.parse_sha256sum),
        ("Weights._copy_progress (rsync progress2)", lambda t: step._copy_progress("n", t)),
        ("Weights._download_progress (hf tqdm)", lambda t: step._download_progress("n", t)),
        ("services.parse_systemctl_show", lambda t: parse_systemctl_show(t, ["ollama", "x"])),
        ("follow.split_timestamp", lambda t: [follow.timestamp_key(follow.split_timestamp(ln)[0] or "")
                                               for ln in t.splitlines()]),
        ("planner.parse_version", parse_version),
        ("serving.parse_metrics+window_quantile",
         lambda t: [window_quantile(e.ttft, e.e2e, 0.9) for e in parse_metrics(t)]),
    ]
    return out


def test_ten_thousand_mutated_outputs_through_every_parser_crash_none():
    import random
    import time

    rng = random.Random(_FUZZ_SEED)
    bases = _fuzz_bases()
    parsers = _every_parser()
    crashes: list[str] = []
    start = time.monotonic()
    for k in range(_FUZZ_N):
        text = _mutate(rng, bases)
        for name, fn in parsers:
            try:
                fn(text)
            except Exception as exc:  # a crash: keep the first few to show
                if len(crashes) < 5:
                    crashes.append(f"#{k} {name}: {exc.__class__.__name__}: {exc} on {text[:200]!r}")
                else:
                    crashes.append(name)
    took = time.monotonic() - start
    print(f"\nfuzz: {_FUZZ_N} mutated outputs ({len(bases)} real bases) x {len(parsers)} parsers = "
          f"{_FUZZ_N * len(parsers)} calls in {took:.1f} s, {len(crashes)} crashes")
    assert not crashes, crashes[:5]
