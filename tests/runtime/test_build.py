"""Default GPU schedules: a dlight rule that raises declines instead of stopping the build."""

from __future__ import annotations

import pytest
import tvm
from tvm import te

from opbench.runtime.build import _guarded


def _module() -> tvm.IRModule:
    a = te.placeholder((64, 64), name="a")
    b = te.compute((64, 64), lambda i, j: a[i, j] * 2.0, name="b")
    return tvm.IRModule({"double": te.create_prim_func([a, b])})


class _Broken:
    """A rule with a bug, like TVM 0.27's GEMV rule on a mean over a 1x1 feature map."""

    def apply(self, func, target, tunable):
        raise AssertionError

    def is_target_available(self, target):
        return True


def test_a_raising_rule_leaves_the_function_to_the_next():
    from tvm.s_tir import dlight as dl

    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    with target, pytest.raises(AssertionError):
        dl.ApplyDefaultSchedule(_Broken(), dl.gpu.Fallback())(_module())
    with target:
        scheduled = dl.ApplyDefaultSchedule(_guarded(_Broken()), _guarded(dl.gpu.Fallback()))(_module())
    script = scheduled.script()
    assert "blockIdx.x" in script and "threadIdx.x" in script  # Fallback bound the loops to threads
