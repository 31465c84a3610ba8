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


__all__ = ["SPLITS", "check_split", "folds", "group_label"]
