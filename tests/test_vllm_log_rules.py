"""The vLLM line-rule table is consistent with the report it fills.

``LINE_RULES`` names report fields as strings and pattern groups by name; these tests make a typo
or a forgotten field fail here, by name, rather than as a wrong report somewhere else.
"""

from __future__ import annotations

from dataclasses import fields

from sparkconsole.logs import vllm
from sparkconsole.logs.vllm import LINE_RULES, VllmLogReport, VllmLogTracker

REPORT_FIELDS = {f.name for f in fields(VllmLogReport)}

# What the tracker works out itself when it builds a report (state, failure, timeline, counters,
# the merged view) rather than reads from one line.
BUILT = {
    "state",
    "failure_kind",
    "phase",
    "compiling",
    "unsupported_architectures",
    "remote_ips",
    "failure_line",
    "failure_line_no",
    "failure_node_ip",
    "failure_proof",
    "advice",
    "phase_events",
    "restarts",
    "lines",
    "node",
    "node_states",
}
# Read by the failure classification (an unsupported model's message), not by a rule.
FROM_FAILURES = {"unsupported_model_type"}

RULE_FIELDS = {name for rule in LINE_RULES for name in rule.fields}
PHASES = {value for name, value in vars(vllm).items() if name.startswith("PHASE_")}


def test_every_field_a_rule_fills_is_a_report_value_field():
    assert RULE_FIELDS <= REPORT_FIELDS, RULE_FIELDS - REPORT_FIELDS
    assert not RULE_FIELDS & BUILT


def test_every_report_field_is_filled_by_a_rule_or_worked_out():
    assert RULE_FIELDS | BUILT | FROM_FAILURES == REPORT_FIELDS, REPORT_FIELDS - (
        RULE_FIELDS | BUILT | FROM_FAILURES
    )


def test_every_capture_reads_a_group_its_pattern_has():
    for rule in LINE_RULES:
        for capture in rule.sets:
            names = (capture.group,) if isinstance(capture.group, str) else capture.group
            for name in names:
                assert name in rule.pattern.groupindex, (rule.pattern.pattern, name)


def test_phases_and_handlers_are_the_trackers_own():
    for rule in LINE_RULES:
        assert rule.phase is None or rule.phase in PHASES, rule.phase
        if rule.handler is not None:
            assert getattr(VllmLogTracker, rule.handler.__name__) is rule.handler
        else:
            assert not rule.writes, "only a handler writes fields the captures do not name"


def test_either_or_groups_are_adjacent_rows():
    groups = [rule.group for rule in LINE_RULES if rule.group is not None]
    runs = [g for i, g in enumerate(groups) if i == 0 or groups[i - 1] != g]
    assert len(runs) == len(set(runs)), groups
