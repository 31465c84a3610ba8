"""Nimble stream assignment (Kwon et al., NeurIPS 2020).

Algorithm
---------
1. Take the transitive reduction of the DAG.
2. Build the bipartite graph with an edge u_out -> v_in per reduced edge.
3. Find a maximum matching (Hopcroft-Karp).
4. Matched edges chain operators into streams: the number of streams is |V| - |M| (a minimum path
   cover).
5. Only unmatched reduced edges need events (minimum synchronisation); launch order is
   topological.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from ..ir.dag import transitive_reduction
from .base import Schedule, Scheduler


def hopcroft_karp(n: int, adj: list[list[int]]) -> list[int]:
    """Maximum bipartite matching of left 0..n-1 to right 0..n-1; returns match_left (-1 if none)."""
    inf = float("inf")
    match_l, match_r = [-1] * n, [-1] * n
    dist = [0.0] * n

    def bfs() -> bool:
        queue = deque()
        for u in range(n):
            dist[u] = 0 if match_l[u] == -1 else inf
            if match_l[u] == -1:
                queue.append(u)
        found = False
        while queue:
            u = queue.popleft()
            for v in adj[u]:
                w = match_r[v]
                if w == -1:
                    found = True
                elif dist[w] == inf:
                    dist[w] = dist[u] + 1
                    queue.append(w)
        return found

    def dfs(u: int) -> bool:
        for v in adj[u]:
            w = match_r[v]
            if w == -1 or (dist[w] == dist[u] + 1 and dfs(w)):
                match_l[u], match_r[v] = v, u
                return True
        dist[u] = inf
        return False

    while bfs():
        for u in range(n):
            if match_l[u] == -1:
                dfs(u)
    return match_l


class Nimble(Scheduler):
    name = "nimble"

    def schedule(self, graph: Any, cost: Any = None) -> Schedule:
        n = len(graph)
        reduced = transitive_reduction(graph)
        adj: list[list[int]] = [[] for _ in range(n)]
        for u, v in reduced:
            adj[u].append(v)
        match = hopcroft_karp(n, adj)
        has_pred = [False] * n
        for u in range(n):
            if match[u] != -1:
                has_pred[match[u]] = True
        stream_of = [-1] * n
        streams = 0
        for start in range(n):
            if has_pred[start]:
                continue
            v = start
            while v != -1:
                stream_of[v] = streams
                v = match[v]
            streams += 1
        events = sorted((u, v) for u, v in reduced if match[u] != v)
        return Schedule(self.name, stream_of, list(range(n)), events, None,
                        {"matching": sum(1 for m in match if m != -1)})
