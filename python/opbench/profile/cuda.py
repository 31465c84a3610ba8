"""GPU profiling: CUDA-event timing of CUDA Graphs, L2 flush, kernel resources, co-runs.

Every variant is timed the same way: the kernels are captured in a CUDA Graph (TVM launches on
PyTorch's stream through ``tvm_ffi.use_torch_stream``), then CUDA events bracket ``number``
back-to-back replays, ``repeat`` times, and the median is kept. Launching a graph costs the host a
few microseconds, more than a small kernel takes on the GPU, so back-to-back replays of a short
graph measure the host's launch rate (it moved by half between runs on one H100). A variant whose
single replay is shorter than :data:`UNROLL_S` is therefore captured ``unroll`` times back to back
in one graph (up to :data:`MAX_UNROLL`), and a sample is divided by ``unroll``: the time of the
work as it runs inside a graph, as the CUDA Graph executor runs it. With ``flush_l2`` a write of
twice the L2 size precedes every sample (``number`` and ``unroll`` are 1), on both sides of any
comparison.

A co-run group is captured twice: one after another on one stream, and forked onto one stream per
operator (event record on the capture stream, every worker waits on it, the capture stream waits
on an event from each worker). Speedup = sequential / concurrent.

Energy: NVML's total energy counter of the GPU (:class:`EnergyMeter`) is read before and after the
timed samples of each operator, co-run group and whole model; the mean board power over that window
times the median latency is the energy of one call (idle power included; the counter's update interval
is the driver's, so a window shorter than it gives no reading rather than a wrong one).
"""

from __future__ import annotations

import logging
import math
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import OpBenchError, first_line
from ..runtime.device import gpu_index, gpu_uuid, nvml_handle, nvml_query
from ..runtime.graphs import CapturedGraph, capture_graph, fork_join
from ..runtime.kernels import OperatorKernels
from .base import Profiler
from .timer import EnergyRead, Timing, TimingConfig, cuda_event_samples, with_energy

log = logging.getLogger(__name__)

#: a graph whose one replay is shorter than this is captured several times over (see the module docstring)
UNROLL_S = 100e-6
#: at most this many copies of the work in one timed graph
MAX_UNROLL = 64


def _nvidia_smi(fields: str, index: int | None = None) -> list[str] | None:
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits", "-i",
                              gpu_uuid(index)],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return None
    return [x.strip() for x in out.strip().splitlines()[0].split(",")] if out.strip() else None


def gpu_tags(index: int | None = None) -> dict[str, Any]:
    """The environment columns of CUDA device ``index`` (default: :func:`gpu_index`) at the start of a run: its
    name, SMs, memory, driver, CUDA runtime, SM clock now and UUID (PyTorch and nvidia-smi)."""
    import torch

    props = torch.cuda.get_device_properties(gpu_index() if index is None else index)
    smi = _nvidia_smi("driver_version,clocks.sm", index)
    return {"gpu_name": props.name, "gpu_sm_count": props.multi_processor_count,
            "gpu_memory_mb": props.total_memory // (1 << 20), "gpu_driver": smi[0] if smi else None,
            "cuda_runtime": torch.version.cuda, "gpu_clock_start_mhz": _int(smi[1]) if smi else None,
            "gpu_uuid": gpu_uuid(index)}


def _int(text: str | None) -> int | None:
    try:
        return int(float(text)) if text is not None else None
    except ValueError:
        return None


_THROTTLE = {0x1: "gpu_idle", 0x2: "applications_clocks", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
             0x10: "sync_boost", 0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "hw_power_brake",
             0x100: "display_clocks"}


def _nvml_clock_and_throttle() -> tuple[int, int] | None:
    """(SM clock in MHz, throttle-reason mask) of the measuring GPU through NVML (``nvidia-ml-py``,
    the GPU found by its UUID), or None without it."""
    def ask(nvml: Any) -> tuple[int, int]:
        handle = nvml_handle(nvml)
        return (int(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)),
                int(nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle)))

    return nvml_query(ask)  # None: nvidia-smi is asked instead


def _throttle(text: str) -> str | None:
    """nvidia-smi's throttle bit mask as names (``none`` when the clocks run free)."""
    try:
        mask = int(text, 16) if text.lower().startswith("0x") else int(text)
    except ValueError:
        return None
    names = [name for bit, name in _THROTTLE.items() if mask & bit]
    return ",".join(names) or "none"


#: FP32 lanes per SM by compute capability major version (Volta/Ampere A100: 64, later: 128)
_FP32_LANES = {7: 64, 8: 64, 9: 128, 10: 128, 12: 128}


#: dense float16/bfloat16 tensor-core FLOP/s over FP32 FLOP/s, by compute capability major (V100 125/15.7,
#: A100 312/19.5, H100 SXM 989/67 TFLOP/s)
_TENSOR_CORE_RATIO = {7: 8.0, 8: 16.0, 9: 14.8}


def device_figures(index: int | None = None) -> dict[str, Any]:
    """The GPU's figures for the scheduling cost: SM count, threads per SM, peak FP32 FLOP/s (from
    the SM clock), peak dense float16/bfloat16 tensor-core FLOP/s (``peak_flops_half``, from the FP32
    peak and the architecture's ratio) and memory bandwidth (from the memory clock and bus width).

    Clocks come from the device properties, else from nvidia-smi's maximum clocks; a figure that
    cannot be read is left out (the cost model then keeps its default).
    """
    import torch

    props = torch.cuda.get_device_properties(gpu_index() if index is None else index)
    out: dict[str, Any] = {"name": props.name, "sm_count": props.multi_processor_count,
                           "threads_per_sm": props.max_threads_per_multi_processor}
    sm_khz = getattr(props, "clock_rate", 0) or 0
    mem_khz = getattr(props, "memory_clock_rate", 0) or 0
    if not sm_khz or not mem_khz:
        smi = _nvidia_smi("clocks.max.sm,clocks.max.memory")
        if smi:
            sm_khz = sm_khz or (_int(smi[0]) or 0) * 1000
            mem_khz = mem_khz or (_int(smi[1]) or 0) * 1000
    lanes = _FP32_LANES.get(props.major, 128)
    if sm_khz:
        out["peak_flops"] = 2.0 * lanes * props.multi_processor_count * sm_khz * 1e3
        out["peak_flops_half"] = out["peak_flops"] * _TENSOR_CORE_RATIO.get(props.major, 1.0)
    bus = getattr(props, "memory_bus_width", 0) or 0
    if mem_khz and bus:
        out["bandwidth"] = 2.0 * mem_khz * 1e3 * bus / 8
    return out


class EnergyMeter:
    """NVML's total energy counter of one GPU (millijoules since the driver loaded; Volta and newer).

    NVML is initialised once, for the meter's life: a read costs microseconds. Without ``nvidia-ml-py``, a
    driver, or the counter on this GPU, every :meth:`read` is None and the rows' energy columns stay NULL.
    """

    def __init__(self, index: int | None = None) -> None:
        self._nvml: Any = None
        self._handle: Any = None
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = nvml_handle(pynvml, index)
            pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)  # raises where the GPU has no counter
        except Exception as err:  # energy is extra: timing goes on without it
            log.debug("GPU energy counter unavailable: %s", err)
            return
        self._nvml, self._handle = pynvml, handle

    @property
    def available(self) -> bool:
        return self._nvml is not None

    def read(self) -> EnergyRead | None:
        """``(millijoules, time.perf_counter())`` now, or None."""
        if self._nvml is None:
            return None
        try:
            return float(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)), time.perf_counter()
        except Exception as err:
            log.debug("GPU energy counter read failed: %s", err)
            return None


def operator_range(index: int, kind: str, func: str) -> str:
    """The NVTX range of an operator timed by :meth:`CudaProfiler.time` (at most 120 characters)."""
    return f"opbench #{index} {kind} {func}"[:120]


class CudaProfiler(Profiler):
    """Times operators and co-run groups on the GPU (see the module docstring for the method)."""

    name = "cuda"

    def __init__(self, corun_k: int = 4, corun_limit: int = 0) -> None:
        try:
            import torch
            import tvm_ffi
        except ImportError:
            raise OpBenchError("--target cuda needs PyTorch with CUDA for timing: pip install torch") from None
        if not torch.cuda.is_available():
            raise OpBenchError("target 'cuda' needs an NVIDIA GPU, but PyTorch sees none")
        self.torch = torch
        self.tvm_ffi = tvm_ffi
        self.corun_k = corun_k
        self.corun_limit = corun_limit
        self.gpu = torch.device("cuda", gpu_index())
        self.props = torch.cuda.get_device_properties(self.gpu)
        self.flush_buffer = torch.empty(2 * max(self.props.L2_cache_size, 1 << 20), dtype=torch.int8,
                                        device=self.gpu)
        self.streams = [torch.cuda.Stream(device=self.gpu) for _ in range(max(corun_k, 1))]
        self._solo: dict[int, Timing] = {}
        self._outs: dict[int, list[Any]] = {}
        self.energy = EnergyMeter()

    # environment -------------------------------------------------------------------------
    def tags(self) -> dict[str, Any]:
        """GPU tags at the start of a run (:func:`gpu_tags`)."""
        return gpu_tags()

    def run_facts(self) -> dict[str, Any]:
        """The GPU's peak figures (:func:`device_figures`) and L2 size, for the report's roofs."""
        try:
            return {"device_figures": {**device_figures(), "l2_bytes": int(self.props.L2_cache_size)}}
        except Exception as err:  # figures are extra: measuring goes on without them
            log.debug("device figures unavailable: %s", err)
            return {}

    def end_tags(self) -> dict[str, Any]:
        """GPU tags at the end of a run: the SM clock and why it is throttled, if it is (NVML when
        ``pynvml`` is importable, else nvidia-smi)."""
        nvml = _nvml_clock_and_throttle()
        if nvml is not None:
            return {"gpu_clock_end_mhz": nvml[0], "gpu_throttle": _throttle(str(nvml[1]))}
        smi = _nvidia_smi("clocks.sm,clocks_throttle_reasons.active")
        return {"gpu_clock_end_mhz": _int(smi[0]) if smi else None,
                "gpu_throttle": _throttle(smi[1]) if smi and len(smi) > 1 else None}

    # resources ---------------------------------------------------------------------------
    def resources(self, kernels: OperatorKernels) -> dict[int, dict[str, Any]]:
        """Kernel resources of every operator, by operator index (empty if unavailable)."""
        from ..runtime.resources import kernel_resources

        built = kernels.built
        funcs = sorted({n.func for n in kernels.graph})
        try:
            by_func = kernel_resources(built.device_source(), str(built.target.attrs["arch"]), built.scheduled,
                                       funcs, self.props.multi_processor_count,
                                       self.props.max_threads_per_multi_processor)
        except Exception as err:  # resources are extra columns; timing goes on without them
            log.warning("kernel resources unavailable: %s", first_line(err))
            return {}
        return {n.index: by_func.get(n.func, {}) for n in kernels.graph}

    # timing ------------------------------------------------------------------------------
    def capture(self, launch: Callable[[], None]) -> CapturedGraph:
        """Capture ``launch`` (TVM kernels on the current stream) in a CUDA Graph, after a warm-up."""
        torch = self.torch

        def on(stream: Any) -> None:
            with self.tvm_ffi.use_torch_stream(torch.cuda.stream(stream)):
                launch()

        return capture_graph(on)

    def _one_replay(self, graph: CapturedGraph, warmup: int) -> float:
        """Seconds of one replay of ``graph`` (CUDA events), after ``warmup`` replays."""
        torch = self.torch
        for _ in range(max(1, warmup)):
            graph.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        return max(start.elapsed_time(end) / 1e3, 1e-7)

    def time_graph(self, graph: CapturedGraph, config: TimingConfig, unroll: int = 1) -> Timing:
        """CUDA-event timing of graph replays (median over ``config.repeat`` samples), per copy of
        the work when the graph holds ``unroll`` copies of it."""
        one = self._one_replay(graph, config.warmup)
        number = 1 if config.flush_l2 else max(config.number, min(200, math.ceil(config.min_repeat_ms / 1e3 / one)))
        flush = self.flush_buffer.zero_ if config.flush_l2 else None
        before = self.energy.read()
        samples = cuda_event_samples(graph.replay, config.repeat, number, warmup=0, before_sample=flush)
        return with_energy(Timing([s / unroll for s in samples], number * unroll), before, self.energy.read())

    def time_model(self, built: Any, inputs: Sequence[Any], config: TimingConfig) -> Timing:
        """Time the whole model in the Relax VM (TVM's ``time_evaluator``), with the GPU's energy counter
        read around it."""
        before = self.energy.read()
        timing = super().time_model(built, inputs, config)
        return with_energy(timing, before, self.energy.read())

    def time_launch(self, launch: Callable[[], None], config: TimingConfig) -> Timing:
        """Capture ``launch`` and time it; a short one is captured several times over in one graph
        so that the graph launch is not what is measured (see the module docstring)."""
        graph = self.capture(launch)
        if config.flush_l2 or graph.empty:
            return self.time_graph(graph, config)
        unroll = min(MAX_UNROLL, max(1, math.ceil(UNROLL_S / self._one_replay(graph, config.warmup))))
        if unroll == 1:
            return self.time_graph(graph, config)

        def repeated() -> None:
            for _ in range(unroll):
                launch()

        return self.time_graph(self.capture(repeated), config, unroll)

    def _prepare(self, kernels: OperatorKernels, index: int, inputs: Sequence[Any],
                 values: dict[int, list[Any]]) -> tuple[list[Any], list[Any]]:
        if index not in self._outs:
            self._outs[index] = kernels.allocate_outputs(index)
        return kernels.args_for(index, inputs, values), self._outs[index]

    def time(self, kernels: OperatorKernels, index: int, args: Sequence[Any], outs: Sequence[Any],
             config: TimingConfig) -> Timing:
        """Time one operator (its kernels captured in a CUDA Graph, see :meth:`time_launch`) inside an NVTX
        range named ``opbench #INDEX KIND FUNC``: Nsight Compute profiles one operator of a collection with
        ``ncu --nvtx --nvtx-include "opbench #12 conv2d/" --graph-profiling node`` (one push and one pop per
        operator, outside the timed replays)."""
        import torch

        node = kernels.graph[index]
        torch.cuda.nvtx.range_push(operator_range(index, node.kind, node.func))
        try:
            return self.time_launch(lambda: kernels.call(index, args, outs), config)
        finally:
            torch.cuda.nvtx.range_pop()

    # co-runs -----------------------------------------------------------------------------
    def corun(self, kernels: OperatorKernels, group: Sequence[int], inputs: Sequence[Any],
              values: dict[int, list[Any]], config: TimingConfig) -> dict[str, Any]:
        """Measure one group sequentially (one stream) and concurrently (one stream each)."""
        torch = self.torch
        prepared = [self._prepare(kernels, i, inputs, values) for i in group]
        for i, (args, outs) in zip(group, prepared, strict=True):
            if i not in self._solo:
                self._solo[i] = self.time(kernels, i, args, outs, config)

        def sequential() -> None:
            for i, (args, outs) in zip(group, prepared, strict=True):
                kernels.call(i, args, outs)

        op_events: list[tuple[Any, Any]] = []
        streams = self.streams[:len(group)]

        def concurrent(timed: bool) -> Callable[[], None]:
            def body() -> None:
                op_events.clear()
                for stream, i, (args, outs) in zip(streams, group, prepared, strict=True):
                    with self.tvm_ffi.use_torch_stream(torch.cuda.stream(stream)):
                        if timed:
                            begin = torch.cuda.Event(enable_timing=True, external=True)
                            finish = torch.cuda.Event(enable_timing=True, external=True)
                            begin.record(stream)
                            kernels.call(i, args, outs)
                            finish.record(stream)
                            op_events.append((begin, finish))
                        else:
                            kernels.call(i, args, outs)

            return lambda: fork_join(torch.cuda.current_stream(), streams, body)

        seq = self.time_launch(sequential, config)
        conc = self.time_launch(concurrent(False), config)
        partitioned, partition_sms = self._partitioned(kernels, group, prepared, config)
        slowdowns = None
        try:  # per-operator time inside the concurrent run, from events captured in the graph
            graph = self.capture(concurrent(True))
            graph.replay()
            torch.cuda.synchronize()
            per_op = []
            for _ in range(max(3, min(config.repeat, 10))):
                graph.replay()
                torch.cuda.synchronize()
                per_op.append([b.elapsed_time(f) / 1e3 for b, f in op_events])
            med = [sorted(col)[len(col) // 2] for col in zip(*per_op, strict=True)]
            slowdowns = [m / self._solo[i].median if self._solo[i].median > 0 else None
                         for m, i in zip(med, group, strict=True)]
        except Exception as err:  # events in graphs need a recent driver and PyTorch
            log.debug("per-operator co-run timing unavailable: %s", err)
        return {
            "group_size": len(group), "sequential_s": seq.median, "concurrent_s": conc.median,
            **conc.percentiles("concurrent"), **conc.energy_columns("concurrent_"),
            "speedup": seq.median / conc.median if conc.median > 0 else None,
            "solo_s": [self._solo[i].median for i in group], "slowdowns": slowdowns,
            "repeats": config.repeat, "l2_flush": int(config.flush_l2), "status": "ok", "error": None,
            "partitioned_s": partitioned, "partition_sms": partition_sms,
        }

    def _partitioned(self, kernels: OperatorKernels, group: Sequence[int], prepared: Sequence[Any],
                     config: TimingConfig) -> tuple[float | None, list[int] | None]:
        """Seconds of ``group`` run concurrently with each operator confined to its own equal share of
        the SMs (disjoint green-context partitions, whole granules), and the shares; ``(None, None)``
        where green contexts are missing (one INFO line) or the GPU has too few SMs for the group."""
        from ..runtime import green

        if not green.available("co-runs with SM partitions"):
            return None, None
        shape = green.layout()
        share = shape["partitionable"] // len(group) // shape["granularity"] * shape["granularity"]
        if share < shape["granularity"]:
            return None, None
        torch = self.torch
        try:
            parts = green.partitions([share] * len(group))
            streams = [parts.stream(g) for g in range(len(group))]

            def body() -> None:
                for stream, i, (args, outs) in zip(streams, group, prepared, strict=True):
                    with self.tvm_ffi.use_torch_stream(torch.cuda.stream(stream)):
                        kernels.call(i, args, outs)

            timing = self.time_launch(lambda: fork_join(torch.cuda.current_stream(), streams, body), config)
        except Exception as err:  # the row keeps its other measurements
            log.warning("co-run with SM partitions of %s failed: %s", list(group), first_line(err))
            return None, None
        return timing.median, [share] * len(group)
