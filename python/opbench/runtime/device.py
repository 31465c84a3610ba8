"""Which GPU a process measures on: ``--device N`` (an index among the GPUs this process may see,
``CUDA_VISIBLE_DEVICES`` honoured), and NVML's handle of that GPU found by its UUID.

Every place that runs on a GPU asks :func:`gpu_index` (TVM's ``tvm.cuda(i)``, PyTorch's
``torch.device("cuda", i)``, the device properties). :func:`select_gpu` chooses it in one of two ways:

* before CUDA is initialised in this process (the command line: nothing has touched the GPU yet),
  ``CUDA_VISIBLE_DEVICES`` is narrowed to the chosen GPU, which is then device 0 for this process and
  for every process it starts (MetaSchedule's runners, the Relax VM's builders);
* after (a library user who already ran CUDA code), the index itself is kept and
  ``torch.cuda.set_device`` is called, so that PyTorch's "cuda" means the same GPU as TVM's.

NVML numbers GPUs physically and ignores ``CUDA_VISIBLE_DEVICES``; :func:`nvml_handle` therefore looks
the GPU up by the UUID CUDA reports for it.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from ..errors import OpBenchError

_ENV = "CUDA_VISIBLE_DEVICES"
_index = 0


def gpu_index() -> int:
    """The CUDA device index (among this process's visible GPUs) every GPU path uses."""
    return _index


def visible_gpus() -> list[str] | None:
    """The items of ``CUDA_VISIBLE_DEVICES`` (indices or UUIDs), or None when it is not set."""
    text = os.environ.get(_ENV)
    if text is None:
        return None
    return [item.strip() for item in text.split(",") if item.strip()]


def visible_item(index: int) -> str:
    """How ``CUDA_VISIBLE_DEVICES`` names this process's GPU ``index`` (an index or a UUID); the index
    itself when the variable is not set (or names fewer GPUs)."""
    items = visible_gpus()
    return items[index] if items is not None and index < len(items) else str(index)


def gpu_count() -> int | None:
    """How many GPUs this process may use, without initialising CUDA: ``CUDA_VISIBLE_DEVICES``'s items
    when it is set, else NVML's count; None when neither can tell."""
    items = visible_gpus()
    if items is not None:
        return len(items)
    return nvml_query(lambda nvml: int(nvml.nvmlDeviceGetCount()))


def nvml_query(ask: Any) -> Any:
    """``ask(pynvml)`` between NVML's init and shutdown; None without ``nvidia-ml-py``, without a driver,
    or where NVML lacks the call."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        try:
            return ask(pynvml)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no driver, or an NVML without this call or GPU
        return None


def cuda_initialised() -> bool:
    """True once this process has initialised CUDA through PyTorch (then ``CUDA_VISIBLE_DEVICES`` is
    read already and changing it does nothing here)."""
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_initialized())


def parse_devices(text: str, flag: str = "--devices") -> list[int]:
    """``0,1,3`` as device indices (each once, in order); a one-line error for anything else."""
    items = [item.strip() for item in str(text).split(",")]
    try:
        indices = [int(item) for item in items]
    except ValueError:
        indices = [-1]
    if not items or any(i < 0 for i in indices):
        raise OpBenchError(f"bad {flag} '{text}' (accepted: GPU indices, comma-separated, e.g. 0 or 0,1)")
    return list(dict.fromkeys(indices))


def check_index(index: int, flag: str = "--device") -> None:
    """Refuse an index beyond the GPUs this process may see (when their number is known)."""
    count = gpu_count()
    if index < 0 or (count is not None and index >= count):
        seen = f"{count} GPU{'s' if count != 1 else ''}" if count is not None else "no GPU count"
        where = f" ({_ENV}={os.environ[_ENV]})" if visible_gpus() is not None else ""
        accepted = f"0 to {count - 1}" if count else "none"
        raise OpBenchError(f"{flag} {index}: this process sees {seen}{where} (accepted: {accepted})")


def select_gpu(index: int, flag: str = "--device") -> None:
    """Measure on GPU ``index`` of this process's visible GPUs (see the module docstring)."""
    global _index
    check_index(index, flag)
    if not cuda_initialised():
        os.environ[_ENV] = visible_item(index)
        _index = 0
        return
    _index = index
    import torch

    torch.cuda.set_device(index)


def child_env(index: int) -> dict[str, str]:
    """The environment of a worker process that measures on GPU ``index`` of this process's GPUs."""
    return {**os.environ, _ENV: visible_item(index)}


def cpu_groups(count: int) -> list[list[int]]:
    """This process's CPU cores split into ``count`` disjoint groups of consecutive cores (as even as can
    be): the "devices" of a CPU sweep with ``--devices``, one worker pinned to each group."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    if count > len(cores):
        raise OpBenchError(f"--devices: {count} CPU workers but this process may use {len(cores)} cores "
                           f"(accepted: at most {len(cores)} workers)")
    size, extra = divmod(len(cores), count)
    groups, start = [], 0
    for i in range(count):
        end = start + size + (1 if i < extra else 0)
        groups.append(cores[start:end])
        start = end
    return groups


def cpu_child_env(cores: list[int]) -> dict[str, str]:
    """The environment of a CPU worker pinned to ``cores``: TVM's and OpenMP's thread pools sized to them
    and no GPU visible."""
    n = str(len(cores))
    return {**os.environ, "TVM_NUM_THREADS": n, "OMP_NUM_THREADS": n, _ENV: ""}


def gpu_uuid(index: int | None = None) -> str:
    """How NVML and ``nvidia-smi -i`` name CUDA device ``index`` (default: :func:`gpu_index`): its UUID
    (``GPU-...``) as PyTorch reads it; without PyTorch's CUDA, the ``CUDA_VISIBLE_DEVICES`` item itself
    (a UUID or a physical index)."""
    index = gpu_index() if index is None else index
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        uuid = str(torch.cuda.get_device_properties(index).uuid)
        return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
    return visible_item(index)


def nvml_handle(pynvml: Any, index: int | None = None) -> Any:
    """NVML's handle of CUDA device ``index`` (default: :func:`gpu_index`), found by its UUID so that
    ``CUDA_VISIBLE_DEVICES`` is honoured (NVML itself numbers GPUs physically)."""
    name = gpu_uuid(index)
    if name.startswith(("GPU-", "MIG-")):
        return pynvml.nvmlDeviceGetHandleByUUID(name)
    return pynvml.nvmlDeviceGetHandleByIndex(int(name))


__all__ = ["check_index", "child_env", "cpu_child_env", "cpu_groups", "cuda_initialised", "gpu_count", "gpu_index",
           "gpu_uuid", "nvml_handle", "nvml_query", "parse_devices", "select_gpu", "visible_gpus", "visible_item"]
