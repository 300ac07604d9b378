"""docs/keys.md, written from the bindings themselves.

The keys a user reads about are the keys the console binds: this module renders the keymap
(``ui/keymap.py``) and the few screens that keep their bindings beside them (the log, the
confirmation, the planner, the calibration) into one Markdown page, so the page cannot drift from
the code. ``scripts/gen-keys-doc`` writes it; ``tests/test_docs.py`` checks that the committed page is
what this renders.

Run as ``python -m sparkconsole.ui.keys_doc [FILE]``: writes FILE (default: print to stdout).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from textual.binding import Binding

from sparkconsole.ui import keymap

_KEY_NAMES = {
    "question_mark": "?", "slash": "/", "plus": "+", "minus": "-", "equals_sign": "=",
    "escape": "Esc", "enter": "Enter", "tab": "Tab", "shift+tab": "Shift+Tab", "up": "↑", "down": "↓",
    "left": "←", "right": "→", "pageup": "PgUp", "pagedown": "PgDn", "home": "Home", "end": "End",
    "f1": "F1", "ctrl+p": "Ctrl+P", "ctrl+q": "Ctrl+Q", "ctrl+r": "Ctrl+R",
}


def _sections() -> list[tuple[str, str, Sequence[Binding]]]:
    """(heading, where these keys work, bindings), in the order a user meets the screens."""
    from sparkconsole.ui.screens.calibration import CALIBRATION_BINDINGS
    from sparkconsole.ui.screens.confirm import ConfirmScreen
    from sparkconsole.ui.screens.logs import LogScreen
    from sparkconsole.ui.screens.planner import PLANNER_BINDINGS
    from sparkconsole.ui.screens.quit import QuitScreen
    from sparkconsole.ui.screens.wizard import StepConfirmScreen

    return [
        ("Everywhere", "on every screen, unless the screen binds the same key itself", keymap.APP_BINDINGS),
        ("Overview", "the first screen: one card or one table row per node", keymap.OVERVIEW_BINDINGS),
        ("Node table", "the overview's table of one row per node (`v`)", keymap.NODE_TABLE_BINDINGS),
        ("Node detail", "one node: links, services, GPU processes, disk, versions", keymap.DETAIL_BINDINGS),
        ("Log", "a followed container or unit log", list(LogScreen.BINDINGS)),
        ("Engines", "the engines a node serves (`e` on a node, `E` on a log)", keymap.ENGINE_BINDINGS),
        ("Planner", "the memory planner (`m`)", PLANNER_BINDINGS),
        ("Calibration", "the planner beside a vLLM start's log (`c` on a log)", CALIBRATION_BINDINGS),
        ("Wizard", "the deployment wizard (`w`)", keymap.WIZARD_BINDINGS),
        ("Decision", "a wizard decision", keymap.DECISION_BINDINGS),
        ("Rehearsal report", "the report of a rehearsal (`R` in the wizard)", keymap.REHEARSAL_BINDINGS),
        ("Confirmation", "before any command that changes a node", list(ConfirmScreen.BINDINGS)),
        ("Step confirmation", "before a wizard step's commands (what each does first)",
         [b for b in StepConfirmScreen.BINDINGS if b not in ConfirmScreen.BINDINGS]),
        ("Quit", "`q` while a deployment runs", list(QuitScreen.BINDINGS)),
        ("Help", "the help screen (`?`)", keymap.HELP_BINDINGS),
    ]


def _key(key: str) -> str:
    key = key.strip()
    return _KEY_NAMES.get(key, key)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _rows(bindings: Sequence[Binding]) -> list[tuple[str, str, str]]:
    """(keys, what it does, id), in definition order; numbered bindings (``app.node1`` …
    ``app.node9``, one digit key each) as one row, where the first of them stands."""
    rows: list[tuple[str, str, str]] = []
    groups: dict[str, list[Binding]] = {}
    for b in bindings:
        bid = b.id or ""
        stem = bid.rstrip("0123456789")
        if stem != bid and b.key.isdigit():
            if stem not in groups:
                groups[stem] = []
                rows.append(("", "", stem))  # the group's place: filled in below
            groups[stem].append(b)
            continue
        keys = " ".join(f"`{_key(k)}`" for k in b.key.split(","))
        rows.append((keys, b.tooltip or b.description, bid))
    for i, (keys, _, stem) in enumerate(rows):
        if not keys and stem in groups:
            first, last = groups[stem][0], groups[stem][-1]
            what = (first.tooltip or first.description).replace(first.key, "N")
            rows[i] = (f"`{first.key}` … `{last.key}`", what, f"{stem}{first.key} … {stem}{last.key}")
    return rows


def render_keys_doc() -> str:
    """The whole of docs/keys.md."""
    out = [
        "# Keys",
        "",
        "Every key of the console, screen by screen. `?` (or `F1`) shows the same list for the screen",
        "you are on. This page is generated from the console's keymap by `scripts/gen-keys-doc`; do not",
        "edit it by hand.",
        "",
        "## Rebinding a key",
        "",
        "Every binding has an id (the last column, also shown by `?`). Rebind it in the inventory's",
        "`[keymap]` table ([inventory.md](inventory.md)), with the keys comma-separated in Textual's names",
        "(`ctrl+q`, `question_mark`, `f2`):",
        "",
        "```toml",
        "[keymap]",
        '"app.quit" = "q,ctrl+q"',
        '"overview.filter" = "slash,f"',
        "```",
        "",
    ]
    for heading, where, bindings in _sections():
        out += [f"## {heading}", "", f"Where: {where}.", "", "| key | does | id |", "|---|---|---|"]
        out += [f"| {keys} | {_cell(what)} | `{bid}` |" for keys, what, bid in _rows(bindings)]
        out.append("")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    text = render_keys_doc()
    if not args:
        sys.stdout.write(text)
        return 0
    Path(args[0]).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
