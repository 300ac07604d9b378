"""`sparkconsole plan` (placeholder until its module lands)."""

from __future__ import annotations

import argparse

from sparkconsole.errors import UserError


def add_parser(subs: argparse._SubParsersAction) -> None:
    p = subs.add_parser("plan", help="(not yet available)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    raise UserError("'plan' is not available yet")
