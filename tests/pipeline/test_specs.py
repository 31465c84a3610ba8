"""The jobs' typed specs: ``ModelSpec``, ``MeasureSpec``, ``BackendSpec``, ``CompareJob`` and ``SweepJob`` round-trip
through JSON, their ``validate()`` names the field that is wrong (nested: ``model.name``), the compare job runs
from Python, and a sweep is the same sweep whether its job came from flags or from a spec."""

from __future__ import annotations

import json

import pytest

import opbench
from opbench.pipeline.compare import CompareOptions
from opbench.pipeline.compare_job import CompareJob, run_compare
from opbench.pipeline.compile import BackendSpec
from opbench.pipeline.spec import MeasureSpec, ModelSpec, SpecError
from opbench.pipeline.sweep import SweepJob
from opbench.pipeline.tune import TuneSpec

BRANCHY = "branchy:branches=2,depth=2,channels=4,size=6"


@pytest.mark.parametrize("spec, bad", [
    (ModelSpec(BRANCHY, "simple", 8, "float16", seqlen=64, seed=3),
     [({"batch_size": 0}, "batch_sizes"), ({"dtype": "int4"}, "dtypes"), ({"source": "nowhere"}, "source"),
      ({"name": ""}, "name"), ({"seqlen": 0}, "seqlen"), ({"seed": -1}, "seed"),
      ({"max_download_mb": 0.0}, "max_download_mb")]),
    (MeasureSpec("cuda", warmup=0, repeat=7, min_repeat_ms=1.5, flush_l2=True, corun_limit=50),
     [({"target": "tpu"}, "target"), ({"repeat": 0}, "repeat"), ({"warmup": -1}, "warmup"),
      ({"min_repeat_ms": -2.0}, "min_repeat_ms"), ({"rpc_key": "k"}, "rpc_key"),
      ({"rpc_tracker": "nowhere"}, "rpc_tracker")]),
    (BackendSpec("torch", "fused", cut="blocks", regions=(("a", "b"), ("c",)), compiled=True, combo=True,
                 combo_regions=(0, 2), conv_relu=False, depthwise="taps", piece_ops=40),
     [({"kind": "onnxruntime"}, "kind"), ({"kernels": "cudnn"}, "kernels"), ({"merge": "some"}, "merge"),
      ({"cut": "thin"}, "cut"), ({"trace": "jit"}, "trace"), ({"number": 0}, "number"),
      ({"combo_regions": (0, -1)}, "combo_regions"), ({"combo_regions": ("a",)}, "combo_regions"),
      ({"conv_relu": 1}, "conv_relu"), ({"conv_relu": "yes"}, "conv_relu"), ({"depthwise": "cudnn"}, "depthwise"),
      ({"piece_ops": -1}, "piece_ops"), ({"piece_ops": 4.5}, "piece_ops")]),
    (CompareOptions("sequential,opara", repeat=3, schedule="kept.json", stages=True),
     [({"schedulers": ["fastest"]}, "schedulers"), ({"cost": "guessed"}, "cost"), ({"repeat": 0}, "repeat"),
      ({"sm_partition": "on"}, "sm_partition"), ({"cost": "predicted"}, "predictor"),
      ({"ios_cost": "model,guess"}, "ios_cost"), ({"ios_time_limit_s": 0.0}, "ios_time_limit_s")]),
    (CompareJob(ModelSpec(BRANCHY, "simple"), "llvm", BackendSpec(), CompareOptions(("sequential", "opara"))),
     [({"model": {"source": "nowhere"}}, "model.source"), ({"backend": {"merge": "some"}}, "backend.merge"),
      ({"options": {"repeat": 0}}, "options.repeat"), ({"target": "tpu"}, "target"),
      ({"database": "db", "backend": {"kind": "torch"}}, "database")]),
    (TuneSpec("db", "random", 16, tasks_limit=4, time_limit_s=60.0),
     [({"tuner": "magic"}, "tuner"), ({"trials": 0}, "trials"), ({"tasks_limit": 0}, "tasks_limit"),
      ({"time_limit_s": -1.0}, "time_limit_s"), ({"database": " "}, "database")]),
    (SweepJob(opbench.CollectJob(models=("a", "b"), source="simple", batch_sizes=(1, 8)), point_timeout_s=60.0,
              flags=("--cache-dir", "c")),
     [({"point_timeout_s": 0.0}, "point_timeout_s"), ({"job": {"repeat": 0}}, "job.repeat"),
      ({"job": {"dtypes": []}}, "job.dtypes")]),
])
def test_every_spec_round_trips_and_names_the_bad_field(spec, bad, tmp_path):
    spec.validate()
    kind = type(spec)
    assert kind.from_json(json.dumps(spec.to_json())) == spec
    spec.save(tmp_path / "spec.json")
    assert kind.load(tmp_path / "spec.json") == spec
    for change, field in bad:
        data = spec.to_json()
        for key, value in change.items():  # a nested spec's change keeps its other fields
            data[key] = {**data[key], **value} if isinstance(value, dict) else value
        with pytest.raises(SpecError) as err:
            kind.from_json(data).validate()
        assert err.value.field == field, (change, err.value)
    with pytest.raises(SpecError) as err:
        kind.from_json({**spec.to_json(), "colour": "red"})
    assert err.value.field == "colour"


def test_a_spec_holding_an_object_says_it_does_not_go_to_json(tmp_path):
    with pytest.raises(TypeError, match="object does not go to JSON"):
        TuneSpec(tmp_path, tuner=object()).to_json()
    assert TuneSpec(tmp_path).to_json()["database"] == str(tmp_path)  # a path goes as its text


def test_a_nested_spec_of_the_wrong_type_names_its_field():
    with pytest.raises(SpecError) as err:
        CompareJob.from_json({"model": {"batch_size": "eight"}})
    assert err.value.field == "model.batch_size"
    with pytest.raises(SpecError) as err:
        SweepJob.from_json({"job": ["resnet-18"]})
    assert err.value.field == "job"


def test_the_collect_job_names_its_models_and_its_measurement():
    job = opbench.CollectJob(models=("a", "b"), source="simple", batch_sizes=(1, 8), dtypes=("float16",), repeat=4,
                             corun=True, corun_limit=30, target="cuda")
    assert [(m.name, m.batch_size, m.dtype) for m in job.model_specs()] == \
        [("a", 1, "float16"), ("a", 8, "float16"), ("b", 1, "float16"), ("b", 8, "float16")]
    assert [(p.model, p.batch, p.dtype) for p in SweepJob(job).points()] == \
        [(m.name, m.batch_size, m.dtype) for m in job.model_specs()]
    measure = job.measure_spec()
    assert (measure.target, measure.repeat, measure.corun_limit) == ("cuda", 4, 30)
    assert measure.timing().repeat == 4
    assert opbench.CollectJob(models=("a",)).measure_spec().corun_limit == 0  # co-runs only when asked for


def test_model_spec_loads_the_workload_it_names():
    workload = ModelSpec(BRANCHY, "simple", 2).load_workload()
    assert (workload.name, workload.batch_size, workload.dtype) == ("branchy", 2, "float32")
    with pytest.raises(SpecError, match="name"):
        ModelSpec("no-such-model", "local").load_workload()


def test_measure_spec_makes_the_local_profiler_on_the_cpu():
    from opbench.profile import Profiler

    profiler = MeasureSpec("llvm").profiler()
    assert isinstance(profiler, Profiler) and profiler.corun_limit == 0


def test_the_compare_job_runs_from_python():
    """``opbench.compare(job)``: the same comparison ``opbench compare`` prints, with its phases."""
    job = CompareJob(ModelSpec(BRANCHY, "simple"), "llvm", options=CompareOptions(("sequential", "greedy"), repeat=2,
                                                                                   number=2))
    result = opbench.compare(job)
    assert [r["schedule"] for r in result.rows] == ["sequential", "greedy"]
    assert sum(r["kept"] for r in result.rows) == 1 and result.kept.name in ("sequential", "greedy")
    assert {"operator_times_s", "scheduling_s", "measuring_s", "critical_path_s"} <= set(result.phases)
    assert result.workload.name == "branchy" and result.bound["sum_ms"] > 0
    with pytest.raises(SpecError, match="backend.merge"):
        run_compare(CompareJob(backend=BackendSpec(merge="most")))


def test_a_sweeps_identity_is_its_job_not_its_flags(tmp_path):
    """Two spellings of one job are one sweep (the same state file); a job that differs beyond its points is
    another sweep, refused on the first one's state."""
    from opbench.cli.collect_job import job_from_args
    from opbench.cli.main import _subcommands, build_parser
    from opbench.errors import OpBenchError
    from opbench.pipeline.sweep import check_state

    def job(*argv: str):
        parser = build_parser()
        _subcommands(parser)
        return job_from_args(parser.parse_args(["collect", "--modelsource", "simple", *argv]))

    one = SweepJob(job("--modelname", "a,b", "--repeat", "3", "--target", "llvm"))
    two = SweepJob(job("--target=llvm", "--repeat=3", "--modelname", "a", "--batchsize", "1,2"))
    other = SweepJob(job("--modelname", "a,b", "--repeat", "4"))
    assert one.identity() == two.identity() != other.identity()
    assert one.state_file(tmp_path / "d.sqlite") == two.state_file(tmp_path / "d.sqlite")
    state = one.state_file(tmp_path / "d.sqlite")
    state.write_text(json.dumps({"points": {}, "command": one.identity(), "format": "opbench-sweep-state"}))
    assert check_state(state, two.identity()) == json.loads(state.read_text())
    with pytest.raises(OpBenchError, match="is the state of another sweep"):
        check_state(state, other.identity())
