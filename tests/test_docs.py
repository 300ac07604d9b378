"""The documentation says what the code does, and says it to users.

The README is a front page (short, with the set-up commands and an install), the user docs speak of
the tool as it is (no issue numbers, no project history), every relative link lands on a file, and
the pages that describe code (the inventory's keys, the keymap, the wizard's steps and decisions)
are checked against that code, so a key added to the parser or the keymap fails here until the page
says it too.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
USER_DOCS = sorted(DOCS.glob("*.md"))  # docs/development/ is for contributors: not checked for history
ALL_PAGES = [README, ROOT / "CONTRIBUTING.md", *sorted(DOCS.rglob("*.md"))]

# words that tell the project's history instead of what the tool does
HISTORY = re.compile(
    r"\bissues? #?\d+|\bbefore this (?:work|change|round|fix|patch)\b|\bre-?measured\b|\bsince the last\b"
    r"|\b(?:this|last|previous) round\b|\buntil now\b|\bpreviously\b|\bused to be\b",
    re.IGNORECASE,
)
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def _prose(path: Path) -> list[tuple[int, str]]:
    """(line number, line) of a page outside fenced code blocks."""
    out, fenced = [], False
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            out.append((i, line))
    return out


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    return {_slug(line.lstrip("#")) for _, line in _prose(path) if re.match(r"^#{1,6} ", line)}


# ---- the README ---------------------------------------------------------------------------------


def test_the_readme_is_a_front_page():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines: move detail to docs/"
    text = "\n".join(lines)
    for command in ("./scripts/demo", "./scripts/test"):
        assert command in text, f"README.md must keep the set-up command {command}"
    assert re.search(r"^(?:uv tool install|pipx install) \S+", text, re.MULTILINE), "README.md has no install command"
    shots = [t for t in LINK.findall(text) if t.startswith("screenshots/")]
    assert shots, "README.md shows no screenshot"


def test_the_install_puts_the_command_the_docs_name_on_the_path():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    assert scripts.get("sparkconsole") == "sparkconsole.cli:main"


# ---- what the user docs say ---------------------------------------------------------------------


@pytest.mark.parametrize("page", [README, *USER_DOCS], ids=lambda p: str(p.relative_to(ROOT)))
def test_user_docs_tell_the_tool_not_its_history(page: Path):
    found = [f"{page.name}:{i}: {m.group(0)!r}" for i, line in _prose(page) for m in HISTORY.finditer(line)]
    assert not found, "issue numbers or project history in a user doc:\n" + "\n".join(found)


def test_the_history_check_catches_what_it_is_for():
    for sentence in ("Fault suite (issue 14, part 3)", "Before this work it cost 82 %",
                     "Re-measured on 2026-12-01", "as measured since the last round"):
        assert HISTORY.search(sentence), sentence
    for sentence in ("vllm#43367 is upstream's report", "before the weights move", "it is measured here",
                     "this image is no longer recommended"):
        assert not HISTORY.search(sentence), sentence


@pytest.mark.parametrize("page", ALL_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_lands_on_a_file(page: Path):
    broken = []
    for i, line in _prose(page):
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue  # https:, mailto: …
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.name}:{i}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.name}:{i}: {target} (no heading #{anchor})")
    assert not broken, "\n".join(broken)


# ---- docs/inventory.md against the parser -------------------------------------------------------


def _doc_keys() -> dict[str, set[str]]:
    """The keys docs/inventory.md lists: the first column of the table under each table's heading."""
    section_of = {"`[cluster]`": "cluster", "`[[nodes]]`": "nodes", "`[keymap]`": "keymap"}
    keys: dict[str, set[str]] = {"cluster": set(), "nodes": set(), "keymap": set()}
    section = None
    for _, line in _prose(DOCS / "inventory.md"):
        if line.startswith("## "):
            section = section_of.get(line[3:].strip())
        elif section and line.startswith("| `"):
            keys[section].add(line.split("|")[1].strip().strip("`"))
    return keys


def _doc_example() -> str:
    text = (DOCS / "inventory.md").read_text(encoding="utf-8")
    return text.split("## A complete example", 1)[1].split("```toml\n", 1)[1].split("```", 1)[0]


def test_the_inventory_doc_lists_exactly_the_keys_the_parser_reads():
    from sparkconsole.config import CLUSTER_KEYS, NODE_KEYS, TOP_KEYS

    doc = _doc_keys()
    assert set(doc) == set(TOP_KEYS), f"docs/inventory.md documents the tables {sorted(doc)}, the parser {TOP_KEYS}"
    for table, known in (("cluster", CLUSTER_KEYS), ("nodes", NODE_KEYS)):
        assert doc[table] == set(known), (
            f"{table}: read but not in docs/inventory.md: {sorted(set(known) - doc[table])}; "
            f"in the doc but not read: {sorted(doc[table] - set(known))}")


@pytest.mark.parametrize("table", ["cluster", "nodes"])
def test_a_key_the_inventory_doc_does_not_list_is_refused(table: str):
    """The key lists above are the parser's truth: a key outside them is refused, naming it."""
    from sparkconsole.config import parse_config
    from sparkconsole.errors import ConfigError

    base = {"cluster": '[cluster]\nname = "x"\n', "nodes": ""}
    text = base["cluster"] + '[[nodes]]\nname = "a"\nhost = "a"\n'
    extra = "fastlink = 1\n"  # a typo of fast_link, in the table named
    text = text.replace('name = "x"\n', 'name = "x"\n' + extra) if table == "cluster" else text + extra
    assert "fastlink" not in _doc_keys()[table]
    with pytest.raises(ConfigError, match="fastlink"):
        parse_config(text, "sparks.toml")


def test_the_inventory_doc_s_complete_example_is_accepted_and_complete():
    from sparkconsole.config import parse_config

    example = _doc_example()
    config = parse_config(example, "inventory.md")
    assert [n.name for n in config.nodes] == ["spark-1a32", "spark-5be3"]
    assert config.head is not None and config.head.name == "spark-1a32" and config.nodes[1].jump == "spark-1a32"
    raw = tomllib.loads(example)
    doc = _doc_keys()
    assert set(raw["cluster"]) == doc["cluster"]
    assert set().union(*(set(n) for n in raw["nodes"])) == doc["nodes"]
    assert dict(config.keymap) == raw["keymap"]


# ---- docs/keys.md against the keymap ------------------------------------------------------------


def test_the_keys_doc_is_the_keymap():
    from sparkconsole.ui import keymap
    from sparkconsole.ui.keys_doc import render_keys_doc

    rendered = render_keys_doc()
    lists = [v for k, v in vars(keymap).items() if k.endswith("_BINDINGS")] + [[keymap.LOGS_ENGINES_BINDING]]
    for binding in (b for bindings in lists for b in bindings):
        stem = binding.id.rstrip("0123456789")
        shown = f"`{binding.id}`" if stem == binding.id else f"{stem}1 … {stem}9"
        assert shown in rendered, f"the binding {binding.id} is not on the keys page"
    assert (DOCS / "keys.md").read_text(encoding="utf-8") == rendered, (
        "docs/keys.md differs from the keymap: run ./scripts/gen-keys-doc")


# ---- docs/wizard.md against the steps -----------------------------------------------------------


def test_the_wizard_doc_names_every_step_in_order_and_every_decision():
    from sparkconsole.deploy.steps import STEP_IDS, STEPS
    from sparkconsole.deploy.teardown import Teardown

    text = (DOCS / "wizard.md").read_text(encoding="utf-8")
    table = text.split("## The steps", 1)[1].split("\n## ", 1)[0]
    documented = [m.group(1) for m in re.finditer(r"^\| `([a-z-]+)` \|", table, re.MULTILINE)]
    assert documented == list(STEP_IDS), f"docs/wizard.md's steps {documented} against the code's {STEP_IDS}"
    for step in STEP_IDS:
        assert f"### {step}" in text, f"docs/wizard.md has no section for the step {step}"
    decisions = {d for s in STEPS for d in s.decisions} | set(Teardown.decisions)
    missing = sorted(d for d in decisions if f"`{d}`" not in text)
    assert not missing, f"decisions not in docs/wizard.md: {missing}"
