"""The Relax pass plugin and the operator graph it produces."""

from .extract import ExtractOperators, build_op_graph, extract_operators
from .graph import ArgRef, OpGraph, OpNode, Task

__all__ = ["ArgRef", "ExtractOperators", "OpGraph", "OpNode", "Task", "build_op_graph",
           "extract_operators"]
