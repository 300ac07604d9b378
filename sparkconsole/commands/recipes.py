"""``sparkconsole recipes [PATH...]``: every recipe the console can find, and why one cannot run.

Lists the bundled recipes, the user's own folder (``recipes/`` beside the cluster inventory) and any
file given, in any of the three community formats (docs/recipes.md). A file that cannot be read is
one line on stderr naming file and key, and the exit code is then 2; the others are still listed.
"""

from __future__ import annotations

import argparse
import json
import sys

from sparkconsole.config import config_search, load_config
from sparkconsole.errors import UserError
from sparkconsole.logs.follow import display_lines
from sparkconsole.recipes import Recipe, load_catalogue, user_recipe_dir


def add_parser(subs: argparse._SubParsersAction) -> None:
    p = subs.add_parser("recipes", help="list the recipes the console can deploy (bundled, yours, files)",
                        description="List bundled recipes, the recipes in the folder beside the cluster "
                        "inventory, and any recipe files given (sparkrun, eugr v1 or Spark Pulse v2 format).")
    p.add_argument("paths", nargs="*", metavar="PATH", help="recipe files to list as well")
    p.add_argument("--config", metavar="FILE", help="cluster inventory (TOML): its folder's recipes/ is "
                   "searched, and its node count is the cluster size")
    p.add_argument("--nodes", type=int, metavar="N", help="cluster size to check recipes against "
                   "(default: the inventory's node count)")
    p.add_argument("--json", action="store_true", help="print a JSON list")
    p.set_defaults(func=run)


def _cell(text: object, width: int) -> str:
    s = display_lines(str(text), " ") if text is not None else "—"
    return s if len(s) <= width else s[: width - 1] + "…"


def _nodes_text(r: Recipe) -> str:
    """The Sparks it needs; ``2-4`` where the recipe allows more, up to ``max_nodes``."""
    return f"{r.nodes}-{r.max_nodes}" if r.max_nodes is not None and r.max_nodes > r.nodes else f"{r.nodes}"


def _table(recipes: list[Recipe], nodes: int | None) -> str:
    header = f"{'NAME':<38} {'FORMAT':<15} {'MODEL':<32} {'ENGINE':<9} {'NODES':<5} {'IMAGE':<32} NOTE"
    lines = [header]
    for r in recipes:
        note = r.cannot_run_here(nodes) or ""
        lines.append(f"{_cell(r.name, 38):<38} {r.format:<15} {_cell(r.model, 32):<32} {_cell(r.engine, 9):<9} "
                     f"{_nodes_text(r):<5} {_cell(r.image, 32):<32} {_cell(note, 160)}".rstrip())
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.nodes is not None and not 1 <= args.nodes <= 1024:
        raise UserError("--nodes must be between 1 and 1024")
    folder = user_recipe_dir(args.config)
    nodes = args.nodes
    if nodes is None:
        inventory = config_search(args.config)
        if inventory is not None:
            nodes = len(load_config(inventory).nodes)
    cat = load_catalogue(folder, args.paths)
    if args.json:
        # ensure_ascii (the default): every control character in a file's text is a \u escape
        print(json.dumps([r.to_json(nodes) for r in cat.recipes], indent=2))
    else:
        print(_table(cat.recipes, nodes))
    for line in cat.errors:
        print(f"sparkconsole: error: {display_lines(line, ' ')}", file=sys.stderr)
    return 2 if cat.errors else 0
