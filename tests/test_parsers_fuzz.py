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
