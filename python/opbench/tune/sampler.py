"""Hardware-free sampling of one task's tensor programs (``opbench sample``).

Algorithm (per task, deterministic for a seed, in one process):

1. Generate the task's design space (MetaSchedule's sketches for the target: ``post-order-apply``
   with the target's rules, or the tensor-core rules for float16 on CUDA).
2. **Random samples.** Replay a sketch (chosen round-robin) with every sampling decision left open,
   so that the schedule draws it from a random state seeded by ``(seed, attempt)``; then apply the
   target's post-processors in order. The first post-processor that refuses the program (for CUDA
   ``VerifyGPUCode``: too many threads, too much shared memory) is the reason the candidate is
   *rejected*: it is counted under that name and never built. Stop after ``init_valid`` programs
   pass (or the attempt budget runs out).
3. **Evolution with a random cost model.** Pick a parent uniformly among the programs kept so far,
   pick one of the design space's mutators by its probability (tile sizes, unroll, thread binding,
   ...), mutate the parent's trace, replay it and post-process as in 2. A random cost model ranks
   every child alike, so a valid child is kept as is and becomes a parent too.
4. **De-duplication.** A program is kept only when the structural hash of its post-processed module
   is new for the task (``duplicate`` is counted otherwise).
5. **Memo of outcomes.** Replaying a trace whose decisions are all made, and post-processing the result,
   is deterministic: the same instructions with the same decisions give the same program and the same
   verdict. Each outcome (kept or duplicate, or the name of what refused it) is remembered under the
   sketch and the trace's decisions (each with its instruction's position) up to its post-processing. A
   mutation that repeats a known trace is counted with that outcome without being replayed, and a random
   sample whose drawn decisions repeat a known trace without being post-processed (one of a sketch that
   draws no decision at all, without being replayed). Many attempts repeat (a space of few distinct
   programs is sampled until the ``patience`` runs out; mutations often undo each other), and replaying
   and ``VerifyGPUCode``'s lowering are most of the sampling time. The candidates, their order and the
   counts are those without the memo.

The stream is prefix-stable: the first ``n`` candidates of a run asked for ``m > n`` are the
candidates of a run asked for ``n`` with the same seed, so that a larger ``--per-task`` extends a
finished sample. Candidates are numbered 0, 1, ... in the order they are kept.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

from .knobs import dumps

#: the reason counted when a mutator finds nothing to change in a trace
MUTATOR_DECLINED = "mutator_declined"
#: the reason counted for a valid program already kept
DUPLICATE = "duplicate"
#: the reason counted when replaying a trace raises (a sampled decision the program cannot take)
REPLAY_ERROR = "replay_error"


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One sampled tensor program of a task.

    Attributes
    ----------
    index:
        Its number among the task's kept candidates (0, 1, ...).
    origin:
        ``random`` (a sample of a sketch) or ``mutate:<Mutator>`` (a mutation of a kept candidate).
    sketch:
        Which sketch of the design space it descends from.
    trace:
        The post-processed trace as JSON text (MetaSchedule's record format).
    mod:
        The post-processed module (``tvm.ir.save_json``): what a builder compiles.
    shash:
        The module's structural hash (hex).
    """

    index: int
    origin: str
    sketch: int
    trace: str
    mod: str
    shash: str


@dataclasses.dataclass
class SampleStats:
    """What sampling one task cost: attempts, kept candidates, rejections by reason, seconds."""

    attempts: int = 0
    kept: int = 0
    rejected: Counter = dataclasses.field(default_factory=Counter)
    seconds: float = 0.0
    exhausted: bool = False  # the attempt budget ran out before ``count`` candidates were kept

    def to_json(self) -> dict[str, Any]:
        return {"attempts": self.attempts, "kept": self.kept, "rejected": dict(self.rejected),
                "seconds": self.seconds, "exhausted": self.exhausted}


def tune_context(mod: Any, target: Any, space: str, seed: int, name: str = "task") -> Any:
    """A MetaSchedule tune context for sampling ``mod`` (one thread, seeded)."""
    from tvm.s_tir import meta_schedule as ms

    from ..runtime.startup import import_tensor_intrinsics
    from .space import design_space

    import_tensor_intrinsics()
    return ms.TuneContext(mod=mod, target=target, space_generator=design_space(space), task_name=name,
                          num_threads=1, rand_state=_seed32(seed))


def _seed32(*parts: int) -> int:
    """A seed in [1, 2**31) derived from ``parts`` (TVM's random state takes a positive int32)."""
    value = 0x9E3779B9
    for part in parts:
        value = (value * 1_000_003 + int(part)) & 0xFFFFFFFFFFFF
    return value % (2**31 - 1) + 1


def sample_task(mod: Any, target: Any, count: int, seed: int = 0, space: str = "default", init_valid: int = 8,
                attempts_per_candidate: int = 40, min_attempts: int = 400, patience: int = 200,
                stats: SampleStats | None = None, memo: bool = True) -> Iterator[Candidate]:
    """Yield up to ``count`` distinct valid candidates of ``mod`` (see the module docstring).

    Parameters
    ----------
    mod:
        The task's IRModule (one PrimFunc, as MetaSchedule extracts it).
    target:
        The tuning target (with the device's limits, :func:`opbench.runtime.target.tuning_target`).
    count:
        How many distinct candidates to keep.
    seed:
        The sampling seed: the same seed gives the same candidates in the same order.
    space:
        The design space kind (:func:`opbench.tune.space.space_kind`).
    init_valid:
        Valid random samples to keep before mutating.
    attempts_per_candidate, min_attempts:
        The attempt budget: ``max(min_attempts, attempts_per_candidate * count)`` replays in all.
    patience:
        Once some candidate is kept, stop after this many attempts in a row keep none (a small space
        that has given every program it has).
    stats:
        Filled in while sampling (attempts, rejections by reason, seconds).
    memo:
        Remember each trace's outcome (step 5 of the module docstring); False replays and post-processes
        every attempt (the same candidates and counts, slower).
    """
    from tvm import s_tir
    from tvm.s_tir.meta_schedule import _ffi_api

    stats = stats if stats is not None else SampleStats()
    start = time.perf_counter()
    context = tune_context(mod, target, space, seed)
    sketches = list(context.generate_design_space())
    if not sketches:
        stats.exhausted = True
        return
    generator = context.space_generator
    postprocs = list(generator.postprocs)
    mutators = [(m, float(p)) for m, p in generator.mutator_probs.items() if float(p) > 0]
    rng = random.Random(_seed32(seed, 7))
    seen: set[str] = set()
    outcomes: dict[str, str] = {}  # a trace's _key -> its outcome ("": kept or duplicate; else what refused it)
    parents: list[tuple[Any, int]] = []  # (post-processed trace, sketch)
    budget = max(min_attempts, attempts_per_candidate * count)
    last_kept = 0  # the attempt that kept the last candidate
    try:
        while stats.kept < count and stats.attempts < budget and not (parents and stats.attempts - last_kept
                                                                       >= patience):
            attempt = stats.attempts
            stats.attempts += 1
            if len(parents) < min(init_valid, count) or not mutators:
                sketch = attempt % len(sketches)
                trace = s_tir.Trace(sketches[sketch].trace.insts, {})
                origin = "random"
            else:
                parent, sketch = parents[rng.randrange(len(parents))]
                mutator = rng.choices([m for m, _ in mutators], weights=[p for _, p in mutators])[0]
                trace = _ffi_api.MutatorApply(mutator, parent, _seed32(seed, attempt, 1))  # seeded, unlike .apply
                origin = f"mutate:{type(mutator).__name__}"
                if trace is None:
                    stats.rejected[MUTATOR_DECLINED] += 1
                    continue
            key = _key(sketch, trace) if memo and origin != "random" else None  # a random sample's are open
            if memo and origin == "random" and str(sketch) in outcomes:
                key = str(sketch)  # a sketch that draws nothing (known from its first replay) is one program
            if key in outcomes:
                stats.rejected[outcomes[key] or DUPLICATE] += 1
                continue
            sch, reason = _replay(mod, trace, postprocs, _seed32(seed, attempt), outcomes if memo else None, key,
                                  sketch)
            if sch is None:
                stats.rejected[reason] += 1
                continue
            shash = _hash(sch.mod)
            if shash in seen:
                stats.rejected[DUPLICATE] += 1
                continue
            seen.add(shash)
            last_kept = stats.attempts
            parents.append((sch.trace, sketch))
            candidate = Candidate(stats.kept, origin, sketch, dumps(sch.trace), _save(sch.mod), shash)
            stats.kept += 1
            stats.seconds = time.perf_counter() - start
            yield candidate
        stats.exhausted = stats.kept < count
    finally:
        stats.seconds = time.perf_counter() - start


def _replay(mod: Any, trace: Any, postprocs: list[Any], seed: int, outcomes: dict[str, str] | None = None,
            key: str | None = None, sketch: int = 0) -> tuple[Any, str]:
    """``trace`` replayed on ``mod`` (open decisions drawn from ``seed``) and post-processed: the
    schedule, or None and the name of what refused it.

    ``outcomes`` (the memo; None: none): the outcome is stored under ``key`` (the trace's, where its
    decisions are all made) or else under the replayed trace's (of ``sketch``); a replayed trace already
    there is not post-processed again (None and its outcome, ``duplicate`` for one that was kept)."""
    from tvm import s_tir

    def outcome(sch: Any, reason: str) -> tuple[Any, str]:
        if outcomes is not None and key is not None:
            outcomes[key] = reason
        return (None, reason) if reason else (sch, "")

    try:
        sch = s_tir.Schedule(mod, seed=seed, debug_mask=0)
        trace.apply_to_schedule(sch, remove_postproc=True)
    except Exception:  # a decision the program cannot take
        return outcome(None, REPLAY_ERROR)
    if outcomes is not None and key is None:
        key = _key(sketch, sch.trace)  # the decisions drawn
        if key in outcomes:
            return None, outcomes[key] or DUPLICATE
    try:
        sch.enter_postproc()
    except Exception:
        return outcome(None, REPLAY_ERROR)
    for postproc in postprocs:
        try:
            ok = postproc.apply(sch)
        except Exception:
            ok = False
        if not ok:
            return outcome(None, type(postproc).__name__)
    return outcome(sch, "")


def _key(sketch: int, trace: Any) -> str:
    """The memo's key of a trace of ``sketch``: its decisions, each after its instruction's position, up to
    its post-processing. The instructions are the sketch's (a mutator changes decisions only), so sketch and
    decisions determine the program; this is about 20 times cheaper than the trace's JSON."""
    decisions = trace.decisions
    parts = [str(sketch)]
    for i, inst in enumerate(trace.insts):
        if inst.kind.name == "EnterPostproc":
            break
        if inst in decisions:
            parts.append(f"{i}:{decisions[inst]}")
    return ";".join(parts)


def _hash(mod: Any) -> str:
    import tvm_ffi

    return format(tvm_ffi.structural_hash(mod) & 0xFFFFFFFFFFFFFFFF, "016x")


def _save(mod: Any) -> str:
    import tvm

    return tvm.ir.save_json(mod)


__all__ = ["DUPLICATE", "MUTATOR_DECLINED", "REPLAY_ERROR", "Candidate", "SampleStats", "sample_task", "tune_context"]
