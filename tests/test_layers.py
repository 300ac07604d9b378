"""The house rule, enforced: only sparkconsole.ui imports Textual.

Every other module is imported in a fresh interpreter in which importing ``textual`` fails, so a
stray import anywhere below the UI (even an indirect one) breaks this test.
"""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import sparkconsole

BLOCKER = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "textual" or name.startswith("textual."):
            raise ImportError(f"textual imported outside sparkconsole.ui: {name}")
        return None
sys.meta_path.insert(0, Block())
import importlib
for name in sys.argv[1:]:
    importlib.import_module(name)
print("ok", len(sys.argv) - 1)
"""


def _non_ui_modules() -> list[str]:
    names = []
    for info in pkgutil.walk_packages(sparkconsole.__path__, "sparkconsole."):
        if info.name == "sparkconsole.ui" or info.name.startswith("sparkconsole.ui."):
            continue
        names.append(info.name)
    return names


def test_no_module_below_the_ui_imports_textual():
    modules = _non_ui_modules()
    assert "sparkconsole.probe.poller" in modules and "sparkconsole.sim.server" in modules
    out = subprocess.run([sys.executable, "-c", BLOCKER, *modules], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == f"ok {len(modules)}"


def test_the_blocker_really_blocks():
    out = subprocess.run([sys.executable, "-c", BLOCKER, "sparkconsole.ui.app"], capture_output=True, text=True)
    assert out.returncode != 0 and "textual imported outside sparkconsole.ui" in out.stderr


def test_every_runtime_dependency_is_imported_by_the_package():
    """A dependency declared for the console is one its code uses (issue 11 item 16: psutil and
    tomlkit were declared and never imported)."""
    import re
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    deps = tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]
    names = [re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0].replace("-", "_").lower() for d in deps]
    names = [{"pyyaml": "yaml"}.get(n, n) for n in names]  # distributions whose import name differs
    assert names, "no runtime dependencies read"
    source = "\n".join(p.read_text(encoding="utf-8") for p in (root / "sparkconsole").rglob("*.py"))
    unused = [n for n in names if not re.search(rf"^\s*(?:import|from)\s+{n}\b", source, re.M)]
    assert unused == []


def test_no_test_skips_when_a_module_of_the_project_is_missing():
    """The project's own modules are always there: a test that imports one with importorskip
    would turn a broken import into a silent skip."""
    import re
    from pathlib import Path

    tests = Path(__file__).resolve().parent
    needle = re.compile(r"importorskip\(\s*['\"]sparkconsole\b")
    offenders = [str(p.relative_to(tests)) for p in tests.rglob("*.py") if needle.search(p.read_text(encoding="utf-8"))]
    assert offenders == []
