"""Other packages' deprecation warnings never reach a user's stderr.

A library that deprecates something prints to stderr at import time, on every command: asyncssh
2.24 with cryptography 51 printed five ``CryptographyDeprecationWarning: DSA is deprecated``
warnings (ten lines) before ``--help``. They speak to the library's developers, not to an operator,
and they break the promise that bad input is one line on stderr. So the entry point drops
deprecation warnings raised from code outside this package, and only those:

- "deprecation" is the category's name, not only :class:`DeprecationWarning`: cryptography's
  ``CryptographyDeprecationWarning`` is a :class:`UserWarning`;
- the warning's own code decides: a warning attributed to a file of this package still shows,
  as does every other kind of warning from anywhere;
- ``-v``/``--verbose``, ``python -W …`` or ``PYTHONWARNINGS`` ask for them back: nothing is
  dropped then.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import TextIO

_OURS = str(Path(__file__).resolve().parent) + os.sep


def is_dependency_deprecation(category: type[Warning], filename: str) -> bool:
    """A deprecation warning (by its class or any base's name) from a file outside this package."""
    deprecation = any("Deprecation" in cls.__name__ for cls in category.__mro__)
    if not deprecation:
        return False
    try:
        where = str(Path(filename).resolve())
    except (OSError, ValueError):
        where = filename
    return not where.startswith(_OURS)


def asked_for_warnings(verbose: bool) -> bool:
    """The user asked to see every warning: ``-v``, ``python -W`` or ``PYTHONWARNINGS``."""
    return verbose or bool(sys.warnoptions) or bool(os.environ.get("PYTHONWARNINGS"))


def silence_dependency_deprecations(verbose: bool = False) -> bool:
    """Install the filter for this process, unless the user asked for warnings; True if installed.

    It wraps :func:`warnings.showwarning` (the last step before stderr) instead of adding
    ``filterwarnings`` entries, because a filter matches a category by subclass and the module by
    name, and neither can say "any deprecation, from anyone but us"."""
    if verbose and not sys.warnoptions and not os.environ.get("PYTHONWARNINGS"):
        warnings.simplefilter("default")  # every warning once per place, DeprecationWarning too
    if asked_for_warnings(verbose) or getattr(warnings.showwarning, "_sparkconsole_quiet", False):
        return False
    shown = warnings.showwarning

    def showwarning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                    file: TextIO | None = None, line: str | None = None) -> None:
        if is_dependency_deprecation(category, filename):
            return
        shown(message, category, filename, lineno, file, line)

    showwarning._sparkconsole_quiet = True  # type: ignore[attr-defined]
    warnings.showwarning = showwarning
    return True


__all__ = ["asked_for_warnings", "is_dependency_deprecation", "silence_dependency_deprecations"]
