"""Timing: warm-up, repeats, medians, L2 flush (local timing here, CUDA in :mod:`opbench.profile.cuda`)."""

from .timer import Timing, TimingConfig, time_evaluator

__all__ = ["Timing", "TimingConfig", "time_evaluator"]
