"""Node text is data (issue 23, items 1 and 2, started): what an engine prints reaches the screen as
plain text, never Textual markup (a traceback's "in [/root/.cache/…]" raised MarkupError and ended
the app; a "[rank0]:" prefix vanished) and never terminal control (an OSC 52 sets the operator's
clipboard, CSI 2J clears the screen)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from rich.text import Text
from textual.app import App, ComposeResult
from textual.widgets import Static

from sparkconsole.logs.follow import display_text
from sparkconsole.logs.vllm import VllmLogReport
from sparkconsole.ui.screens.logs import VllmPanel

HOSTILE = ("(Worker pid=7) [rank0]: RuntimeError: x in [/root/.cache/vllm/torch_compile_cache/ab12]\x1b]52;c;"
           "ZWNobyBoaQ==\x07\x1b[2J\x1b]0;owned\x1b\\\x9b31m[bold red]not markup[/]")


def test_escape_sequences_leave_nothing_a_terminal_would_act_on():
    shown = display_text(HOSTILE)
    assert not any(ord(ch) < 0x20 or 0x7F <= ord(ch) <= 0x9F for ch in shown)
    assert "]52;" not in shown and "owned" not in shown  # the OSC strings go whole, not just their ESC
    assert "[rank0]: RuntimeError: x in [/root/.cache/vllm/torch_compile_cache/ab12]" in shown
    assert shown.endswith("[bold red]not markup[/]")


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x2FF)))
def test_no_escape_byte_survives_any_text(text):
    shown = display_text(text)
    assert not any(ord(ch) < 0x20 and ch != "\t" for ch in shown)
    assert not any(0x7F <= ord(ch) <= 0x9F for ch in shown)


class _PanelApp(App):
    def compose(self) -> ComposeResult:
        yield VllmPanel()


async def test_the_vllm_panel_shows_a_markup_looking_failure_as_it_was_printed():
    app = _PanelApp()
    async with app.run_test() as pilot:
        panel = app.query_one(VllmPanel)
        panel.show(VllmLogReport(state="failed", model="Q/[b]M[/b]", failure_kind="other", failure_line=HOSTILE))
        await pilot.pause()
        failure = app.query_one("#vllm-failure", Static).render()
        plain = failure.plain if isinstance(failure, Text) else str(failure)
        assert "[rank0]: RuntimeError: x in [/root/.cache/vllm/torch_compile_cache/ab12]" in plain
        assert "[bold red]not markup[/]" in plain and "\x1b" not in plain and "\x9b" not in plain
        head = app.query_one("#vllm-head", Static).render()
        assert "Q/[b]M[/b]" in (head.plain if isinstance(head, Text) else str(head))
