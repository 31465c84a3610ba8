"""The shipped records folder (``data/dataset/``): it matches its manifest, reads back whole, and every
record belongs to a task of the folder with the task's target and precision."""

from __future__ import annotations

import json

import pytest

from ..helpers import ROOT

pytest.importorskip("pyarrow")
FOLDER = ROOT / "data" / "dataset"


@pytest.fixture(scope="module")
def shipped():
    """The shipped folder's trials and tasks, read once (each file's SHA-256 checked)."""
    from opbench.dataset import records

    return records.read_rows(FOLDER), records.read_rows(FOLDER, "tasks")


def test_the_shipped_records_match_their_manifest_and_their_tasks(shipped):
    from opbench.dataset import records

    meta = records.manifest(FOLDER)  # each file's SHA-256 checked
    trials, tasks = shipped
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


def test_derived_columns_are_left_out_only_where_they_can_be_computed_again(shipped, tmp_path):
    """A records file leaves out latency_median_s and spread where every row's equal its samples' median and
    spread; a row measured otherwise keeps them in its file; both read back as stored; a folder of the first
    format reads, one of an unknown format is refused."""
    import pyarrow.parquet as pq

    from opbench.dataset import records
    from opbench.dataset.schema import TABLES
    from opbench.dataset.store import Dataset
    from opbench.errors import OpBenchError

    trials, tasks = shipped
    rows = [dict(r) for r in trials if r["build_status"] == "ok"][:5] + \
        [dict(r) for r in trials if r["build_status"] != "ok"][:1]
    rows[0]["latency_median_s"] *= 1.5  # not its samples' median: must be stored as it is
    assert records.derived(json.loads(rows[1]["run_secs"])) == {k: rows[1][k] for k in records.DERIVED}
    assert records.derived(None) == {"latency_median_s": None, "spread": None}
    keys = {r["workload_id"] for r in rows}
    columns = {t: {c for c, _ in TABLES[t][0]} for t in ("tasks", "trials")}
    with Dataset(tmp_path / "d.sqlite") as dataset:
        run = dataset.start_run("test", {})
        dataset.put_many("tasks", [{**{k: v for k, v in t.items() if k in columns["tasks"]}, "run_id": run}
                                   for t in tasks if t["workload_id"] in keys])
        dataset.put_many("trials", [{**{k: v for k, v in r.items() if k in columns["trials"]}, "run_id": run}
                                    for r in rows])
        dataset.finish_run(run, "ok")
    folder = tmp_path / "records"
    meta = records.pack(tmp_path / "d.sqlite", folder, max_file_bytes=1)  # one row per file
    assert meta["format"] == records.FORMAT
    names = [f["name"] for f in meta["files"] if f["name"].startswith("records-")]
    kept = [n for n in names if set(records.DERIVED) <= set(pq.read_schema(folder / n).names)]
    assert len(names) == len(rows) and len(kept) == 1  # the altered row's file alone
    back = {(r["workload_id"], r["trial"]): r for r in records.read_rows(folder)}
    for row in rows:
        got = back[(row["workload_id"], row["trial"])]
        assert {k: got[k] for k in records.DERIVED} == {k: row[k] for k in records.DERIVED}
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps({**manifest, "format": "opbench-records/1"}))
    assert len(records.read_rows(folder)) == len(rows)
    (folder / "manifest.json").write_text(json.dumps({**manifest, "format": "opbench-records/9"}))
    with pytest.raises(OpBenchError, match="accepted: opbench-records/1, opbench-records/2"):
        records.read_rows(folder)


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
