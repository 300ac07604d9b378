"""One recipe file (or text) in, one :class:`Recipe` out, whatever its format."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sparkconsole.recipes.assemble import assemble
from sparkconsole.recipes.bounded import fail, load_yaml_mapping, plain, read_bounded
from sparkconsole.recipes.eugr import read_eugr
from sparkconsole.recipes.fields import Fields
from sparkconsole.recipes.formats import detect_format
from sparkconsole.recipes.model import Origin, Recipe
from sparkconsole.recipes.spark_pulse import read_spark_pulse
from sparkconsole.recipes.sparkrun import read_sparkrun

SUFFIXES = (".yaml", ".yml")


def parse_recipe_text(text: str, name: str, label: str | None = None, *,
                      overrides: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None,
                      origin: Origin = "file") -> Recipe:
    """A recipe from YAML text. ``name`` is what it is looked up by (a file's stem);
    ``overrides`` fill placeholders before the recipe's own defaults (sparkrun's ``-o``,
    eugr's ``--port``...); ``environ`` expands sparkrun's ``$VAR`` in ``env`` (default: this
    process's environment)."""
    label = label or name
    data = load_yaml_mapping(text, label)
    top = Fields(data, label)
    fmt = detect_format(data, label)
    over = dict(overrides or {})
    if fmt == "eugr-v1":
        parts = read_eugr(top, name, over, ray=str(over.get("distributed_executor_backend", "")).lower() == "ray")
    elif fmt == "spark-pulse-v2":
        parts = read_spark_pulse(top, name, over)
    else:
        parts = read_sparkrun(top, name, over, environ)
    return assemble(parts, origin)


def load_recipe(path: str | Path, *, overrides: Mapping[str, Any] | None = None,
                environ: Mapping[str, str] | None = None, origin: Origin = "file") -> Recipe:
    """A recipe file, read within the limits of :mod:`sparkconsole.recipes.bounded`."""
    p = Path(path).expanduser()
    label = str(path)
    if p.suffix.lower() not in SUFFIXES:
        raise fail(label, None, "is not a .yaml or .yml file")
    if not p.exists():
        raise fail(label, None, "no such recipe file")
    text = read_bounded(p, label)
    stem = p.stem
    if not stem or len(stem) > 120:
        raise fail(label, None, f"has a name the console cannot use: {plain(stem)}")
    return parse_recipe_text(text, stem, label, overrides=overrides, environ=environ, origin=origin)
