"""Region cuts on known graphs: one region per branch of an inception-style block, one for a chain."""

from __future__ import annotations

import pytest

from opbench import OpBenchError
from opbench.ir.regions import cut_regions, split_heavy


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


def _blocks(count: int = 4):
    """``count`` inverted-residual-like blocks in a chain: conv (a piece may start) -> act -> taps -> conv -> add
    (reads the block's input); (preds, starts)."""
    preds: list[list[int]] = [[]]  # 0: the stem
    starts = [False]
    block_in = 0
    for _ in range(count):
        first = len(preds)
        preds += [[block_in], [first], [first + 1], [first + 2], [block_in, first + 3]]
        starts += [True, False, False, True, False]
        block_in = first + 4
    return preds, starts


def test_a_heavy_region_is_cut_into_pieces_where_one_tensor_crosses_into_a_convolution():
    preds, starts = _blocks()
    (region,) = cut_regions(preds, "branches")
    weights = [1] * len(preds)
    weights[3::5] = [9] * 4  # each block's unfolded 3x3 depthwise convolution weighs its nine taps
    assert split_heavy([region], preds, weights, starts, 0) == [region]  # no limit
    assert split_heavy([region], preds, weights, starts, sum(weights)) == [region]  # light enough
    pieces = split_heavy([region], preds, weights, starts, 14)
    assert [op for piece in pieces for op in piece] == region  # consecutive, every operator once
    assert len(pieces) == 4  # 53 / 14: four pieces
    for piece in pieces[1:]:
        first = piece[0]
        assert starts[first] and preds[first] == [first - 1]  # a block's first convolution: one tensor in
    # the convolution inside a block reads one tensor too, but the block's input crosses beside it: no cut there
    assert all(piece[0] % 5 == 1 for piece in pieces[1:])
    # the pieces in order are a topological order of their graph (the region's edges go forward only)
    where = {op: i for i, piece in enumerate(pieces) for op in piece}
    assert all(where[p] <= where[op] for op, ps in enumerate(preds) for p in ps)


def test_a_heavy_region_without_a_boundary_stays_whole():
    preds, starts = _blocks(2)
    (region,) = cut_regions(preds, "branches")
    assert split_heavy([region], preds, [5] * len(preds), [False] * len(preds), 5) == [region]
