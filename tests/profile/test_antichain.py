"""Co-run candidate groups are antichains of the operator DAG."""

from __future__ import annotations

import itertools

from opbench.ir import extract_operators
from opbench.models import load_workload
from opbench.profile.antichain import asap_levels, corun_groups, reachability


def _graph(name: str):
    return extract_operators(load_workload("simple", name, 1).mod)[1]


def test_branchy_groups_are_independent():
    graph = _graph("branchy:branches=4,depth=3,channels=4,size=4")
    reach = reachability(graph)
    # stem reaches everything, the final 1x1 conv nothing
    assert bin(reach[0]).count("1") == len(graph) - 1 and reach[len(graph) - 1] == 0
    groups = corun_groups(graph, k=4, limit=50)
    assert groups, "branchy has parallel branches"
    for group in groups:
        assert 2 <= len(group) <= 4
        for a, b in itertools.combinations(group, 2):
            assert not (reach[a] >> b) & 1 and not (reach[b] >> a) & 1
    # the four first convolutions of the branches form one wavefront, taken whole first
    assert groups[0] == tuple(graph.succs(0))


def test_limit_and_dedup():
    graph = _graph("branchy:branches=4,depth=3,channels=4,size=4")
    assert len(corun_groups(graph, k=4, limit=1)) == 1
    groups = corun_groups(graph, k=2, limit=100)
    sigs = [tuple(sorted(graph[i].task for i in g)) for g in groups]
    assert len(sigs) == len(set(sigs))  # one group per combination of kernels
    assert all(len(g) == 2 for g in groups)


def test_chain_has_no_groups():
    graph = _graph("matmul_matmul_add:n=32")  # matmul -> matmul+add: a chain
    assert corun_groups(graph) == []
    assert asap_levels(graph) == [[0], [1]]
