"""One creation idiom: every plug-in base makes a kind by name with ``Base.create(kind, ...)``, and an unknown
kind is a one-line error naming the kinds there are."""

from __future__ import annotations

import pytest

from opbench import OpBenchError


def _bases():
    from opbench.models import ModelSource
    from opbench.profile.base import LocalProfiler, Profiler
    from opbench.schedule import Greedy, Scheduler
    from opbench.tune.tuners import Tuner

    return [
        (Scheduler, ("greedy",), {"max_streams": 2}, Greedy, "unknown scheduler 'nope' (accepted: sequential, greedy"),
        (Profiler, ("local",), {}, LocalProfiler, "unknown profiler 'nope' (accepted: local, cuda, rpc)"),
        (Tuner, ("xgb",), {}, Tuner, "unknown tuner 'nope' (accepted: xgb, xgb-rank"),
        (ModelSource, ("simple",), {}, ModelSource,
         "unknown model source 'nope' (accepted: local, remoteonnx, simple, transformers)"),
    ]


@pytest.mark.parametrize("index", range(4))
def test_every_base_creates_its_kinds_by_name(index):
    base, args, options, made, error = _bases()[index]
    thing = base.create(*args, **options)
    assert isinstance(thing, made)
    with pytest.raises(OpBenchError) as err:
        base.create("nope")
    assert str(err.value).startswith(error) and "\n" not in str(err.value)


def test_a_kernel_backend_by_name():
    from opbench.runtime.backend import KernelBackend

    assert KernelBackend.check_kind("tvm").name == "tvm"
    with pytest.raises(OpBenchError, match="unknown backend 'nope' \\(accepted: tvm, torch"):
        KernelBackend.create("nope")


def test_an_alias_is_accepted_but_not_listed():
    from opbench.models import SOURCE_KINDS, get_source
    from opbench.registry import Registry, constant

    registry: Registry[int] = Registry("number")
    registry.register("one", constant(1), aliases=("uno",))
    assert registry.create("uno") == 1 and "uno" in registry and registry.kinds() == ["one"]
    for kind in SOURCE_KINDS.kinds():
        assert get_source(kind).name == kind


def test_each_create_names_its_built_in_kinds_as_a_literal():
    """``Base.create(kind)`` annotates ``kind`` with a ``Literal`` of exactly the kinds its registry has
    built in (a kind added to one and not the other fails here)."""
    import typing

    from opbench.models import SOURCE_KINDS, ModelSource
    from opbench.profile.base import PROFILER_KINDS, Profiler
    from opbench.runtime.backend import BACKEND_KINDS, KernelBackend
    from opbench.schedule import SCHEDULER_KINDS, Scheduler
    from opbench.tune.tuners import TUNER_KINDS, Tuner

    for base, registry in ((Scheduler, SCHEDULER_KINDS), (Profiler, PROFILER_KINDS), (Tuner, TUNER_KINDS),
                           (ModelSource, SOURCE_KINDS), (KernelBackend, BACKEND_KINDS)):
        hint = typing.get_type_hints(base.create)["kind"]
        literal = next(a for a in [hint, *typing.get_args(hint)] if typing.get_origin(a) is typing.Literal)
        assert list(typing.get_args(literal)) == registry.kinds(registered=True), base.__name__
