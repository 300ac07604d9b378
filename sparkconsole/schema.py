"""Checking the files the console reads before trusting a value in them.

An inventory, a twin file and a recipe may come from another machine, another version, a typo or a
stranger. Read raw, a string where a number belongs ended a run with a TypeError deep in the
simulator, ``10**400`` with an OverflowError, 100,000 nested ``[`` with a RecursionError inside
``json.loads``, and a misspelt key silently switched a safety setting off. So a file is refused
before anything is built from it: too large before it is read, too deeply nested before it is
parsed, and then every value against a typed :class:`Spec` (kind, range, pattern, length, items,
known keys). Each refusal is one line, ``FILE: key 'nodes[3].mem_total' must be ...``, raised as
the caller's :class:`~sparkconsole.errors.UserError` subclass (exit 2).

Node names have one pattern here (:data:`NODE_NAME`): they are shown on every screen, written in
the journal and used as file names, so they are letters, digits, ``.``, ``_`` and ``-`` only, never
text a terminal or Textual would act on. :data:`MAX_NODES` is the one cap on a cluster's size.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkconsole.errors import UserError

MAX_NODES = 64  # the console's layouts and the demo's SSH servers are made for this many at most
NODE_NAME_MAX = 63
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
NODE_NAME_SAYS = f"a short name: letters, digits, '.', '_', '-', at most {NODE_NAME_MAX} characters"
# What a node may be called anywhere else (a twin file, say): an inventory's name, or the host given
# with ``--host`` (a host name, or an IPv6 address with its zone), which names the node then. Still
# nothing a terminal or Textual acts on: no control character, no bracket.
NODE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,252}|[0-9A-Fa-f.]*:[0-9A-Fa-f:.]*(?:%[A-Za-z0-9_.-]{1,15})?")
NODE_ID_SAYS = "a node name (letters, digits, '.', '_', '-') or an IPv6 address"
BYTES_MAX = 1 << 50  # 1 PiB: more memory or disk than any node has, far below what float() overflows at
PRINTABLE = re.compile(r"[^\x00-\x1f\x7f-\x9f]*")  # no control character (C0, DEL, C1)


class SchemaError(UserError):
    """A file that does not have the shape its reader needs (exit 2, one line)."""


ErrorType = Callable[[str], UserError]


def plain(value: object, limit: int = 60) -> str:
    """A value as an error line may quote it: no control characters, one line, short."""
    # imported here: sparkconsole.logs imports the transports, which import config, which imports this
    from sparkconsole.logs.follow import display_lines

    text = display_lines(value if isinstance(value, str) else repr(value), " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'read_only'?)`` when a known key is close to ``word``, else ""."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def clean_node_name(text: str) -> str:
    """A name the console can show for ``text`` (this machine's hostname, say): escape sequences
    dropped, every other character outside :data:`NODE_NAME` made a ``-``, cut to the longest name.
    Used only where the name is not the user's to fix; a file's names are refused instead."""
    from sparkconsole.logs.follow import display_lines

    name = re.sub(r"[^A-Za-z0-9_.-]", "-", display_lines(text, " ").strip())[:NODE_NAME_MAX].strip("-")
    if not name or not NODE_NAME.fullmatch(name):
        name = ("n" + name)[:NODE_NAME_MAX] if name else "localhost"
    return name


# ---- specs ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Spec:
    """What one value must be. ``kind``: ``str`` ``int`` ``num`` ``bool`` ``list`` ``map`` (any keys,
    values ``item``) ``record`` (the keys in ``fields``, no others) or ``json`` (any JSON value,
    within the sizes). Build them with :func:`Str`, :func:`Int` and the others below."""

    kind: str
    required: bool = False
    nullable: bool = False
    minimum: float | None = None
    maximum: float | None = None
    pattern: re.Pattern[str] | None = None
    says: str = ""  # what the pattern allows, in words for the error line
    max_len: int = 4096
    choices: tuple[str, ...] = ()
    min_items: int = 0
    max_items: int = 1024
    item: Spec | None = None
    key: Spec | None = None
    fields: Mapping[str, Spec] = field(default_factory=dict)


def Str(*, required: bool = False, nullable: bool = False, max_len: int = 4096, pattern: str | re.Pattern[str] | None = None,
        says: str = "", choices: tuple[str, ...] = ()) -> Spec:
    pat = re.compile(pattern) if isinstance(pattern, str) else pattern
    return Spec("str", required, nullable, pattern=pat, says=says, max_len=max_len, choices=choices)


def Int(lo: int, hi: int, *, required: bool = False, nullable: bool = False) -> Spec:
    return Spec("int", required, nullable, minimum=lo, maximum=hi)


def Num(lo: float, hi: float, *, required: bool = False, nullable: bool = False) -> Spec:
    return Spec("num", required, nullable, minimum=lo, maximum=hi)


def Bool(*, required: bool = False, nullable: bool = False) -> Spec:
    return Spec("bool", required, nullable)


def ListOf(item: Spec, *, max_items: int, min_items: int = 0, required: bool = False, nullable: bool = False) -> Spec:
    return Spec("list", required, nullable, item=item, min_items=min_items, max_items=max_items)


def MapOf(item: Spec, *, max_items: int, key: Spec | None = None, required: bool = False,
          nullable: bool = False) -> Spec:
    return Spec("map", required, nullable, item=item, key=key or Str(max_len=256), max_items=max_items)


def Record(fields: Mapping[str, Spec], *, required: bool = False, nullable: bool = False) -> Spec:
    return Spec("record", required, nullable, fields=dict(fields))


def Json(*, max_items: int = 4096, max_len: int = 64 * 1024, required: bool = False, nullable: bool = False) -> Spec:
    """Any JSON value (a model's config.json): only its sizes are checked, and that numbers are finite."""
    return Spec("json", required, nullable, max_items=max_items, max_len=max_len)


NodeName = Str(required=True, max_len=NODE_NAME_MAX, pattern=NODE_NAME, says=NODE_NAME_SAYS)
NodeId = Str(required=True, max_len=253, pattern=NODE_ID, says=NODE_ID_SAYS)


# ---- checking ------------------------------------------------------------------------------------

def _kind_of(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):  # quoted as written: a control character shows as its escape
        return f'"{plain(value, 40)}"' if PRINTABLE.fullmatch(value) else plain(repr(value), 40)
    if isinstance(value, int) and abs(value) > 10**30:
        return "a number with more than 30 digits"
    if isinstance(value, int | float):
        return plain(value, 24)
    return {dict: "a table", list: "a list"}.get(type(value), type(value).__name__)


def _wants(spec: Spec) -> str:
    """The spec in words: ``a whole number from 1 to 65535``."""
    if spec.kind == "str":
        if spec.choices:
            return "one of " + ", ".join(f'"{c}"' for c in spec.choices)
        return spec.says or f"a string of at most {spec.max_len} characters"
    if spec.kind == "int":
        return f"a whole number from {int(spec.minimum or 0)} to {int(spec.maximum or 0)}"
    if spec.kind == "num":
        return f"a number from {spec.minimum:g} to {spec.maximum:g}"
    if spec.kind == "bool":
        return "true or false"
    if spec.kind == "list":
        return f"a list of at most {spec.max_items} items"
    if spec.kind in ("map", "record"):
        return "a table of keys and values" if spec.kind == "record" else f"a table of at most {spec.max_items} keys"
    return "a JSON value"


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


class Checker:
    """One file's check: ``label`` (the file) starts every line, ``error`` is the exception raised."""

    def __init__(self, label: str, error: ErrorType = SchemaError) -> None:
        self.label = label
        self.error = error

    def fail(self, path: str, problem: str) -> UserError:
        where = f"key '{plain(path, 80)}' " if path else ""
        return self.error(f"{plain(self.label, 200)}: {where}{problem}")

    def check(self, value: Any, spec: Spec, path: str = "") -> None:
        """Raise on the first value of ``value`` that ``spec`` refuses (depth-first, in file order)."""
        if value is None:
            if spec.nullable or not spec.required:
                return
            raise self.fail(path, f"must be {_wants(spec)}, not null")
        wrong = f"must be {_wants(spec)}, not {_kind_of(value)}"
        k = spec.kind
        if k == "str":
            if not isinstance(value, str):
                raise self.fail(path, wrong)
            if len(value) > spec.max_len:
                raise self.fail(path, f"is longer than {spec.max_len} characters")
            if spec.choices and value not in spec.choices:
                raise self.fail(path, wrong)
            if spec.pattern is not None and not spec.pattern.fullmatch(value):
                raise self.fail(path, wrong)
        elif k in ("int", "num"):
            if isinstance(value, bool) or not isinstance(value, int | float) or (k == "int" and not isinstance(value, int)):
                raise self.fail(path, wrong)
            if isinstance(value, float) and not math.isfinite(value):
                raise self.fail(path, wrong)
            lo = spec.minimum if spec.minimum is not None else -math.inf
            hi = spec.maximum if spec.maximum is not None else math.inf
            if not lo <= value <= hi:  # int against float compares exactly, however large the int
                raise self.fail(path, wrong)
        elif k == "bool":
            if not isinstance(value, bool):
                raise self.fail(path, wrong)
        elif k == "list":
            if not isinstance(value, list):
                raise self.fail(path, wrong)
            if not spec.min_items <= len(value) <= spec.max_items:
                what = "is empty" if not value else f"has {len(value)} items"
                raise self.fail(path, f"{what}; it must have {spec.min_items} to {spec.max_items}")
            assert spec.item is not None
            for i, v in enumerate(value):
                self.check(v, spec.item, _join(path, i))
        elif k == "map":
            if not isinstance(value, dict):
                raise self.fail(path, wrong)
            if len(value) > spec.max_items:
                raise self.fail(path, f"has {len(value)} keys; at most {spec.max_items} are read")
            assert spec.item is not None and spec.key is not None
            for key, v in value.items():
                try:
                    self.check(key, spec.key, path)
                except UserError:
                    raise self.fail(path, f"has a key that must be {_wants(spec.key)}, not {_kind_of(key)}") from None
                self.check(v, spec.item, _join(path, key))
        elif k == "record":
            if not isinstance(value, dict):
                raise self.fail(path, wrong)
            for key in value:
                if key not in spec.fields:
                    raise self.fail("", f"unknown key '{plain(_join(path, key), 80)}'"
                                        f"{did_you_mean(str(key), spec.fields)}")
            for key, sub in spec.fields.items():
                if key not in value:
                    if sub.required:
                        raise self.fail(_join(path, key), f"is missing or of the wrong kind: it must be {_wants(sub)}")
                    continue
                self.check(value[key], sub, _join(path, key))
        elif k == "json":
            self._check_json(value, spec, path)
        else:  # pragma: no cover - a spec built wrong is a bug here, not in the file
            raise ValueError(f"unknown spec kind {k!r}")

    def _check_json(self, value: Any, spec: Spec, path: str) -> None:
        """Any JSON value within the sizes, walked without recursion."""
        todo: list[tuple[str, Any]] = [(path, value)]
        while todo:
            p, v = todo.pop()
            if isinstance(v, str):
                if len(v) > spec.max_len:
                    raise self.fail(p, f"is longer than {spec.max_len} characters")
            elif isinstance(v, float) and not math.isfinite(v):
                raise self.fail(p, "must be a finite number")
            elif isinstance(v, int) and not isinstance(v, bool) and abs(v) > 1 << 64:
                raise self.fail(p, "is a number too large to be read")
            elif isinstance(v, list | dict):
                if len(v) > spec.max_items:
                    raise self.fail(p, f"has {len(v)} items; at most {spec.max_items} are read")
                items = v.items() if isinstance(v, dict) else enumerate(v)
                todo.extend((_join(p, k), x) for k, x in items)


def check(value: Any, spec: Spec, label: str, error: ErrorType = SchemaError) -> None:
    """``value`` (a whole file's data) against ``spec``; one line naming ``label`` and the key, else nothing."""
    Checker(label, error).check(value, spec)


def unknown_key(key: str, known: Iterable[str], where: str, table: str, error: ErrorType = SchemaError) -> UserError:
    """The error for a key no reader knows: a typo must not quietly switch a setting off."""
    return error(f"{where}: unknown key '{plain(key)}' in {table}{did_you_mean(key, known)}")


# ---- reading -------------------------------------------------------------------------------------

def read_capped(path: Path, max_bytes: int, what: str, error: ErrorType = SchemaError) -> str:
    """The file's text, refused before it is kept when over ``max_bytes`` or not UTF-8."""
    try:
        with path.open("rb") as f:
            data = f.read(max_bytes + 1)
    except FileNotFoundError:
        raise error(f"{path}: no such {what}") from None
    except IsADirectoryError:
        raise error(f"{path}: is a directory, not a {what}") from None
    except OSError as exc:
        raise error(f"{path}: cannot read it ({exc.strerror or exc.__class__.__name__})") from None
    if len(data) > max_bytes:
        raise error(f"{path}: is larger than {_size(max_bytes)}; a {what} is smaller")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: is not UTF-8 text (byte {exc.start})") from None


def _size(n: int) -> str:
    return f"{n // (1 << 20)} MiB" if n >= 1 << 20 else f"{n // 1024} KiB"


_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_BRACKET = re.compile(r"[\[\]{}]")


def json_depth_exceeds(text: str, limit: int) -> bool:
    """Whether ``text`` opens more than ``limit`` arrays or objects inside each other, found without
    parsing (strings blanked, brackets counted): ``json.loads`` recurses once per level."""
    depth = 0
    for m in _BRACKET.finditer(_JSON_STRING.sub('""', text)):
        if m.group() in "[{":
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


def load_json(text: str, label: str, *, max_depth: int, error: ErrorType = SchemaError) -> Any:
    """The JSON document, or one line: too deep (checked before parsing), not JSON, or holding
    NaN/Infinity (Python's extension, not JSON, and no reading of a cluster)."""
    if json_depth_exceeds(text, max_depth):
        raise error(f"{plain(label, 200)}: nests deeper than {max_depth} levels")

    def constant(name: str) -> Any:
        raise error(f"{plain(label, 200)}: holds {name}, which is not a JSON number")

    try:
        return json.loads(text, parse_constant=constant)
    except RecursionError:  # the depth check counts every bracket: this cannot happen, but stays one line
        raise error(f"{plain(label, 200)}: nests deeper than {max_depth} levels") from None
    except ValueError as exc:
        raise error(f"{plain(label, 200)}: not JSON ({plain(exc, 120)})") from None
