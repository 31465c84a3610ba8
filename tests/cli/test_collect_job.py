"""``CollectJob``: the collection as a typed spec, ``opbench collect --config job.json`` and the flags giving
the same job, and a bad job file refused in one line before any work."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _parse(argv: list[str]):
    """``collect``'s parsed flags, through the same path as ``opbench`` (a --config fills in the defaults)."""
    from opbench.cli.collect_job import apply_config, config_path
    from opbench.cli.main import _subcommands, build_parser

    parser = build_parser()
    path = config_path(argv)
    if path:
        apply_config(_subcommands(parser)["collect"], path)
    return parser.parse_args(["collect", *argv])


def test_the_spec_round_trips_and_names_its_fields(tmp_path):
    from opbench.pipeline import CollectJob
    from opbench.pipeline.spec import SpecError

    job = CollectJob(models=("googlenet", "resnet-50"), target="cuda", dtypes=("float16",), batch_sizes=(1, 8),
                     devices=(0, 1), tune=True, trials=32, compare=True, schedulers=("sequential", "opara"))
    job.validate()
    assert CollectJob.from_json(json.dumps(job.to_json())) == job
    job.save(tmp_path / "job.json")
    assert CollectJob.load(tmp_path / "job.json") == job
    for bad, field in [({"repeat": 0}, "repeat"), ({"dtypes": ["int4"]}, "dtypes"), ({"batch_sizes": [0]},
                       "batch_sizes"), ({"tuner": "magic"}, "tuner"), ({"schedulers": ["fastest"]}, "schedulers"),
                       ({"cost": "guessed"}, "cost"), ({"source": "nowhere"}, "source"),
                       ({"devices": [1, 1]}, "devices"), ({"rpc_key": "k"}, "rpc_key"),
                       ({"min_repeat_ms": -1.0}, "min_repeat_ms")]:
        with pytest.raises(SpecError) as err:
            CollectJob.from_json({**job.to_json(), **bad}).validate()
        assert err.value.field == field
    with pytest.raises(SpecError, match="trials"):
        CollectJob.from_json({"trials": "many"})


def test_config_and_flags_give_the_same_job(tmp_path):
    from opbench.cli.collect_job import job_from_args
    from opbench.pipeline import CollectJob

    flags = ["--modelsource", "simple", "--modelname", "branchy:branches=2,depth=2,matmul:n=64", "--dtype",
             "fp16,float32", "--batchsize", "1,8", "--target", "cuda", "--repeat", "7", "--no-check", "--iftune",
             "true", "--trials", "16", "--ifcompare", "true", "--schedulers", "sequential,greedy", "--devices", "0,1",
             "--dataset", str(tmp_path / "d.sqlite")]
    from_flags = job_from_args(_parse(flags))
    assert from_flags.models == ("branchy:branches=2,depth=2", "matmul:n=64")
    assert from_flags.dtypes == ("float16", "float32") and from_flags.batch_sizes == (1, 8)
    assert not from_flags.check and from_flags.tune and from_flags.compare and from_flags.devices == (0, 1)
    from_flags.save(tmp_path / "job.json")
    from_config = job_from_args(_parse(["--config", str(tmp_path / "job.json")]))
    assert from_config == from_flags
    # a flag given beside the file overrides its field, the rest comes from the file
    overridden = job_from_args(_parse(["--config", str(tmp_path / "job.json"), "--repeat", "3"]))
    assert overridden.repeat == 3 and overridden.models == from_flags.models
    assert job_from_args(_parse(["--modelname", "resnet-18"])) == CollectJob(models=("resnet-18",))  # the defaults


def test_a_toml_config_gives_the_same_job_as_json(tmp_path):
    from opbench.cli.collect_job import job_from_args
    from opbench.pipeline.spec import SpecError

    (tmp_path / "job.toml").write_text('models = ["matmul:n=64", "googlenet"]\nsource = "simple"\n'
                                       'dtypes = ["float16"]\nbatch_sizes = [1, 8]\nrepeat = 7\ntune = true\n')
    job = job_from_args(_parse(["--config", str(tmp_path / "job.toml")]))
    assert job.models == ("matmul:n=64", "googlenet") and job.batch_sizes == (1, 8) and job.repeat == 7 and job.tune
    job.save(tmp_path / "job.json")
    assert job_from_args(_parse(["--config", str(tmp_path / "job.json")])) == job
    (tmp_path / "bad.toml").write_text("models = [\n")
    from opbench.pipeline import CollectJob

    with pytest.raises(SpecError, match="not TOML"):
        CollectJob.load(tmp_path / "bad.toml")


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python")}
    return subprocess.run([sys.executable, "-m", "opbench", "collect", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("text, message", [
    ('{"models": ["matmul:n=32"], "repeat": 0}', "repeat: must be 1 or more"),
    ('{"modls": ["matmul"]}', "modls: unknown field of CollectJob"),
    ('{"models": "matmul"}', "models: a list is needed"),
    ("[1, 2]", "a JSON object is needed"),
])
def test_a_bad_job_file_is_one_line_and_exit_2_before_any_work(tmp_path, text, message):
    job = tmp_path / "job.json"
    job.write_text(text)
    proc = _cli("--config", str(job), "--dataset", str(tmp_path / "d.sqlite"), cwd=tmp_path)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert message in proc.stderr and str(job) in proc.stderr
    assert not (tmp_path / "d.sqlite").exists()


def test_collect_runs_the_job_of_a_config_file(tmp_path):
    pytest.importorskip("tvm")
    from opbench.pipeline import CollectJob

    dataset = tmp_path / "d.sqlite"
    CollectJob(models=("matmul:n=32",), source="simple", repeat=3, dataset=str(dataset)).save(tmp_path / "job.json")
    proc = _cli("--config", str(tmp_path / "job.json"), "-q", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    with sqlite3.connect(dataset) as conn:
        rows = conn.execute("SELECT model, source, repeats FROM operators").fetchall()
    assert rows and all(r[:2] == ("matmul", "simple") for r in rows)
    assert all(r[2] == 3 for r in rows)  # the file's repeat, not the flag's default 10


def test_opbench_collect_runs_a_job_in_this_process(tmp_path):
    pytest.importorskip("tvm")
    import opbench
    from opbench.pipeline.spec import SpecError

    dataset = tmp_path / "d.sqlite"
    summary = opbench.collect(opbench.CollectJob(models=("matmul:n=32",), source="simple", repeat=2,
                                                 dataset=str(dataset)))
    assert summary["model"] == "matmul" and summary["source"] == "simple" and "exit" not in summary
    with sqlite3.connect(dataset) as conn:
        assert conn.execute("SELECT COUNT(*), MIN(repeats) FROM operators").fetchone() == (1, 2)
    with pytest.raises(SpecError, match="repeat"):
        opbench.collect(opbench.CollectJob(repeat=0, dataset=str(tmp_path / "other.sqlite")))
    assert not (tmp_path / "other.sqlite").exists()
