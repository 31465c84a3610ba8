"""The first import of every OpBench command (``opbench``, ``python -m opbench``, the OpBench-compatible
``op_performance_collector.py``).

Importing this module records SIGINT and SIGTERM instead of raising them: a ``KeyboardInterrupt`` inside
an import would end the command with a traceback. :func:`opbench.signals.install` takes the recorded
signals over, so that a Ctrl-C while the command's modules import stops it at once with its one
"interrupted" line. The handlers are in place before this module's import ends (it imports only the
standard library), so no moment after it is left uncovered; a library user never imports it.
"""

from __future__ import annotations

import signal
from typing import Any

#: signals received before :func:`opbench.signals.install` took over
pending: list[int] = []


def _record(signum: int, _frame: Any) -> None:
    pending.append(signum)


for _signum in (signal.SIGINT, signal.SIGTERM):
    try:
        signal.signal(_signum, _record)
    except (ValueError, OSError):  # not the main thread: nothing to install
        pass
