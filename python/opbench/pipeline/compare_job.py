"""The compare job as plain data: :class:`CompareJob` names a model, its kernels and the schedules to measure,
and :func:`run_compare` runs it (``opbench compare`` builds the same job from its flags; ``opbench.compare`` is
:func:`run_compare`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ..errors import OpBenchError
from ..utils import announced
from .compare import CompareOptions, CompareResult, compare
from .compile import BackendSpec, model_backend, saved_cut
from .spec import ModelSpec, Spec, SpecError


@dataclasses.dataclass(frozen=True)
class CompareJob(Spec):
    """Schedules of one model's operators measured side by side (with, for a torch model, its own CUDA Graph
    and ``torch.compile`` as baselines), and the critical path that bounds them.

    Attributes
    ----------
    model:
        The model (:class:`~opbench.pipeline.spec.ModelSpec`).
    target:
        ``llvm``, ``cuda`` or a JSON target.
    backend:
        Its kernels (:class:`~opbench.pipeline.compile.BackendSpec`: TVM's, PyTorch's or Inductor-fused regions).
    options:
        The schedulers, their costs, the timing, a saved schedule (:class:`~opbench.pipeline.compare.CompareOptions`).
    database:
        A tuning database folder whose best records replace TVM's default kernels (backend kind ``tvm``).
    """

    model: ModelSpec = dataclasses.field(default_factory=ModelSpec)
    target: str = "llvm"
    backend: BackendSpec = dataclasses.field(default_factory=BackendSpec)
    options: CompareOptions = dataclasses.field(default_factory=CompareOptions)
    database: str | None = None

    def validate(self) -> None:
        """Check every field without loading the model (see :class:`~opbench.pipeline.spec.Spec`)."""
        from ..runtime.target import target_config

        for name in ("model", "backend", "options"):
            try:
                getattr(self, name).validate()
            except SpecError as err:
                raise SpecError(f"{name}.{err.field}", err.message) from None
        try:
            target_config(self.target)
        except OpBenchError as err:
            raise SpecError("target", str(err)) from None
        if self.database is not None and self.backend.kind != "tvm":
            raise SpecError("database", "a tuning database holds TVM kernels: it applies to backend kind 'tvm'")


def run_compare(job: CompareJob) -> CompareResult:
    """Load ``job``'s model, build its kernels and measure the schedules side by side (what ``opbench compare``
    runs). A bad field raises :class:`~opbench.pipeline.spec.SpecError`, a schedule file or database that does
    not read :class:`~opbench.errors.OpBenchError`, both before any work."""
    from ..runtime import resolve_target
    from ..tune.database import check_database

    job.validate()
    job.options.scheduler_names()  # the schedulers made by name, costs consistent with them
    schedule = job.options.load_schedule()
    if job.database is not None:
        check_database(Path(job.database), write=False)
    target = resolve_target(job.target)
    m = job.model
    dtype = "" if m.dtype == "float32" else f", {m.dtype}"
    with announced(f"loading {m.source} model {m.name} (batch {m.batch_size}{dtype})"):
        workload = m.load_workload()
    saved = saved_cut(schedule.meta if schedule is not None else None)
    backend_spec = dataclasses.replace(job.backend, **saved) if saved else job.backend
    backend, baseline = model_backend(workload, target, backend_spec, job.database, m.seed)
    result = compare(backend, job.options, baseline)
    result.workload = workload
    return result


__all__ = ["CompareJob", "run_compare"]
