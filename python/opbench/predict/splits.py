"""Held-out splits, as cross-validation folds over groups.

* ``within_task``: items are dealt into folds inside each group (a task's candidates, or an
  operator's rows), so every group is seen in training and tested on its other items.
* ``by_task``: whole tasks are held out (an operator task: same kind, fused operators, shapes and
  attributes, across models; a tuning task).
* ``by_model``: whole models are held out, never their operators one by one (all of a model's
  batch sizes and precisions together: a model measured in fp16 never trains the fold that tests
  it in bf16).
* ``by_dtype``: whole precisions are held out: trained on float32 rows, say, and tested on the
  float16 ones (how well a predictor transfers to a precision it has not seen).

Every item is tested exactly once, by the fold that held it out; the metrics pool those
predictions. The group of an item is never in both sides of a fold for ``by_task``/``by_model``.

An item may belong to several models (a tuning task that two models share): its group is then a
``frozenset`` of models, and ``by_model`` deals *models* into folds. A fold tests the items all of
whose models it holds out and trains on the items none of whose models it holds out, so that no
held-out model's task is ever trained on; an item whose models fall into different folds is never
tested (it trains the folds that hold out none of its models).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np

from ..dataset import row_dtype
from ..errors import OpBenchError
from .metrics import by_group

SPLITS = ("within_task", "by_task", "by_model", "by_dtype")


def check_split(split: str) -> str:
    """``split`` checked against :data:`SPLITS`."""
    if split not in SPLITS:
        raise OpBenchError(f"unknown --split '{split}' (accepted: {', '.join(SPLITS)})")
    return split


def group_label(row: dict, split: str) -> Hashable | None:
    """``row``'s group for the whole-group splits: its model (``source:model``, every batch size and
    precision) for ``by_model``, its precision for ``by_dtype``; None for the task splits."""
    if split == "by_model":
        return f"{row.get('source', '')}:{row['model']}"
    if split == "by_dtype":
        return row_dtype(row)
    return None


def folds(groups: Sequence[Hashable], split: str, k: int = 5, seed: int = 0
          ) -> list[tuple[np.ndarray, np.ndarray]]:
    """``(train indices, test indices)`` per fold.

    ``groups`` is each item's group for this split (its task for ``within_task`` and ``by_task``,
    :func:`group_label` for ``by_model`` and ``by_dtype``). Group splits need at least two groups;
    ``within_task`` needs at least two items.
    """
    check_split(split)
    n = len(groups)
    rng = np.random.default_rng(seed)
    fold_of = np.zeros(n, dtype=int)
    if split == "within_task":
        if n < 2:
            raise OpBenchError(f"too few rows for a within_task split: {n} (needed: at least 2)")
        k = min(k, n)
        offset = 0
        for idx in by_group(groups).values():  # deal each group's items round-robin, continuing across groups
            for j, i in enumerate(rng.permutation(idx)):
                fold_of[i] = (offset + j) % k
            offset += len(idx)
    elif split == "by_model" and any(isinstance(g, frozenset) for g in groups):
        return _model_set_folds([g if isinstance(g, frozenset) else frozenset([g]) for g in groups], k, rng)
    else:
        unique = list(dict.fromkeys(groups))
        if len(unique) < 2:
            what = {"by_model": "models", "by_dtype": "dtypes"}.get(split, "tasks")
            raise OpBenchError(f"too few {what} for a {split} split: {len(unique)} (needed: at least 2)")
        k = min(k, len(unique))
        order = rng.permutation(len(unique))
        fold_of_group = {unique[g]: pos % k for pos, g in enumerate(order)}
        fold_of = np.array([fold_of_group[g] for g in groups], dtype=int)
    out = []
    for f in range(k):
        test = np.flatnonzero(fold_of == f)
        train = np.flatnonzero(fold_of != f)
        if len(test) and len(train):
            out.append((train, test))
    return out


def _model_set_folds(groups: list[frozenset], k: int, rng: np.random.Generator
                     ) -> list[tuple[np.ndarray, np.ndarray]]:
    """``by_model`` folds of items that each belong to a set of models (see the module docstring)."""
    models = sorted(set().union(*groups), key=str)
    if len(models) < 2:
        raise OpBenchError(f"too few models for a by_model split: {len(models)} (needed: at least 2)")
    k = min(k, len(models))
    fold_of = {models[m]: pos % k for pos, m in enumerate(rng.permutation(len(models)))}
    item_folds = [{fold_of[m] for m in g} for g in groups]
    out = []
    for f in range(k):
        test = np.array([i for i, fs in enumerate(item_folds) if fs == {f}], dtype=int)
        train = np.array([i for i, fs in enumerate(item_folds) if f not in fs], dtype=int)
        if len(test) and len(train):
            out.append((train, test))
    return out


__all__ = ["SPLITS", "check_split", "folds", "group_label"]
