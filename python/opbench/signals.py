"""Interrupts that are never lost: Ctrl-C (SIGINT) and SIGTERM stop a run as "interrupted".

TVM runs Python callbacks inside its C++ passes; a ``KeyboardInterrupt`` raised in one of them can
be turned into another error or swallowed by the pass, and the run would go on with a different
graph. :func:`install` records the signal before raising, and the jobs call :func:`check` between
phases, so a swallowed interrupt still stops the run.
"""

from __future__ import annotations

import signal
from typing import Any

_received: list[int] = []


def _handler(signum: int, _frame: Any) -> None:
    _received.append(signum)
    raise KeyboardInterrupt


def install() -> None:
    """Handle SIGINT and SIGTERM by recording them and raising ``KeyboardInterrupt``."""
    _received.clear()
    signal.signal(signal.SIGINT, _handler)
    signal.signal(signal.SIGTERM, _handler)


def received() -> int | None:
    """The first signal received since :func:`install` (None if none)."""
    return _received[0] if _received else None


def check() -> None:
    """Raise ``KeyboardInterrupt`` if a signal arrived (even if an earlier raise was swallowed)."""
    if _received:
        raise KeyboardInterrupt
