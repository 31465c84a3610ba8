"""The shipped records folder (``data/dataset/``): it matches its manifest, reads back whole, and every
record belongs to a task of the folder with the task's target and precision."""

from __future__ import annotations

import json

import pytest

from ..helpers import ROOT

pytest.importorskip("pyarrow")
FOLDER = ROOT / "data" / "dataset"


def test_the_shipped_records_match_their_manifest_and_their_tasks():
    from opbench.dataset import records

    meta = records.manifest(FOLDER)  # each file's SHA-256 checked
    trials, tasks = records.read_rows(FOLDER), records.read_rows(FOLDER, "tasks")
    assert len(trials) == meta["records"] > 0 and len(tasks) == meta["tasks"]
    by_key = {t["workload_id"]: t for t in tasks}
    for row in trials:
        task = by_key[row["workload_id"]]  # never a record of a task the folder does not describe
        assert row["dtype"] == task["dtype"] and row["tuner"] == "sample"
        assert row["model"] == task["task"] and row["source"] == "task"
        insts, decisions = json.loads(row["trace"])
        assert insts and isinstance(decisions, list)
    assert sum(f["bytes"] for f in meta["files"]) <= 24 * 2**20  # the repository's budget for shipped records
    assert all(f["bytes"] <= records.MAX_FILE_BYTES for f in meta["files"])


def test_a_sampled_rows_config_names_its_timer_and_gives_it_back():
    from opbench.dataset.records import TIMERS, sample_config, timer_of

    assert sample_config(0) == "sample:s0" and sample_config(3, "graph") == "sample:s3:graph"
    assert [timer_of(sample_config(1, t)) for t in TIMERS] == list(TIMERS)
    assert timer_of("default") == timer_of("db:abc") == timer_of(None) == "evaluator"  # rows of other jobs


def test_the_card_figures_add_up_on_the_shipped_records():
    """scripts/card_stats.py (the dataset card's figures): every build error has a named cause, the causes and
    statuses add up to the records, and the tasks with records are among the tasks stored."""
    import sys

    sys.path.insert(0, str(ROOT / "scripts"))
    import card_stats

    assert card_stats.cause("RuntimeError: NVRTC compilation failed: x") == "CUDA compiler (NVRTC) error"
    assert card_stats.cause("Check failed: lanes % 2 == 0") == "odd half-precision vector lanes"
    assert card_stats.cause("Check failed: (eval_vec_) is false") == "TVM lowering check"
    assert card_stats.cause("something new") == "other"
    figures = card_stats.card(str(FOLDER))
    assert sum(figures["by_status"].values()) == figures["records"] == sum(figures["records_by_dtype"].values())
    assert "other" not in figures["build_errors_by_cause"]
    causes = figures["build_errors_by_cause"].values()
    assert sum(sum(c.values()) for c in causes) == figures["by_status"]["build_error"]
    assert figures["tasks_with_records"] == sum(figures["tasks_with_records_by_dtype"].values())
    assert figures["tasks_with_records"] <= figures["tasks_stored"]
    assert 0 < figures["steady_share"] <= 1 and figures["audit"]["n"] > 0
