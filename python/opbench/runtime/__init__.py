"""Compiled kernels and how to run them (per operator, whole model)."""

from __future__ import annotations

from typing import Any

_LAZY = {"BuiltModule": "build", "build_module": "build", "OperatorKernels": "kernels", "flatten_outputs": "kernels",
         "relative_error": "kernels", "canonical_target": "target", "device_for": "target", "is_gpu": "target",
         "resolve_target": "target", "target_key": "target"}

__all__ = ["BuiltModule", "canonical_target", "OperatorKernels", "build_module", "device_for", "flatten_outputs",
           "is_gpu", "relative_error", "resolve_target", "target_key"]


def __getattr__(name: str) -> Any:
    """The package's names are loaded when first used (importing a light submodule does not import TVM)."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
