"""Environment tags stored with every row (CPU, GPU, versions, host, time) and the device fingerprint."""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import psutil

from .._version import __version__
from ..runtime.device import gpu_index
from ..runtime.target import canonical_target, is_gpu
from ..utils import digest

THREAD_VARS = ("TVM_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_DEVICE_MAX_CONNECTIONS")


def cpu_model() -> str:
    """The CPU's marketing name (``/proc/cpuinfo``), else ``platform.processor()``."""
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_name(target: Any) -> str:
    """The GPU's name for CUDA targets (``cuda (no GPU here)`` where this machine has none: a job that only
    prepares, or measures on remote devices), else the CPU model."""
    if is_gpu(target):
        import tvm

        try:
            return str(tvm.cuda(gpu_index()).device_name)
        except Exception:  # TVM without CUDA here: "Device API cuda is not enabled"
            return "cuda (no GPU here)"
    return cpu_model()


def device_fingerprint(target: Any) -> dict[str, Any]:
    """What identifies the measuring device: the full canonical target and the CPU or GPU name."""
    return {"target": canonical_target(target), "device_name": device_name(target)}


def device_id(target: Any, fingerprint: dict[str, Any] | None = None) -> str:
    """Digest of the device fingerprint (the dataset's device key): ``fingerprint`` when the
    measuring device is not this machine's, else :func:`device_fingerprint` of ``target``."""
    return digest(fingerprint or device_fingerprint(target))


@functools.cache
def git_commit() -> str | None:
    """The commit of the OpBench checkout this code runs from (None when not a git checkout)."""
    root = Path(__file__).resolve().parents[3]
    if not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                             text=True, timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (subprocess.SubprocessError, OSError):
        return None
    return out + ("+dirty" if dirty else "") if out else None


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def thread_settings() -> str:
    """The thread-count variables in force, e.g. ``TVM_NUM_THREADS=2 OMP_NUM_THREADS=-``."""
    return " ".join(f"{v}={os.environ.get(v, '-')}" for v in THREAD_VARS)


def environment_tags(target: Any) -> dict[str, Any]:
    """Tags common to every row of a run (GPU clocks and throttle state come from the CUDA profiler)."""
    import tvm
    from tvm.target.codegen import llvm_version_major

    freq = psutil.cpu_freq() if hasattr(psutil, "cpu_freq") else None
    return {
        "device": str(target.kind.name),
        "target": canonical_target(target),
        "device_name": device_name(target),
        "hostname": platform.node(),
        "cpu_model": cpu_model(),
        "cpu_cores": psutil.cpu_count(logical=True),
        "cpu_freq_mhz": round(freq.current, 1) if freq else None,
        "thread_settings": thread_settings(),
        "tvm_version": tvm.__version__,
        "llvm_version": str(llvm_version_major()),
        "torch_version": _version("torch"),
        "python_version": platform.python_version(),
        "opbench_version": __version__,
        "opbench_commit": git_commit(),
    }
