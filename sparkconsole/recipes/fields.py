"""Typed reads of one recipe mapping: each wrong type is one error naming the file and the key.

YAML's ``true`` is a Python ``bool``, which is an ``int``: every integer read here refuses it, so
``tensor_parallel: yes`` is an error and not a TP of 1.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from sparkconsole.recipes.bounded import fail

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


class Fields:
    """One mapping of a recipe file (the top level, ``defaults``, ``params``...), with the file's
    label and the mapping's key prefix, so every error names ``file: key 'prefix.key'``."""

    def __init__(self, data: Mapping[str, Any], label: str, prefix: str = "") -> None:
        self.data = data
        self.label = label
        self.prefix = prefix
        for k in data:
            if not isinstance(k, str):
                raise fail(label, self.key(str(k)), "must be a text key")

    def key(self, k: str) -> str:
        return f"{self.prefix}.{k}" if self.prefix else k

    def error(self, k: str, problem: str) -> Exception:
        return fail(self.label, self.key(k), problem)

    def has(self, k: str) -> bool:
        return self.data.get(k) is not None

    def text(self, k: str, *, required: bool = False) -> str | None:
        v = self.data.get(k)
        if v is None:
            if required:
                raise self.error(k, "is required")
            return None
        if not isinstance(v, str) or not v.strip():
            raise self.error(k, "must be a non-empty string")
        return v

    def integer(self, k: str, *, minimum: int = 1, maximum: int | None = None) -> int | None:
        v = self.data.get(k)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.error(k, "must be an integer")
        if v < minimum or (maximum is not None and v > maximum):
            top = f" and at most {maximum}" if maximum is not None else ""
            raise self.error(k, f"must be at least {minimum}{top}, not {v}")
        return v

    def fraction(self, k: str) -> float | None:
        """A number in (0, 1]: ``gpu_memory_utilization`` (Spark Pulse recipe-v2.schema.json)."""
        v = self.data.get(k)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise self.error(k, "must be a number")
        if not 0 < v <= 1:
            raise self.error(k, f"must be more than 0 and at most 1, not {v}")
        return float(v)

    def flag(self, k: str) -> bool:
        v = self.data.get(k)
        if v is None:
            return False
        if not isinstance(v, bool):
            raise self.error(k, "must be true or false")
        return v

    def mapping(self, k: str) -> Fields:
        v = self.data.get(k)
        if v is None:
            return Fields({}, self.label, self.key(k))
        if not isinstance(v, dict):
            raise self.error(k, "must be a mapping")
        return Fields(v, self.label, self.key(k))

    def text_list(self, k: str) -> tuple[str, ...]:
        """A list of strings; one string is taken as a list of one (Spark Pulse's coercion)."""
        v = self.data.get(k)
        if v is None:
            return ()
        if isinstance(v, str):
            v = [v]
        if not isinstance(v, list) or not all(isinstance(x, str) and x.strip() for x in v):
            raise self.error(k, "must be a list of strings")
        return tuple(v)

    def scalars(self) -> dict[str, Any]:
        """The mapping's values for placeholders: strings, numbers and booleans only."""
        out: dict[str, Any] = {}
        for k, v in self.data.items():
            if v is None:
                continue
            if isinstance(v, bool | int | float | str):
                out[k] = v
            else:
                raise self.error(k, "must be a string, a number or true/false")
        return out

    def env(self, k: str) -> dict[str, str]:
        """``env``: names a shell accepts, values as text (numbers and booleans as ``str()``
        writes them, as sparkrun does: src/sparkrun/core/recipe.py)."""
        m = self.mapping(k)
        out: dict[str, str] = {}
        for name, v in m.data.items():
            if not ENV_NAME.match(name):
                raise m.error(name, "is not an environment variable name")
            if v is None:
                v = ""
            if not isinstance(v, bool | int | float | str):
                raise m.error(name, "must be a string or a number")
            out[name] = str(v)
        return out



def checked_params(f: Fields) -> dict[str, Any]:
    """``defaults`` / ``params``: the keys the console reads are typed (Spark Pulse
    recipe-v2.schema.json ``params``, eugr's spark-recipe.schema.json ``defaults``); the others are
    free placeholders (strings, numbers, booleans)."""
    for k in ("tensor_parallel", "pipeline_parallel", "max_model_len", "max_num_batched_tokens", "max_num_seqs"):
        f.integer(k)
    f.integer("port", maximum=65535)
    f.fraction("gpu_memory_utilization")
    f.text("host")
    return f.scalars()
