"""Timing: the :class:`Profiler` interface and its implementations (local ``time_evaluator`` in
:mod:`.base`, CUDA Graphs and co-runs in :mod:`.cuda`, remote devices in :mod:`.rpc`), warm-up,
repeats, medians, L2 flush."""

from .base import LocalProfiler, Profiler
from .timer import Timing, TimingConfig, time_evaluator

__all__ = ["LocalProfiler", "Profiler", "Timing", "TimingConfig", "time_evaluator"]
