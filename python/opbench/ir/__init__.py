"""The Relax pass plugin and the operator graph it produces.

The names below are loaded when first used: importing a light module of this package (``ir.regions``,
``ir.dag``) does not import TVM, so ``opbench --help`` and ``--version`` answer at once.
"""

from __future__ import annotations

from typing import Any

_LAZY = {"ExtractOperators": "extract", "build_op_graph": "extract", "extract_operators": "extract",
         "ArgRef": "graph", "OpGraph": "graph", "OpNode": "graph", "Task": "graph"}

__all__ = ["ArgRef", "ExtractOperators", "OpGraph", "OpNode", "Task", "build_op_graph",
           "extract_operators"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'opbench.ir' has no attribute '{name}'")
