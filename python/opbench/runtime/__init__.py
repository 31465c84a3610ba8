"""Compiled kernels and how to run them (per operator, whole model)."""

from .build import BuiltModule, build_module
from .kernels import OperatorKernels, flatten_outputs, relative_error
from .target import canonical_target, device_for, is_gpu, resolve_target, target_key

__all__ = ["BuiltModule", "canonical_target", "OperatorKernels", "build_module", "device_for", "flatten_outputs",
           "is_gpu", "relative_error", "resolve_target", "target_key"]
