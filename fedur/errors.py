"""The errors a user can cause, under one base class.

Every error a user can fix (the settings, the data, the model's files, the run directory, a plugin of their own)
is a `FedurError`: fedur's entry points catch that one class, and rank 0 prints its message as one line,
`fedur: error: <message>`, and exits with status 2 (the other ranks exit quietly). A new error class derives
from `FedurError` (and, where callers expect it, from the built-in it refines: `ValueError`, `TypeError`), so it
cannot slip into a traceback by being left off a list. `tests/test_errors.py` walks every `raise` in fedur:
one of a built-in exception must say why it is not the user's to fix (`# internal: ...` on its line).

Errors of the machine (a peer rank that died, a full disk, device memory) are not here: the entry point reports
each in one line of its own (fedur/main.py).
"""

from __future__ import annotations


class FedurError(Exception):
    """Something the user can fix; the message says what and how, in one line."""

    def one_line(self) -> str:
        """The message as the entry point prints it: one line, whitespace folded."""
        return " ".join(str(self).split())


class ConfigError(FedurError, ValueError):
    """Settings do not fit together, or one of them cannot hold; the message names the keys."""


class CommandLineError(FedurError):
    """The command line or a settings file cannot be parsed; the message says what to write instead."""


class PluginError(FedurError, TypeError):
    """A method, labeller or dataset of the user's own breaks the contract fedur calls it by (a hook's return
    value, what its state may hold); the message names the class and the hook."""
