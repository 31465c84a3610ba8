"""SM partitions where green contexts are missing: why (no GPU, no cuda-bindings, an old driver), one
INFO line and no error; partitioned schedules still run (and equal sequential) on the CPU."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from opbench import OpBenchError
from opbench.models import load_workload
from opbench.parallel import capturer
from opbench.pipeline.compare import evaluate
from opbench.pipeline.compile import tvm_backend
from opbench.runtime import green
from opbench.runtime.executor import ParallelExecutor
from opbench.schedule import get_scheduler

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def branchy():
    from opbench.runtime import resolve_target

    w = load_workload("simple", "branchy:branches=3,depth=2,channels=8,size=10", 1)
    return tvm_backend(w, resolve_target("llvm"))


@pytest.fixture(autouse=True)
def fresh_reasons(monkeypatch):
    monkeypatch.setattr(green, "_said", set())


class FakeDriver:
    """What ``cuda.bindings.driver`` answers on a machine with a driver of ``version``."""

    def __init__(self, version: int, green_contexts: bool = True) -> None:
        self.version = version
        if green_contexts:
            self.cuGreenCtxCreate = object()

    def cuInit(self, flags):
        return (0,)

    def cuDriverGetVersion(self):
        return (0, self.version)


def _missing():
    raise ImportError("No module named 'cuda'")


@pytest.mark.parametrize("gpu, driver, reason", [
    (False, None, "no CUDA GPU is visible"),
    (True, _missing, "the cuda-bindings package is not installed (pip install cuda-bindings)"),
    (True, lambda: FakeDriver(12020), "the CUDA driver (12.2) predates green contexts (12.4)"),
    (True, lambda: FakeDriver(12080, green_contexts=False), "this cuda-bindings has no green contexts"),
    (True, lambda: FakeDriver(13000), None),
])
def test_support_says_why_not(monkeypatch, gpu, driver, reason):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    monkeypatch.setattr(torch.cuda, "init", lambda: None)
    if driver is not None:
        monkeypatch.setattr(green, "_driver", driver)
    got = green.support()
    assert got == reason if reason is None or reason.endswith(")") else got.startswith(reason)


def test_available_logs_one_info_line_per_reason(monkeypatch, caplog):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "init", lambda: None)
    monkeypatch.setattr(green, "_driver", _missing)
    with caplog.at_level(logging.INFO, logger="opbench"):
        assert green.available() is False
        assert green.available() is False
    lines = [r for r in caplog.records if "cuda-bindings" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO
    assert lines[0].getMessage() == ("SM partitions are off: the cuda-bindings package is not installed "
                                     "(pip install cuda-bindings)")


def test_a_partitioned_schedule_runs_on_the_cpu_unpartitioned(branchy, caplog):
    seq = ParallelExecutor(branchy, get_scheduler("sequential").schedule(branchy.graph)).run()[0].numpy().copy()
    plan = get_scheduler("opara").schedule(branchy.graph)
    streams = max(plan.stream_of) + 1
    partitioned = plan.with_partition([8], [None] + [0] * (streams - 1))
    with caplog.at_level(logging.INFO, logger="opbench"):
        out = ParallelExecutor(branchy, partitioned).run()[0].numpy()
    np.testing.assert_array_equal(out, seq)
    assert [r.getMessage() for r in caplog.records if "SM partitions" in r.getMessage()] == [
        "SM partitions are off on the CPU: its streams are threads"]


def test_evaluate_auto_without_green_contexts_adds_no_row(branchy, caplog):
    with caplog.at_level(logging.INFO, logger="opbench"):
        _, rows = evaluate(branchy, ["sequential", "opara"], repeat=2, number=2, sm_partition="auto")
    assert [r["schedule"] for r in rows] == ["sequential", "opara"] and all(r["sm"] == "-" for r in rows)
    assert "SM partitions are off on the CPU: its streams are threads" in caplog.text
    with pytest.raises(OpBenchError, match=r"unknown SM partition mode 'on' \(accepted: off, auto\)"):
        evaluate(branchy, ["sequential"], repeat=2, number=2, sm_partition="on")


def test_capturer_takes_sm_partition(caplog):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()
    x = torch.randn(2, 4)
    with pytest.raises(OpBenchError, match=r"unknown SM partition mode 'yes' \(accepted: off, auto\)"):
        capturer(x, model, sm_partition="yes")
    with caplog.at_level(logging.INFO, logger="opbench"):
        run = capturer(x, model, sm_partition="auto", repeat=2, number=2)
    torch.testing.assert_close(run(x), model(x))
    assert "SM partitions are off" in caplog.text
