"""A job's row in the ``runs`` table: started when the job starts, finished with its status."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

from .. import signals
from ..dataset import Dataset


@dataclasses.dataclass
class RunState:
    """The run's id and the status it will be finished with (``failed`` unless the job says otherwise)."""

    run_id: int
    status: str = "failed"


@contextlib.contextmanager
def recorded_run(dataset: Dataset, command: str, tags: dict[str, Any]) -> Iterator[RunState]:
    """Record a run; it ends ``interrupted`` on Ctrl-C or SIGTERM (even one TVM swallowed), else with the
    status the job set (``ok``, ``partial``), or ``failed`` if the job raised."""
    state = RunState(dataset.start_run(command, tags))
    try:
        yield state
    except BaseException as err:
        state.status = "interrupted" if isinstance(err, KeyboardInterrupt) or signals.received() else "failed"
        raise
    finally:
        dataset.finish_run(state.run_id, state.status)
