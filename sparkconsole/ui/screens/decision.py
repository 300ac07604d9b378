"""A decision of the deployment, as a modal: what was measured, the recommendation first, why.

``DecisionScreen(decision)`` is a ``ModalScreen[str | None]``: it dismisses with the chosen
option's value, or ``None`` when the operator pressed Esc (the wizard then stops the run at this
decision; Enter in the wizard asks it again). The recommended option is listed first and marked,
whatever order the flow built them in, because "press Enter" should always mean "do what the
wizard recommends"; experimental options are marked as such. Arrows (or ``j``/``k``) and the
number keys move the highlight, Enter answers: a number never answers on its own, so a stray key
cannot start something. Where the decision allows a value outside the list (an image the
operator names), ``e`` opens a field; what is typed there is checked by the decision itself.

A decision quotes the nodes (what was measured, the containers an option would stop, the images
found): everything shown goes through :func:`~sparkconsole.ui.render.node_str` into plain Text;
the option values the screen answers with stay exactly as the flow gave them.
"""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.padding import Padding
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Input, Static

from sparkconsole.deploy.decisions import Decision, Option
from sparkconsole.errors import UserError
from sparkconsole.ui.keymap import DECISION_BINDINGS
from sparkconsole.ui.render import node_str


def ordered_options(decision: Decision) -> list[Option]:
    """The recommended option first, the others in the flow's order."""
    rec = [o for o in decision.options if o.value == decision.recommended]
    rest = [o for o in decision.options if o.value != decision.recommended]
    if not rec and decision.recommended:  # a free-text recommendation not among the options
        rec = [Option(decision.recommended, decision.recommended, decision.why)]
    return rec + rest


def indented(text: Text, indent: int = 2) -> Padding:
    """``text`` with every wrapped line starting at ``indent`` (a measured line stays one block)."""
    return Padding(text, (0, 0, 0, indent))


def _same(value: str, label: str) -> bool:
    """Whether the label already says the value (``a,b`` in ``stop a, b``)."""
    squeeze = "".join(value.split()).lower()
    return squeeze in "".join(label.split()).lower()


def free_text_placeholder(decision: Decision) -> str:
    """What the free-text field asks for, with the recommendation as the example of its form."""
    shown = node_str(decision.recommended)
    example = shown if len(shown) <= 50 else shown[:49] + "…"
    return f"another value (like {example}), Enter to answer" if example else "another value, Enter to answer"


class DecisionScreen(ModalScreen[str | None]):
    """Asks one :class:`~sparkconsole.deploy.decisions.Decision`."""

    BINDINGS = DECISION_BINDINGS
    AUTO_FOCUS = None  # the options are keys on the screen; the free-text field is opened with e
    HELP = ("The deployment needs an answer. The recommended option is first; ↑/↓ or a number highlights, "
            "Enter answers, Esc stops the run here (Enter in the wizard asks again).")

    def __init__(self, decision: Decision, *, name: str | None = None, id: str | None = None) -> None:
        super().__init__(name=name, id=id)
        self.decision = decision
        self.options = ordered_options(decision)
        self.index = 0

    def compose(self) -> ComposeResult:
        d = self.decision
        with Vertical(id="decision-box"):
            title = Text(node_str(d.title), style="bold")
            title.append(f"   {node_str(d.id)}", style="dim")
            yield Static(title, id="decision-title")
            with VerticalScroll(id="decision-scroll"):
                yield Static(self._measured(), id="decision-measured")
                yield Static(id="decision-options")
                yield Static(id="decision-why")
            if d.free_text:
                yield Input(placeholder=free_text_placeholder(d), id="decision-free")
            yield Static(id="decision-error")
            yield Static(Text(self._hint(), style="dim"), id="decision-hint")

    def on_mount(self) -> None:
        self.query_one("#decision-box").border_title = "Decision"
        self.query_one("#decision-error").display = False
        self._draw()

    def _hint(self) -> str:
        parts = ["↑↓ or 1–9 highlight", "⏎ answer"]
        if self.decision.free_text:
            parts.append("e type another value")
        parts.append("esc stop the run here")
        return " · ".join(parts)

    def _measured(self) -> Group:
        """Each measured line as a block indented as a whole: a long one wraps under itself."""
        parts: list[RenderableType] = [Text("Measured", style="bold")]
        lines = [m for m in self.decision.measured if m]
        if not lines:
            parts.append(indented(Text("(nothing to measure for this one)", style="dim")))
        parts += [indented(Text(node_str(line, lines=True))) for line in lines]
        parts.append(Text(""))
        return Group(*parts)

    def _option_row(self, i: int, opt: Option) -> tuple[Text, Text]:
        """The option's number column and its text (label, value where the label does not say it, marks)."""
        d = self.decision
        chosen = i == self.index
        mark = Text("▸ " if chosen else "  ", style="bold cyan")
        mark.append(f"{i + 1}" if i < 9 else " ", style="dim")
        row = Text(node_str(opt.label), style="bold" if chosen else "")
        if opt.value != opt.label and not _same(opt.value, opt.label):
            row.append(f"  [{node_str(opt.value)}]", style="dim")
        if opt.value == d.recommended:
            row.append("  ★ recommended", style="bold green")
        if opt.experimental:
            row.append("  ⚠ experimental", style="bold yellow")
        if chosen:
            mark.stylize("reverse")
            row.stylize("reverse")
        return mark, row

    def _draw(self) -> None:
        d = self.decision
        # a grid, so that an option too long for one line wraps under its own text, not under its number
        grid = Table.grid(padding=(0, 1), expand=True)
        grid.add_column(width=3, no_wrap=True)
        grid.add_column(ratio=1, overflow="fold")
        for i, opt in enumerate(self.options):
            grid.add_row(*self._option_row(i, opt))
        self.query_one("#decision-options", Static).update(Group(Text("Options", style="bold"), grid))
        opt = self.options[self.index] if self.options else None
        why: list[RenderableType] = [Text("Why", style="bold")]
        if opt is not None and opt.why:
            why.append(indented(Text(node_str(opt.why, lines=True))))
        if opt is not None and opt.value == d.recommended and d.why:
            why.append(indented(Text(f"Recommended: {node_str(d.why, lines=True)}", style="green")))
        elif d.why:
            why.append(indented(Text(f"The wizard recommends {node_str(d.recommended)}: {node_str(d.why, lines=True)}",
                                     style="dim")))
        self.query_one("#decision-why", Static).update(Group(*why))

    # ---- keys ----------------------------------------------------------------------------------

    def _free(self) -> Input | None:
        found = self.query("#decision-free")
        return found.first(Input) if found else None

    def action_move(self, delta: int) -> None:
        if self.options:
            self.index = (self.index + delta) % len(self.options)
            self._draw()

    def action_pick(self, number: int) -> None:
        if 1 <= number <= len(self.options):
            self.index = number - 1
            self._draw()

    def action_choose(self) -> None:
        free = self._free()
        if free is not None and free.has_focus:
            return  # Input.Submitted answers with the typed value
        if self.options:
            self.dismiss(self.options[self.index].value)

    def action_edit(self) -> None:
        free = self._free()
        if free is None:
            self.notify("this decision takes one of the options listed", timeout=2)
            return
        free.focus()

    def action_cancel(self) -> None:
        free = self._free()
        if free is not None and free.has_focus:
            self.set_focus(None)  # Esc in the field leaves the field, not the decision
            return
        self.dismiss(None)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        value = event.value.strip()
        if not value:
            return
        try:
            self.decision.check(value)
        except UserError as exc:
            error = self.query_one("#decision-error", Static)
            error.update(Text(node_str(exc.message, lines=True), style="bold red"))
            error.display = True
            return
        self.dismiss(value)
