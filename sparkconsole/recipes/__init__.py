"""Community recipes (sparkrun, eugr v1, Spark Pulse v2) read into one typed :class:`Recipe`.

See docs/recipes.md for the formats, where recipes are found and the bundled catalogue.
"""

from __future__ import annotations

from sparkconsole.recipes.catalogue import (
    Catalogue,
    bundled_recipes,
    find_recipe,
    load_catalogue,
    user_recipe_dir,
)
from sparkconsole.recipes.formats import detect_format
from sparkconsole.recipes.loader import load_recipe, parse_recipe_text
from sparkconsole.recipes.model import (
    RUNNABLE_ENGINES,
    Measurement,
    Provenance,
    Recipe,
    RecipeError,
)

__all__ = [
    "RUNNABLE_ENGINES",
    "Catalogue",
    "Measurement",
    "Provenance",
    "Recipe",
    "RecipeError",
    "bundled_recipes",
    "detect_format",
    "find_recipe",
    "load_catalogue",
    "load_recipe",
    "parse_recipe_text",
    "user_recipe_dir",
]
