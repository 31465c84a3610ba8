"""The tuning database: MetaSchedule's JSON database in a folder beside the dataset, and the best
record of each task applied to a build.

The folder (``--database DIR``; default ``<dataset>.tuning/`` next to the dataset file) holds
``database_workload.json`` and ``database_tuning_record.json`` exactly as MetaSchedule writes them,
so TVM itself can reuse it (``ms.database.JSONDatabase(work_dir=DIR)``). A folder may ship them
gzipped (``database_workload.json.gz``, as ``data/tuning/`` does to stay small): the first use
unpacks them beside the ``.gz`` files. What a build applies is
a selection: the fastest valid record of each task of the model, for this target; its digest
becomes the rows' ``config`` (``db:<digest>``), so tuned and default rows live side by side.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import json
import logging
import os
import shutil
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import OpBenchError
from ..utils import digest
from .knobs import dumps

log = logging.getLogger(__name__)
FAILED_S = 1e9  # MetaSchedule stores a failed candidate as run_secs [1e10]


def default_database_dir(dataset: str | Path) -> Path:
    """``<dataset without suffix>.tuning`` beside the dataset file."""
    path = Path(dataset)
    return path.with_name(path.stem + ".tuning")


DATABASE_FILES = ("database_workload.json", "database_tuning_record.json")


def unpack(folder: Path) -> None:
    """Unpack ``<file>.gz`` into ``<file>`` for each database file that exists only gzipped."""
    for name in DATABASE_FILES:
        plain, packed = folder / name, folder / f"{name}.gz"
        if plain.exists() or not packed.exists():
            continue
        partial = folder / f".{name}.partial"
        try:
            with gzip.open(packed, "rb") as src, open(partial, "wb") as dst:
                shutil.copyfileobj(src, dst)
            os.replace(partial, plain)
        except (OSError, EOFError) as err:
            partial.unlink(missing_ok=True)
            raise OpBenchError(f"cannot unpack tuning database file {str(packed)!r}: "
                               f"{getattr(err, 'strerror', None) or err}") from None
        log.info("unpacked %s", plain)


def open_database(folder: str | Path, create: bool = True) -> Any:
    """MetaSchedule's JSON database in ``folder`` (created when missing, with ``create``)."""
    from tvm.s_tir.meta_schedule.database import JSONDatabase

    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise OpBenchError(f"--database {str(folder)!r} is not a folder")
    if not folder.exists():
        if not create:
            raise OpBenchError(f"tuning database not found: {str(folder)!r}")
        try:
            folder.mkdir(parents=True)
        except OSError as err:
            raise OpBenchError(f"cannot create tuning database {str(folder)!r}: {err.strerror}") from None
    unpack(folder)
    for name in DATABASE_FILES:  # a link would make us read (and quote) a file that is not ours
        if (folder / name).is_symlink() or ((folder / name).exists() and not (folder / name).is_file()):
            raise OpBenchError(f"tuning database file {str(folder / name)!r} is not a regular file (a link or a "
                               "folder; accepted: the files MetaSchedule writes)")
    from ..runtime.startup import import_tensor_intrinsics

    import_tensor_intrinsics()  # records of tensor-core schedules name TVM's tensor intrinsics
    try:
        return JSONDatabase(work_dir=str(folder), allow_missing=create)
    except Exception as err:  # a corrupt or foreign file: say which, never what it holds
        raise OpBenchError(f"cannot read tuning database {str(folder)!r}: its files are not a MetaSchedule JSON "
                           f"database ({type(err).__name__}; accepted: database_workload.json and "
                           "database_tuning_record.json as MetaSchedule writes them)") from None


def check_database(folder: str | Path, write: bool) -> None:
    """Refuse, before any work, a database that cannot serve: one to be written (tuning) must be a
    writable folder or one that can be created; one that exists must read as a MetaSchedule database."""
    folder = Path(folder)
    if folder.exists():
        if not folder.is_dir():
            raise OpBenchError(f"--database {str(folder)!r} is not a folder")
        files = [folder] + [folder / n for n in DATABASE_FILES if (folder / n).exists()]
        if write and not all(os.access(f, os.W_OK) for f in files):
            raise OpBenchError(f"tuning database {str(folder)!r} is not writable (tuning adds its records there; "
                               "use --database DIR for another folder)")
        if write:  # a run that holds it may be writing it now: say so, rather than that it does not read
            with database_lock(folder):
                pass
        stored = [n for n in DATABASE_FILES if (folder / n).exists() or (folder / f"{n}.gz").exists()]
        if write and not stored:  # new, or left by a run that stopped before tuning (its lock alone): tuning
            return  # writes the files
        open_database(folder, create=False)  # a corrupt or foreign file is refused here
        return
    if not write:
        raise OpBenchError(f"tuning database not found: {str(folder)!r} (tune first with --iftune true)")
    parent = next((p for p in folder.absolute().parents if p.exists()), Path("/"))
    if not (parent.is_dir() and os.access(parent, os.W_OK)):
        raise OpBenchError(f"cannot create tuning database {str(folder)!r}: {str(parent)!r} is not a writable "
                           "folder (use --database DIR)")


class WriteCheck:
    """Checks that MetaSchedule's writes to a database folder arrived whole.

    Its JSON database appends one line per record and does not report a failed write: on a full
    disk a record is cut short, or missing, and the file no longer reads. :meth:`check` is given
    how many records this run has committed so far; a records file that gained fewer lines, or
    a file that ends inside a line, is cut back to its last whole line (so that it reads again) and
    raises a one-line error naming the file.
    """

    def __init__(self, folder: str | Path) -> None:
        self.records = Path(folder) / DATABASE_FILES[1]
        self.workloads = Path(folder) / DATABASE_FILES[0]
        self.start = self.records.stat().st_size if self.records.exists() else 0

    def check(self, committed: int) -> None:
        for path in (self.workloads, self.records):
            if path.exists() and not _ends_whole(path):
                _cut_to_last_line(path)
                raise OpBenchError(f"cannot write tuning database file {str(path)!r}: a record was cut short (is the "
                                   "disk full?); the partial record was removed, earlier records and every trial "
                                   "row are kept")
        lines = 0
        if self.records.exists():
            with open(self.records, "rb") as handle:
                handle.seek(self.start)
                for chunk in iter(lambda: handle.read(1 << 20), b""):
                    lines += chunk.count(b"\n")
        if lines < committed:
            raise OpBenchError(f"cannot write tuning database file {str(self.records)!r}: {committed - lines} of "
                               f"{committed} records of this run are missing (is the disk full?); every trial row "
                               "is kept")


def _ends_whole(path: Path) -> bool:
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        if handle.tell() == 0:
            return True
        handle.seek(-1, os.SEEK_END)
        return handle.read(1) == b"\n"


def _cut_to_last_line(path: Path) -> None:
    """Truncate ``path`` after its last newline (everything, if it has none)."""
    with open(path, "rb+") as handle:
        end = handle.seek(0, os.SEEK_END)
        pos = end
        while pos > 0:
            step = min(1 << 16, pos)
            handle.seek(pos - step)
            chunk = handle.read(step)
            found = chunk.rfind(b"\n")
            if found >= 0:
                handle.truncate(pos - step + found + 1)
                return
            pos -= step
        handle.truncate(0)


_held: dict[Path, list[Any]] = {}  # database folder -> [its FileLock, holders in this process]


@contextlib.contextmanager
def database_lock(folder: str | Path) -> Iterator[None]:
    """Hold the tuning database ``folder`` for one tuning run (the folder is created).

    MetaSchedule's JSON files are read once when a run opens them and appended to as it goes, so
    two runs on one folder would list the same workload twice and number their records apart: a
    second run, from another process, is refused in one line while the first holds the folder.
    Nested holds in one process share the lock.
    """
    from filelock import FileLock, Timeout

    folder = Path(folder)
    owner = folder / ".opbench-lock.owner"  # who holds it (the lock file itself is the library's)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        key = folder.resolve()
        if key not in _held:
            lock = FileLock(folder / ".opbench-lock")
            try:
                lock.acquire(timeout=0)
            except Timeout:
                try:
                    holder = owner.read_text().strip() or "another process"
                except OSError:
                    holder = "another process"
                raise OpBenchError(f"tuning database {str(folder)!r} is in use by another tuning run ({holder}); "
                                   "wait for it to finish, or tune into another --database") from None
            owner.write_text(f"process {os.getpid()}")
            _held[key] = [lock, 0]
    except OSError as err:
        raise OpBenchError(f"cannot use tuning database {str(folder)!r}: {err.strerror}") from None
    _held[key][1] += 1
    try:
        yield
    finally:
        _held[key][1] -= 1
        if not _held[key][1]:
            lock = _held.pop(key)[0]
            with contextlib.suppress(OSError):
                owner.unlink()
            lock.release()


def valid_secs(record: Any) -> list[float] | None:
    """A record's run times, or None for a failed candidate."""
    secs = [float(s) for s in (record.run_secs or [])]
    return secs if secs and max(secs) < FAILED_S else None


def records_for(database: Any, mod: Any) -> list[Any]:
    """Every record of ``mod`` (a task's module) in the database, failed ones included."""
    if not database.has_workload(mod):
        return []
    workload = database.commit_workload(mod)
    return [r for r in database.get_all_tuning_records() if r.workload.same_as(workload)]


def same_target(record: Any, target: Any) -> bool:
    """Whether a record was measured for ``target`` (kind and architecture or CPU)."""
    if record.target is None:
        return True
    a, b = json.loads(str(record.target)), json.loads(str(target))
    return all(a.get(k) == b.get(k) for k in ("kind", "arch", "mcpu"))


@dataclasses.dataclass
class Applied:
    """What a build applies: a database of the chosen records and the rows' ``config``."""

    database: Any
    config: str
    tasks: dict[str, float]  # task name -> best measured seconds (MetaSchedule's runner)


def applied_database(folder: str | Path, tasks: list[Any], target: Any, exclude: set[str] | None = None
                     ) -> Applied | None:
    """The best valid record for this target of each extracted task, as an in-memory database.

    Returns None when no task has one (the build then uses default schedules). ``exclude`` names
    tasks whose tuned kernel must not be used (measured slower than the default one).
    """
    from tvm.s_tir.meta_schedule.database import MemoryDatabase

    source = open_database(folder, create=False)
    chosen = MemoryDatabase()
    picked: dict[str, float] = {}
    parts = []
    other_target = 0
    for task in tasks:
        if exclude and task.task_name in exclude:
            continue
        mod = task.dispatched[0]
        best = None
        for record in records_for(source, mod):
            secs = valid_secs(record)
            if secs is None:
                continue
            if not same_target(record, target):
                other_target += 1
                continue
            if best is None or statistics.median(secs) < statistics.median(valid_secs(best)):
                best = record
        if best is None:
            continue
        from tvm.s_tir.meta_schedule.database import TuningRecord

        workload = chosen.commit_workload(mod)
        chosen.commit_tuning_record(TuningRecord(best.trace, workload, best.run_secs, best.target, best.args_info))
        picked[task.task_name] = statistics.median(valid_secs(best))
        parts.append([task.task_name, dumps(best.trace)])
    if other_target and not picked:
        raise OpBenchError(f"tuning database {str(folder)!r} holds records for another target only "
                           f"(this target: {target}); tune for this target or use another --database")
    if not picked:
        return None
    return Applied(chosen, "db:" + digest(sorted(parts)), picked)
