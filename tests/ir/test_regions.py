"""Region cuts on known graphs: one region per branch of an inception-style block, one for a chain."""

from __future__ import annotations

import pytest

from opbench import OpBenchError
from opbench.ir.regions import cut_regions


def _inception(branches=4, length=2):
    """stem -> [branch_i: `length` ops] x branches -> concat -> tail; (preds, expected regions)."""
    preds = [[]]  # 0: the stem
    starts = []
    for _ in range(branches):
        starts.append(len(preds))
        preds.append([0])
        for _ in range(length - 1):
            preds.append([len(preds) - 1])
    concat = len(preds)
    preds.append([s + length - 1 for s in starts])
    preds.append([concat])  # the tail after the join
    return preds, starts, concat


def test_an_inception_block_gives_one_region_per_branch():
    preds, starts, concat = _inception()
    regions = cut_regions(preds, "branches")
    assert [0] in regions  # the stem forks: alone
    for s in starts:
        assert [s, s + 1] in regions  # each branch, whole
    assert [concat, concat + 1] in regions  # the join and what follows it
    assert len(regions) == 1 + 4 + 1


def test_a_chain_and_a_residual_chain_give_one_region():
    chain = [[]] + [[i] for i in range(6)]
    assert cut_regions(chain, "branches") == [list(range(7))]
    # resnet-like: 0 -> (1 -> 2) -> add(3, reads 0 and 2) -> (4 -> 5) -> add(6, reads 3 and 5)
    residual = [[], [0], [1], [0, 2], [3], [4], [3, 5]]
    assert cut_regions(residual, "branches") == [list(range(7))]


def test_blocks_merge_the_branches_not_worth_running_side_by_side():
    preds, starts, concat = _inception()
    cheap = [1e-6] * len(preds)  # branches of a microsecond: not worth a stream each
    assert cut_regions(preds, "blocks", cheap) == [list(range(len(preds)))]
    heavy = [1e-3] * len(preds)
    assert cut_regions(preds, "blocks", heavy) == cut_regions(preds, "branches")


def test_whole_and_bad_cuts():
    preds, _, _ = _inception()
    assert cut_regions(preds, "whole") == [list(range(len(preds)))]
    with pytest.raises(OpBenchError, match="unknown region cut 'bogus'"):
        cut_regions(preds, "bogus")
    with pytest.raises(OpBenchError, match="needs each operator's time"):
        cut_regions(preds, "blocks")


def test_regions_are_in_topological_order_and_cover_every_operator():
    # two blocks in a row, branches of different lengths, a skip edge around the second block
    preds = [[], [0], [0], [2], [1, 3], [4], [4], [5, 6], [4, 7]]
    regions = cut_regions(preds, "branches")
    assert sorted(op for r in regions for op in r) == list(range(len(preds)))
    where = {op: i for i, r in enumerate(regions) for op in r}
    assert all(where[p] <= where[op] for op, ps in enumerate(preds) for p in ps)
