"""SM partitions: CUDA streams confined to disjoint groups of a GPU's SMs (CUDA green contexts).

A green context owns a subset of the SMs; a kernel launched on one of its streams runs on those SMs
only, also when the launch is captured in a CUDA Graph (forked into the green stream by events from
an ordinary capture stream, the executor's pattern). The driver calls, through NVIDIA's
``cuda-bindings`` package (``pip install cuda-bindings``; CUDA driver 12.4 or newer):

1. ``cuDeviceGetDevResource(device, SM)``: every SM of the device;
2. ``cuDevSmResourceSplitByCount(N // g, sm, 0, g)``: one split into disjoint granules of the device's
   granularity ``g`` (8 SMs on sm_90; 16 granules = 128 of an H100's 132 SMs);
3. ``cuDevResourceGenerateDesc`` on a partition's granules (whole multiples of ``g``; the driver
   combines only groups of one split, and a group cannot be split again) and ``cuGreenCtxCreate``:
   a green context per partition, so that partitions never share an SM;
4. ``cuGreenCtxStreamCreate``: a non-blocking stream in it, wrapped as ``torch.cuda.ExternalStream``.

Where this is missing (no GPU, no ``cuda-bindings``, an older driver), :func:`support` says why, and
callers run without partitions after one INFO line (:func:`available`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from ..errors import OpBenchError, first_line
from ..schedule.base import check_sm_sizes
from .device import gpu_index

log = logging.getLogger(__name__)
#: the oldest CUDA driver with green contexts (12.4)
MIN_DRIVER = 12040
_said: set[str] = set()
_partitions: dict[tuple[int, tuple[int, ...]], SmPartitions] = {}


def _driver() -> Any:
    from cuda.bindings import driver

    return driver


def _check(result: Any, call: str) -> Any:
    """The values of a ``cuda.bindings`` call, or an :class:`OpBenchError` naming the call and the error."""
    err, *values = result
    if int(err) != 0:
        raise OpBenchError(f"{call} failed: {getattr(err, 'name', err)}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def support() -> str | None:
    """None where SM partitions can be made on the current GPU, else the reason they cannot."""
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible"
    try:
        drv = _driver()
    except ImportError:
        return "the cuda-bindings package is not installed (pip install cuda-bindings)"
    try:
        torch.cuda.init()
        _check(drv.cuInit(0), "cuInit")
        version = _check(drv.cuDriverGetVersion(), "cuDriverGetVersion")
    except Exception as err:  # a broken driver install: partitions stay off
        return f"the CUDA driver cannot be queried ({first_line(err)})"
    if int(version) < MIN_DRIVER:
        return f"the CUDA driver ({int(version) // 1000}.{int(version) % 1000 // 10}) predates green contexts (12.4)"
    if not hasattr(drv, "cuGreenCtxCreate"):
        return "this cuda-bindings has no green contexts (cuda-bindings 12.4 or newer is needed)"
    return None


def available(what: str = "SM partitions") -> bool:
    """True where :func:`support` finds no reason against; else one INFO line (once per reason) and False."""
    reason = support()
    if reason is None:
        return True
    say_off(f"{what} are off: {reason}")
    return False


def say_off(line: str) -> None:
    """Log ``line`` at INFO, once per process."""
    if line not in _said:
        _said.add(line)
        log.info("%s", line)


def _sm_resource(device_index: int) -> tuple[Any, Any]:
    drv = _driver()
    device = _check(drv.cuDeviceGet(device_index), "cuDeviceGet")
    whole = _check(drv.cuDeviceGetDevResource(device, drv.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM),
                   "cuDeviceGetDevResource")
    return device, whole


def _granules(device_index: int) -> tuple[Any, list[Any], int, int]:
    """The device, its SMs split once into disjoint granules (the smallest groups it makes), the
    granule's size and the device's SM count. A partition combines whole granules: the driver
    combines only groups of one split into a green context, and a group cannot be split again."""
    drv = _driver()
    device, whole = _sm_resource(device_index)
    one, made, _ = _check(drv.cuDevSmResourceSplitByCount(1, whole, 0, 1), "cuDevSmResourceSplitByCount")
    if int(made) != 1:
        raise OpBenchError("the driver cannot split this GPU's SMs")
    size = int(one[0].sm.smCount)
    total = int(whole.sm.smCount)
    groups, made, _ = _check(drv.cuDevSmResourceSplitByCount(total // size, whole, 0, size),
                             "cuDevSmResourceSplitByCount")
    return device, list(groups)[:int(made)], size, total


def layout(device_index: int | None = None) -> dict[str, int]:
    """The device's ``sm_count``, the ``granularity`` of its partitions and how many SMs partitions can
    take together (``partitionable``: whole granules; e.g. 128 of an H100's 132 in granules of 8)."""
    _, granules, size, total = _granules(gpu_index() if device_index is None else device_index)
    return {"sm_count": total, "granularity": size, "partitionable": size * len(granules)}


class SmPartitions:
    """Disjoint SM partitions of one device, each with a green context and its streams.

    :meth:`stream` gives a ``torch.cuda.ExternalStream`` whose kernels run on ``sizes[group]`` SMs
    only; several streams of one group share its SMs and still run concurrently. Made once per
    ``(device, sizes)`` by :func:`partitions` and kept for the process's life: a CUDA Graph captured on
    the streams keeps launching into the green contexts.
    """

    def __init__(self, sizes: Sequence[int], device_index: int | None = None) -> None:
        drv = _driver()
        self.sizes = [int(n) for n in sizes]
        self.device_index = device_index = gpu_index() if device_index is None else device_index
        device, granules, size, total = _granules(device_index)
        check_sm_sizes(self.sizes, size * len(granules), size, device=f"this GPU ({total} SMs, in granules of {size})")
        self.contexts: list[Any] = []
        self.actual: list[int] = []
        self._streams: dict[tuple[int, int, int], Any] = {}
        self._raw: list[Any] = []
        start = 0
        for n in self.sizes:
            mine = granules[start:start + n // size]
            start += len(mine)
            self.actual.append(sum(int(g.sm.smCount) for g in mine))
            desc = _check(drv.cuDevResourceGenerateDesc(mine, len(mine)), "cuDevResourceGenerateDesc")
            self.contexts.append(_check(drv.cuGreenCtxCreate(
                desc, device, drv.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM), "cuGreenCtxCreate"))
        if self.actual != self.sizes:
            raise OpBenchError(f"the driver made SM groups of {self.actual}, not the {self.sizes} asked for")

    def stream(self, group: int, index: int = 0, priority: int = 0) -> Any:
        """The ``index``-th stream of group ``group`` (made on first use; ``priority`` as CUDA's)."""
        key = (group, index, priority)
        if key not in self._streams:
            import torch

            drv = _driver()
            raw = _check(drv.cuGreenCtxStreamCreate(self.contexts[group], drv.CUstream_flags.CU_STREAM_NON_BLOCKING,
                                                    priority), "cuGreenCtxStreamCreate")
            self._raw.append(raw)
            self._streams[key] = torch.cuda.ExternalStream(int(raw), device=torch.device("cuda", self.device_index))
        return self._streams[key]


def partitions(sizes: Sequence[int], device_index: int | None = None) -> SmPartitions:
    """The (cached) :class:`SmPartitions` of ``sizes`` on device ``device_index`` (default: the measuring GPU)."""
    key = (gpu_index() if device_index is None else device_index, tuple(int(n) for n in sizes))
    if key not in _partitions:
        _partitions[key] = SmPartitions(key[1], device_index)
    return _partitions[key]


def sm_count(device_index: int | None = None) -> int:
    """The number of SMs of the device (PyTorch's view; no bindings needed)."""
    import torch

    index = gpu_index() if device_index is None else device_index
    return int(torch.cuda.get_device_properties(index).multi_processor_count)


__all__ = ["MIN_DRIVER", "SmPartitions", "available", "say_off", "layout", "partitions", "sm_count", "support"]
