"""Shared fixtures; GPU tests are skipped where no CUDA device is visible, tests marked ``slow`` (end-to-end
runs of 10 s to a minute each on a small machine; CI runs them as a second step) unless ``--slow`` or
``$OPBENCH_SLOW_TESTS=1``, and tests marked ``zoo`` (every model of the zoo, minutes each) unless ``--zoo`` or
``$OPBENCH_ZOO_TESTS=1``."""

from __future__ import annotations

import functools
import os

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--slow", action="store_true", help="also run the tests marked slow")
    parser.addoption("--zoo", action="store_true", help="also run the tests marked zoo (every model of the zoo)")


@functools.cache
def has_gpu() -> bool:
    try:
        import tvm

        return bool(tvm.cuda(0).exist)
    except Exception:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    slow = config.getoption("--slow") or os.environ.get("OPBENCH_SLOW_TESTS") == "1"
    skip_gpu = pytest.mark.skip(reason="needs an NVIDIA GPU")
    zoo = config.getoption("--zoo") or os.environ.get("OPBENCH_ZOO_TESTS") == "1"
    skip_slow = pytest.mark.skip(reason="slow: run with --slow (or OPBENCH_SLOW_TESTS=1)")
    skip_zoo = pytest.mark.skip(reason="zoo: run with --zoo (or OPBENCH_ZOO_TESTS=1)")
    for item in items:
        if "zoo" in item.keywords and not zoo:
            item.add_marker(skip_zoo)
        if "gpu" in item.keywords and not has_gpu():
            item.add_marker(skip_gpu)
        if "slow" in item.keywords and not slow:
            item.add_marker(skip_slow)


@pytest.fixture(autouse=True, scope="session")
def _session_cache(tmp_path_factory: pytest.TempPathFactory):
    """What OpBench caches (compiled regions, kept choices, features) goes to a directory of this test session's
    own, unless ``$OPBENCH_CACHE`` says where: no test reads what another session left in ``~/.cache/opbench``, and
    none writes there."""
    if os.environ.get("OPBENCH_CACHE"):
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OPBENCH_CACHE", str(tmp_path_factory.mktemp("opbench_cache")))
        yield


@pytest.fixture
def llvm_target():
    from opbench.runtime import resolve_target

    return resolve_target("llvm")
