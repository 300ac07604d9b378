"""Where recipes are found: the ones bundled with the console, the user's own folder, and any
file named on the command line.

The user's folder is ``recipes/`` beside the cluster inventory (``~/.config/sparkconsole/recipes/``
for the default inventory), so a cluster's recipes travel with its inventory. A user recipe with
the same name as a bundled one replaces it. The bundled recipes are data files in
``sparkconsole/recipes/bundled/``: updating the catalogue touches no code.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from sparkconsole.config import config_search, default_config_path
from sparkconsole.recipes.bounded import decode_bounded, fail, plain
from sparkconsole.recipes.loader import SUFFIXES, load_recipe, parse_recipe_text
from sparkconsole.recipes.model import Recipe, RecipeError

MAX_FOLDER_FILES = 500


def user_recipe_dir(config: str | os.PathLike[str] | None = None) -> Path:
    """``recipes/`` beside the inventory that ``--config`` (then ``$SPARKCONSOLE_CONFIG``, then the
    user config dir) names; beside the default inventory path when there is none yet."""
    found = config_search(config)
    return (found or default_config_path()).parent / "recipes"


def bundled_recipes(*, overrides: Mapping[str, Any] | None = None) -> list[Recipe]:
    """The recipes shipped inside the package (read with importlib.resources, so they are found
    in a wheel or a zip as well as in a checkout)."""
    folder = resources.files("sparkconsole.recipes").joinpath("bundled")
    out = []
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.is_file() or not entry.name.endswith(SUFFIXES):
            continue
        label = f"bundled/{entry.name}"
        text = decode_bounded(entry.read_bytes(), label)
        out.append(parse_recipe_text(text, Path(entry.name).stem, label, overrides=overrides, origin="bundled"))
    return out


def _folder_files(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in SUFFIXES and p.is_file())
    if len(files) > MAX_FOLDER_FILES:
        raise fail(str(folder), None, f"holds more than {MAX_FOLDER_FILES} recipe files")
    return files


@dataclass
class Catalogue:
    """Every recipe found, and one line for each file that could not be read (never fatal to
    the others)."""

    recipes: list[Recipe] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def names(self) -> list[str]:
        return [r.name for r in self.recipes]


def load_catalogue(user_dir: Path | None = None, paths: Iterable[str | os.PathLike[str]] = (), *,
                   overrides: Mapping[str, Any] | None = None) -> Catalogue:
    """Bundled recipes, then the user's folder (a same-named user recipe replaces a bundled one),
    then ``paths`` as given."""
    cat = Catalogue()
    by_name: dict[str, Recipe] = {r.name: r for r in bundled_recipes(overrides=overrides)}
    if user_dir is not None:
        try:
            files = _folder_files(user_dir)
        except RecipeError as exc:
            cat.errors.append(exc.message)
            files = []
        for f in files:
            try:
                r = load_recipe(f, overrides=overrides, origin="user")
            except RecipeError as exc:
                cat.errors.append(exc.message)
                continue
            by_name[r.name] = r
    cat.recipes = list(by_name.values())
    for p in paths:
        try:
            cat.recipes.append(load_recipe(p, overrides=overrides, origin="file"))
        except RecipeError as exc:
            cat.errors.append(exc.message)
    return cat


def _looks_like_path(text: str) -> bool:
    return os.sep in text or "/" in text or text.lower().endswith(SUFFIXES) or text.startswith("~")


def find_recipe(name_or_path: str, user_dir: Path | None = None, *,
                overrides: Mapping[str, Any] | None = None) -> Recipe:
    """The one recipe ``deploy --recipe NAME|FILE`` means: a path (it has a slash or ends in
    .yaml/.yml) is read as a file; a name is looked up in the user's folder first, then among the
    bundled recipes. Only files of that name are read, so a broken neighbour does not matter."""
    if not name_or_path or len(name_or_path) > 4096:
        raise RecipeError("a recipe name or file is needed")
    if _looks_like_path(name_or_path):
        return load_recipe(name_or_path, overrides=overrides)
    if user_dir is not None:
        for suffix in SUFFIXES:
            candidate = user_dir / f"{name_or_path}{suffix}"
            if candidate.is_file():
                return load_recipe(candidate, overrides=overrides, origin="user")
    bundled = bundled_recipes(overrides=overrides)
    for r in bundled:
        if r.name == name_or_path:
            return r
    known = sorted({r.name for r in bundled} | {p.stem for p in (_folder_files(user_dir) if user_dir else [])})
    raise RecipeError(f"no recipe named '{plain(name_or_path)}' (known: {plain(', '.join(known), 300)})")
