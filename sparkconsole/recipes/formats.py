"""Which of the three formats a recipe mapping is written in: one rule, in one place.

The formats overlap: sparkrun and Spark Pulse both call their format ``recipe_version: "2"``, and
a file with no ``recipe_version`` is v1 to Spark Pulse (recipe_schema.py ``detect_version``) but
"2" to sparkrun (recipe.py: ``data.get("recipe_version", "2")``). The keys settle it:

1. ``recipe_version`` other than absent, "1" or "2" (or 1, 2) → not a recipe this console reads.
2. ``recipe_version: "1"`` → **eugr-v1** (eugr run-recipe.py; sparkrun treats "1" as the legacy
   eugr format too).
3. any of Spark Pulse's own keys ``params``, ``engines``, ``engine``, ``constraints`` →
   **spark-pulse-v2**.
4. any key only sparkrun has (``runtime``, ``min_nodes``, ``max_nodes``, ``metadata``, ``mode``,
   ``pre_exec``, ``post_exec``, ``post_commands``, ``executor_config``, ``builder``,
   ``builder_config``, ``runtime_config``, ``model_revision``, ``distribution_config``,
   ``benchmark``, ``stop_after_post``, ``sparkrun_version``) → **sparkrun**.
5. no ``recipe_version``, with ``name`` and ``command`` (eugr's required keys) → **eugr-v1**
   (eugr's files before ``recipe_version`` existed, as Spark Pulse reads them).
6. anything else → **sparkrun** (its ``recipe_version`` defaults to "2").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sparkconsole.recipes.bounded import fail
from sparkconsole.recipes.model import Format

SPARK_PULSE_KEYS = frozenset({"params", "engines", "engine", "constraints"})
SPARKRUN_ONLY_KEYS = frozenset({
    "runtime", "min_nodes", "max_nodes", "metadata", "mode", "pre_exec", "post_exec", "post_commands",
    "executor_config", "builder", "builder_config", "runtime_config", "model_revision",
    "distribution_config", "benchmark", "stop_after_post", "sparkrun_version",
})


def recipe_version(data: Mapping[str, Any], label: str) -> str | None:
    raw = data.get("recipe_version")
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, str | int):
        raise fail(label, "recipe_version", 'must be "1" or "2"')
    version = str(raw).strip()
    if version not in ("1", "2"):
        raise fail(label, "recipe_version", f'is "{version[:20]}"; this console reads "1" (eugr) and "2" '
                   "(sparkrun, Spark Pulse)")
    return version


def detect_format(data: Mapping[str, Any], label: str = "<recipe>") -> Format:
    """The format of a recipe mapping, by the rule in this module's docstring."""
    version = recipe_version(data, label)
    keys = set(data)
    if version == "1":
        return "eugr-v1"
    if keys & SPARK_PULSE_KEYS:
        return "spark-pulse-v2"
    if keys & SPARKRUN_ONLY_KEYS:
        return "sparkrun"
    if version is None and "name" in keys and "command" in keys:
        return "eugr-v1"
    return "sparkrun"
