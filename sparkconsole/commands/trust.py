"""`sparkconsole trust` (placeholder until its module lands)."""

from __future__ import annotations

import argparse

from sparkconsole.errors import UserError


def add_parser(subs: argparse._SubParsersAction) -> None:
    p = subs.add_parser("trust", help="(not yet available)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    raise UserError("'trust' is not available yet")
