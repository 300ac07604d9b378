"""A small POSIX ``sh`` for the simulated node: :mod:`.parse` (grammar), :mod:`.expand`
(word expansion), :mod:`.interp` (execution, builtins, processes, redirections)."""
