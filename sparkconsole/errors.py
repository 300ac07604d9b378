"""Errors the user can act on.

Anything raised as a :class:`UserError` ends the CLI with its one-line message and the exit code
it carries, never a traceback. Lower layers raise the specific subclasses so the UI can show the
same words.
"""

from __future__ import annotations


class UserError(Exception):
    """A problem the user can fix: printed as one line, exit code ``exit_code``."""

    exit_code: int = 2

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else self.__class__.__name__


class ConfigError(UserError):
    """A cluster inventory that cannot be used (names file, line and key where known)."""


class ValidationError(UserError):
    """A value (model id, container name, path...) that must not reach a shell."""


class TransportError(UserError):
    """A node could not be reached or a command could not be run on it."""

    exit_code = 3


class HostKeyError(TransportError):
    """An unknown or changed SSH host key: never accepted silently."""

    def __init__(self, message: str, host: str = "", fingerprint: str = "") -> None:
        super().__init__(message)
        self.host = host
        self.fingerprint = fingerprint


class ReadOnlyError(UserError):
    """A change was asked for while the console runs read-only."""
