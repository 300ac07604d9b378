"""The ``sparkconsole`` command: one entry point, one subcommand module each.

Each module in :mod:`sparkconsole.commands` offers ``add_parser(subparsers)`` and
``run(args) -> int``. Every :class:`~sparkconsole.errors.UserError` ends here as one line on
stderr with its exit code; nothing the user typed ever produces a traceback.
"""

from __future__ import annotations

import _signal  # the C module: installed before anything slow is imported (``signal`` pulls in enum)


def _interrupted_while_starting(signum: int, frame: object) -> None:
    """Ctrl-C before :func:`main` runs (Python still importing the command's libraries): one line,
    exit 130, as later; a KeyboardInterrupt here would be a traceback through the import machinery."""
    import sys

    sys.stderr.write("sparkconsole: interrupted\n")
    raise SystemExit(130)


try:
    _signal.signal(_signal.SIGINT, _interrupted_while_starting)
except ValueError:  # imported off the main thread (a test's worker): nothing to install there
    pass

import argparse  # noqa: E402 - after the handler above, so an interrupt while importing is one line
import contextlib  # noqa: E402
import importlib  # noqa: E402
import sys  # noqa: E402
from collections.abc import Sequence  # noqa: E402

from sparkconsole import __version__  # noqa: E402
from sparkconsole.dependency_warnings import silence_dependency_deprecations  # noqa: E402
from sparkconsole.errors import UserError  # noqa: E402

with contextlib.suppress(ValueError):  # imported: Ctrl-C is a KeyboardInterrupt again (main catches it)
    if _signal.getsignal(_signal.SIGINT) is _interrupted_while_starting:
        _signal.signal(_signal.SIGINT, _signal.default_int_handler)

# Order is the order `--help` lists them in.
COMMANDS = ("tui", "demo", "deploy", "bench", "snapshot", "parse", "plan", "trust", "recipes")


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one line and exit 2 like every other bad input."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def add_cluster_args(p: argparse.ArgumentParser) -> None:
    """The options that choose which nodes to talk to (shared by tui and snapshot)."""
    g = p.add_argument_group("cluster")
    g.add_argument("--config", metavar="FILE", help="cluster inventory (TOML); else $SPARKCONSOLE_CONFIG, "
                   "else the user config dir")
    g.add_argument("--host", action="append", metavar="[USER@]HOST[:PORT]",
                   help="an ad-hoc cluster: repeat for each node, the first is the head")
    g.add_argument("--local", action="store_true", help="probe this machine itself (on a Spark), no SSH")
    g.add_argument("--demo", action="store_true", help="the built-in simulated two-Spark cluster")
    g.add_argument("--read-only", action="store_true", help="refuse every command that changes a node")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="sparkconsole",
        description="A terminal console for a cluster of NVIDIA DGX Spark machines: watch every node, "
        "control services, follow engine logs, plan and deploy one large model across the nodes.",
    )
    parser.add_argument("--version", action="version", version=f"sparkconsole {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="show every warning, the libraries' deprecation warnings included (before COMMAND)")
    subs = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        module = importlib.import_module(f"sparkconsole.commands.{name}")
        module.add_parser(subs)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Every path ends in one line and an exit status: a UserError its own, Ctrl-C 130, whether
    it comes while the command's modules are still importing or while it runs."""
    try:
        args_list = list(sys.argv[1:] if argv is None else argv)
        verbose = bool(args_list) and args_list[0] in ("-v", "--verbose")
        if verbose:
            args_list = args_list[1:]
        # before the subcommands' modules import their libraries (asyncssh warns at import time)
        silence_dependency_deprecations(verbose)
        parser = build_parser()
        if not args_list or (args_list[0].startswith("-") and args_list[0] not in ("-h", "--help", "--version")):
            args_list = ["tui", *args_list]
        args = parser.parse_args(args_list)
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"sparkconsole: error: {exc.message}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("sparkconsole: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
