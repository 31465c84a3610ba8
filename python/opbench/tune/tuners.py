"""Tuner names (OpBench's ``--tuner``) and the MetaSchedule configuration each one stands for.

A tuner is three MetaSchedule parts: a search strategy (how candidates are proposed), a cost
model (how they are ranked before being measured) and the features the cost model reads.

========== ============================================================================================
name       configuration
========== ============================================================================================
xgb        evolutionary search; XGBoost regression on MetaSchedule's per-store features (its default)
xgb-rank   evolutionary search; XGBoost with a pairwise ranking objective on the same features
           (AutoTVM's ``rank`` loss: only the order of candidates matters)
xgb_knob   evolutionary search; XGBoost on the schedule's knobs themselves (tile factors, unroll,
           compute locations decoded from the trace), AutoTVM's ``knob`` features
xgb_itervar evolutionary search; XGBoost on per-loop iteration-variable features (extent, loop
           kind, nesting depth, for the outermost loops of every block), AutoTVM's ``itervar``
xgb_curve  evolutionary search; XGBoost on per-buffer touch and reuse curves over the loop nest,
           AutoTVM's ``curve`` features
ga         evolutionary search (mutation + crossover of measured good traces) with no learned
           model: candidates are picked at random from the evolved population
random     replay-trace: each candidate is an independent random sample of the design space
gridsearch every decision of the design space walked in grid order (AutoTVM's grid search), no model
========== ============================================================================================

The evolutionary search keeps a population of about eight candidates per trial of a task's budget
(between 128 and MetaSchedule's 512): its cost is proportional to the population, and a budget of a
few dozen trials gains nothing from a larger one. In one tuning run, all tasks share one cost model,
as in MetaSchedule's own multi-task tuning, so what earlier tasks taught it ranks later tasks'
candidates from their first batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Literal

from ..errors import OpBenchError
from ..registry import Registry, constant

#: the tuners :meth:`Tuner.create` makes (:data:`TUNERS` holds each one's configuration)
TunerKind = Literal["xgb", "xgb-rank", "xgb_knob", "xgb_itervar", "xgb_curve", "ga", "random", "gridsearch"]


@dataclasses.dataclass(frozen=True)
class Tuner:
    """A named MetaSchedule configuration (see the module docstring)."""

    name: str
    description: str
    strategy: Callable[[int], Any]  # trials per task -> a fresh search strategy
    cost_model: Callable[[], Any]
    #: candidates measured per round of the search (MetaSchedule's ``num_trials_per_iter``): the cost model
    #: learns between rounds
    trials_per_iter: int = 64

    @staticmethod
    def create(kind: TunerKind) -> Tuner:
        """A tuner by name: ``xgb``, ``xgb-rank``, ... (:data:`TUNERS`)."""
        return TUNER_KINDS.create(kind)


def population_for(trials: int) -> int:
    """The evolutionary search's population for a task budget of ``trials`` (module docstring)."""
    return min(512, max(128, 8 * trials))


def _evolutionary(trials: int) -> Any:
    from tvm.s_tir.meta_schedule.search_strategy import EvolutionarySearch

    return EvolutionarySearch(population_size=population_for(trials))


def _replay(_trials: int) -> Any:
    from tvm.s_tir.meta_schedule.search_strategy import ReplayTrace

    return ReplayTrace()


def _grid(_trials: int) -> Any:
    from .strategies import GridSearch

    return GridSearch()


def _xgb(extractor: Any = "per-store-feature") -> Callable[[], Any]:
    def make() -> Any:
        from tvm.s_tir.meta_schedule.cost_model import XGBModel

        return XGBModel(extractor=extractor() if callable(extractor) else extractor, adaptive_training=True)

    return make


def _xgb_rank() -> Any:
    from .models import RankXGBModel

    return RankXGBModel(adaptive_training=True)


def _knob_features() -> Any:
    from .models import KnobFeatures

    return KnobFeatures()


def _itervar_features() -> Any:
    from .models import IterVarFeatures

    return IterVarFeatures()


def _curve_features() -> Any:
    from .models import CurveFeatures

    return CurveFeatures()


def _random_model() -> Any:
    from tvm.s_tir.meta_schedule.cost_model import RandomModel

    return RandomModel()


TUNERS: dict[str, Tuner] = {t.name: t for t in [
    Tuner("xgb", "evolutionary search, XGBoost regression on per-store features (MetaSchedule default)",
          _evolutionary, _xgb()),
    Tuner("xgb-rank", "evolutionary search, XGBoost with a pairwise ranking objective on per-store features",
          _evolutionary, _xgb_rank),
    Tuner("xgb_knob", "evolutionary search, XGBoost on the decoded schedule knobs", _evolutionary,
          _xgb(_knob_features)),
    Tuner("xgb_itervar", "evolutionary search, XGBoost on per-loop iteration-variable features", _evolutionary,
          _xgb(_itervar_features)),
    Tuner("xgb_curve", "evolutionary search, XGBoost on per-buffer touch and reuse curves", _evolutionary,
          _xgb(_curve_features)),
    Tuner("ga", "evolutionary search (mutation of measured traces) without a learned model", _evolutionary,
          _random_model),
    Tuner("random", "independent random samples of the design space (replay-trace)", _replay, _random_model),
    Tuner("gridsearch", "every decision of the design space in grid order, no model", _grid, _random_model),
]}


#: candidates per round of a pretrained tuner: its model ranks well from the first round, and each task's
#: own booster learns from every round (:func:`opbench.predict.trials.pretrained_model`), so rounds are short
PRETRAINED_TRIALS_PER_ITER = 16


def pretrained_tuner(tuner: str | Tuner, cost_model: Callable[[], Any], source: str) -> Tuner:
    """``tuner`` (``xgb``) starting from a cost model that already learned from earlier tuning:
    ``cost_model()`` makes a fresh one (a trials predictor's,
    :meth:`opbench.predict.trials.TrialsPredictor.tuning_model`), which predicts from the first round and
    learns each task's measurements as they come, :data:`PRETRAINED_TRIALS_PER_ITER` at a time. Trial rows
    name the tuner ``<tuner>-pretrained``; ``source`` says where the model came from."""
    tuner = get_tuner(tuner)
    if tuner.name != "xgb":
        raise OpBenchError(f"--pretrained works with --tuner xgb (MetaSchedule's XGBoost cost model on its "
                           f"per-store features), not '{tuner.name}'")
    return Tuner(f"{tuner.name}-pretrained", f"{tuner.description}, starting from {source}", tuner.strategy,
                 cost_model, PRETRAINED_TRIALS_PER_ITER)


#: the tuners by name (:meth:`Tuner.create`)
TUNER_KINDS: Registry[Tuner] = Registry("tuner")
for _tuner in TUNERS.values():
    TUNER_KINDS.register(_tuner.name, constant(_tuner))


def get_tuner(tuner: str | Tuner) -> Tuner:
    """A tuner by name (:meth:`Tuner.create`) or a :class:`Tuner` passed through."""
    if isinstance(tuner, Tuner):
        return tuner
    return Tuner.create(str(tuner))
