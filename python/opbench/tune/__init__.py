"""Intra-operator tuning on MetaSchedule: tuner names, the trial recorder, knob decoding, the database.

The job itself is :func:`opbench.pipeline.tune.tune_workload`; applying a database to a build is
:func:`opbench.runtime.build.apply_database` with :func:`opbench.tune.database.applied_database`.
"""

from .tuners import TUNERS, Tuner, get_tuner, pretrained_tuner

__all__ = ["TUNERS", "Tuner", "get_tuner", "pretrained_tuner"]
