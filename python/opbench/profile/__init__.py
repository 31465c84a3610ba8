"""Timing and the collection job."""

from .collect import CollectOptions, CollectResult, collect
from .timer import Timing, TimingConfig, time_evaluator

__all__ = ["CollectOptions", "CollectResult", "Timing", "TimingConfig", "collect", "time_evaluator"]
