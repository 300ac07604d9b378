"""Reading a recipe file without trusting it: every read is bounded before it is kept.

A recipe comes from a stranger's repository. Before anything is kept the file must be small, valid
UTF-8 YAML, shallow, with short strings, few keys and few aliases (a "billion laughs" alias bomb is a
few hundred bytes that expand to gigabytes). The limits are checked on YAML's event stream, which
needs no recursion, before ``yaml.safe_load`` builds anything, and once more on the built data with a
node budget that counts every alias each time it is reached. Every failure is one line naming the
file and the key.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from sparkconsole.logs.follow import display_lines
from sparkconsole.recipes.model import RecipeError

MAX_FILE_BYTES = 256 * 1024
MAX_DEPTH = 16
MAX_STRING = 16 * 1024
MAX_KEYS = 256  # per mapping
MAX_ITEMS = 1024  # per list
MAX_ALIASES = 100
MAX_NODES = 50_000  # every value visited, an alias each time it is reached


def plain(text: object, limit: int = 80) -> str:
    """A file's words as an error line may show them: no control characters, one line, short."""
    s = display_lines(str(text), " ")
    return s if len(s) <= limit else s[: limit - 1] + "…"


def fail(label: str, key: str | None, problem: str) -> RecipeError:
    """``FILE: key 'a.b' PROBLEM`` (or ``FILE: PROBLEM`` when no key applies)."""
    where = f"key '{plain(key)}' " if key else ""
    return RecipeError(f"{plain(label, 200)}: {where}{problem}")


def read_bounded(path: Path, label: str | None = None) -> str:
    """The file's text, refused when over :data:`MAX_FILE_BYTES` or not UTF-8."""
    label = label or str(path)
    try:
        with path.open("rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except IsADirectoryError:
        raise fail(label, None, "is a directory, not a recipe file") from None
    except OSError as exc:
        raise fail(label, None, f"cannot be read ({exc.strerror or exc.__class__.__name__})") from None
    return decode_bounded(data, label)


def decode_bounded(data: bytes, label: str) -> str:
    if len(data) > MAX_FILE_BYTES:
        raise fail(label, None, f"is larger than {MAX_FILE_BYTES // 1024} KiB; a recipe is a few lines")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise fail(label, None, f"is not UTF-8 text (byte {exc.start})") from None


class _Frame:
    __slots__ = ("count", "index", "is_map", "key", "want_key")

    def __init__(self, is_map: bool) -> None:
        self.is_map = is_map
        self.want_key = True
        self.key: str | None = None
        self.index = -1
        self.count = 0


def _path(stack: list[_Frame]) -> str:
    parts: list[str] = []
    for fr in stack:
        if fr.is_map and fr.key is not None:
            parts.append(fr.key)
        elif not fr.is_map and fr.index >= 0:
            parts.append(f"[{fr.index}]")
    return ".".join(parts).replace(".[", "[")


def _check_events(text: str, label: str) -> None:
    """Walk YAML's event stream (no recursion, nothing built) and enforce every limit."""
    stack: list[_Frame] = []
    aliases = events = 0
    for ev in yaml.parse(text, Loader=yaml.SafeLoader):
        events += 1
        if events > 4 * MAX_NODES:
            raise fail(label, _path(stack) or None, f"holds more than {MAX_NODES} values")
        if isinstance(ev, yaml.MappingEndEvent | yaml.SequenceEndEvent):
            stack.pop()
            continue
        if not isinstance(ev, yaml.NodeEvent):
            continue
        top = stack[-1] if stack else None
        if top is not None:
            if top.is_map:
                if top.want_key:
                    top.key = plain(ev.value, 60) if isinstance(ev, yaml.ScalarEvent) else "?"
                    top.count += 1
                    if top.count > MAX_KEYS:
                        raise fail(label, _path(stack), f"is a mapping with more than {MAX_KEYS} keys")
                top.want_key = not top.want_key
            else:
                top.index += 1
                if top.index >= MAX_ITEMS:
                    raise fail(label, _path(stack), f"is a list of more than {MAX_ITEMS} items")
        if isinstance(ev, yaml.AliasEvent):
            aliases += 1
            if aliases > MAX_ALIASES:
                raise fail(label, _path(stack) or None, f"uses more than {MAX_ALIASES} YAML aliases")
        elif isinstance(ev, yaml.ScalarEvent):
            if len(ev.value) > MAX_STRING:
                raise fail(label, _path(stack) or None, f"holds a string longer than {MAX_STRING} characters")
        elif isinstance(ev, yaml.MappingStartEvent | yaml.SequenceStartEvent):
            if len(stack) >= MAX_DEPTH:
                raise fail(label, _path(stack), f"nests deeper than {MAX_DEPTH} levels")
            stack.append(_Frame(isinstance(ev, yaml.MappingStartEvent)))


def _walk(data: Any) -> Iterator[Any]:
    """Every value in ``data``, an alias once each time it is reached (iterative: no recursion)."""
    todo = [data]
    while todo:
        v = todo.pop()
        yield v
        if isinstance(v, dict):
            todo.extend(v.keys())
            todo.extend(v.values())
        elif isinstance(v, list):
            todo.extend(v)


def load_yaml_mapping(text: str, label: str) -> dict[str, Any]:
    """The text as one YAML mapping, within every limit; else one line naming file and key."""
    if len(text) > MAX_FILE_BYTES:
        raise fail(label, None, f"is larger than {MAX_FILE_BYTES // 1024} KiB; a recipe is a few lines")
    try:
        _check_events(text, label)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f" at line {mark.line + 1}" if mark is not None else ""
        raise fail(label, None, f"is not valid YAML{line}: {plain(exc.problem or exc.context or 'syntax error')}") from None
    except yaml.YAMLError as exc:
        raise fail(label, None, f"is not valid YAML: {plain(exc)}") from None
    except RecursionError:
        raise fail(label, None, f"nests deeper than {MAX_DEPTH} levels") from None
    except (ValueError, OverflowError, TypeError) as exc:  # e.g. a timestamp out of range
        raise fail(label, None, f"holds a value YAML cannot build: {plain(exc)}") from None
    if data is None:
        raise fail(label, None, "is empty")
    if not isinstance(data, dict):
        raise fail(label, None, f"must be a YAML mapping of keys, not a {type(data).__name__}")
    for n, v in enumerate(_walk(data)):
        if n > MAX_NODES:
            raise fail(label, None, f"expands to more than {MAX_NODES} values (YAML aliases)")
        if isinstance(v, str) and len(v) > MAX_STRING:
            raise fail(label, None, f"holds a string longer than {MAX_STRING} characters")
    return data
