"""Shared fixtures; GPU tests are skipped where no CUDA device is visible."""

from __future__ import annotations

import functools

import pytest


@functools.cache
def has_gpu() -> bool:
    try:
        import tvm

        return bool(tvm.cuda(0).exist)
    except Exception:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if has_gpu():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def llvm_target():
    from opbench.runtime import resolve_target

    return resolve_target("llvm")
