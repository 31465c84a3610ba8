"""Environment tags stored with every row: CPU, GPU, versions, time."""

from __future__ import annotations

import platform
from typing import Any

import psutil

from .. import __version__


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


def environment_tags(device: str = "cpu") -> dict[str, Any]:
    """Tags common to every row of a run (GPU tags are added by the CUDA profiler)."""
    import tvm

    return {
        "device": device,
        "cpu_model": cpu_model(),
        "cpu_cores": psutil.cpu_count(logical=True),
        "tvm_version": tvm.__version__,
        "opbench_version": __version__,
    }
