"""`sparkconsole demo` (placeholder until its module lands)."""

from __future__ import annotations

import argparse

from sparkconsole.errors import UserError


def add_parser(subs: argparse._SubParsersAction) -> None:
    p = subs.add_parser("demo", help="(not yet available)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    raise UserError("'demo' is not available yet")
