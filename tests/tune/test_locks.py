"""Locks (``filelock``): a tuning database held by another process is refused in one line that names the
holder; nested holds in one process share the lock; the device lock serialises, and an ONNX cache's index
lock lets threads take turns."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from opbench import OpBenchError

ROOT = Path(__file__).resolve().parents[2]

HOLDER = """
import sys, time
from opbench.tune.database import database_lock
with database_lock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(60)
"""


def test_a_database_held_by_another_process_is_refused_naming_it(tmp_path):
    from opbench.tune.database import database_lock

    folder = tmp_path / "db"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python")}
    child = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "held"
        with pytest.raises(OpBenchError, match=f"in use by another tuning run \\(process {child.pid}\\)"):
            with database_lock(folder):
                pass
    finally:
        child.kill()
        child.wait()
    with database_lock(folder), database_lock(folder):  # free again; a nested hold shares the lock
        assert (folder / ".opbench-lock.owner").read_text() == f"process {os.getpid()}"
    assert not (folder / ".opbench-lock.owner").exists()


def test_threads_take_turns_on_the_download_cache_index(tmp_path):
    from opbench.models.remoteonnx import _locked

    inside: list[int] = []
    overlaps: list[int] = []

    def work() -> None:
        with _locked(tmp_path):
            inside.append(1)
            if len(inside) > 1:
                overlaps.append(len(inside))
            time.sleep(0.05)
            inside.pop()

    with ThreadPoolExecutor(4) as pool:
        for future in [pool.submit(work) for _ in range(4)]:
            future.result()
    assert not overlaps


def test_a_folder_left_by_a_run_that_stopped_before_tuning_is_tuned_again(tmp_path):
    """A tuning run that stopped after taking the lock and before MetaSchedule wrote a file (the RPC
    device failed to open) leaves the folder with its lock alone: the next run tunes into it; a folder
    with a database file that does not read is still refused, and reading one needs its files."""
    from opbench.tune.database import check_database, database_lock

    folder = tmp_path / "ds.tuning"
    with database_lock(folder):
        pass
    assert folder.is_dir() and not (folder / "database_workload.json").exists()
    check_database(folder, write=True)  # refused as "not a MetaSchedule JSON database" before
    with pytest.raises(OpBenchError, match="not a MetaSchedule JSON database"):
        check_database(folder, write=False)
    (folder / "database_workload.json").write_text("not json\n")
    with pytest.raises(OpBenchError, match="not a MetaSchedule JSON database"):
        check_database(folder, write=True)
