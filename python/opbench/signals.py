"""Interrupts that are never lost: Ctrl-C (SIGINT) and SIGTERM stop a run as "interrupted".

TVM runs Python callbacks inside its C++ passes; a ``KeyboardInterrupt`` raised in one of them can
be turned into another error or swallowed by the pass, and the run would go on with a different
graph. :func:`install` records the signal before raising, and the jobs call :func:`check` between
phases, so a swallowed interrupt still stops the run.

Inside MetaSchedule's tuning loop an exception raised at an arbitrary point (while its C++ search
runs a parallel loop, say) ends the process in ``std::terminate``. There the jobs use
:func:`deferred`: a signal is only recorded, and :func:`check` raises it at the loop's safe points
(the builder between two candidates, the runner between two measurements, the trial recorder
after a batch is written), from which the exception unwinds cleanly.

:func:`exiting` covers the last moments of a process: once the job has returned, a signal writes
one line and ends the process with 128 + the signal's number, instead of a traceback from an
interpreter that is shutting down.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from typing import Any

_received: list[int] = []
_deferring: list[bool] = []
SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _handler(signum: int, _frame: Any) -> None:
    _received.append(signum)
    if not _deferring:
        raise KeyboardInterrupt


def install() -> None:
    """Handle SIGINT and SIGTERM by recording them and raising ``KeyboardInterrupt``.

    Also registers :func:`_last_moments` with ``atexit``, early, so that it runs after the exit handlers
    of what is imported later (worker pools): from then on the process is only finishing its exit.
    """
    startup = sys.modules.get("opbench._startup")  # a command's first import (opbench._startup) records signals
    if startup is not None:
        _received[:] = startup.pending  # a signal received while the command started is :func:`check`'s to raise
        startup.pending.clear()
    _deferring.clear()
    for signum in SIGNALS:
        signal.signal(signum, _handler)
    if not _registered:
        _registered.append(True)
        atexit.register(_last_moments)


_registered: list[bool] = []


def _last_moments() -> None:
    """The interpreter's last moments: Python resets its signal handlers to the default ones while it
    shuts down, after which a Ctrl-C would kill the process (exit -2, no message) although every
    measurement is saved. A signal now is ignored: the process ends with its own status."""
    for signum in SIGNALS:
        with contextlib.suppress(ValueError, OSError):
            signal.signal(signum, signal.SIG_IGN)


def received() -> int | None:
    """The first signal received since :func:`install` (None if none)."""
    return _received[0] if _received else None


def check() -> None:
    """Raise ``KeyboardInterrupt`` if a signal arrived (even if an earlier raise was swallowed)."""
    if _received:
        raise KeyboardInterrupt


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Within the block a signal is recorded but not raised; :func:`check` raises it (module docstring).

    On leaving the block a signal that arrived inside it is raised.
    """
    _deferring.append(True)
    try:
        yield
    finally:
        _deferring.pop()
    check()


def forget_handled_interrupt() -> None:
    """Tell the interpreter that the interrupt it saw was handled, so that the process exits with its own status.

    CPython marks a ``KeyboardInterrupt`` that leaves any ``exec`` or ``eval`` of a string as unhandled (a library
    creating a dataclass or a named tuple while the signal arrives, say), even when the command catches it later;
    under ``python -m`` the interpreter then ends the process with SIGINT at exit (status -2, no message) instead
    of the status the command chose. Every ``exec`` of a string clears that mark before it runs, so an empty one
    clears it. Before this, 6 of 155 ``python -m opbench collect`` starts interrupted 0-2 s into loading the model
    ended so.
    """
    exec("", {})


def exiting(message: str) -> None:
    """From now on a signal writes ``message`` and ends the process at once with 128 + its number."""

    def handler(signum: int, _frame: Any = None) -> None:
        with contextlib.suppress(Exception):
            sys.stderr.write(message + "\n")
            sys.stderr.flush()
        os._exit(128 + signum)

    _deferring.append(True)  # while the handlers change, the old one records without raising
    seen = len(_received)
    for signum in SIGNALS:
        signal.signal(signum, handler)
    if len(_received) > seen:  # one arrived while they changed
        handler(_received[-1])
