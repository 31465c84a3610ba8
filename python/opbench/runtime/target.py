"""Target names -> TVM targets and devices, with clear errors."""

from __future__ import annotations

import json
import os
from typing import Any

from ..errors import OpBenchError, first_line
from .device import gpu_index

TARGETS = ("llvm", "cuda")


def target_config(target: Any) -> dict[str, Any]:
    """The target dict ``target`` names (``llvm``, ``cuda``, a JSON text or a dict), read without touching a
    device: a sweep's parent process decides GPU or CPU workers from it and leaves the GPU to the workers."""
    if isinstance(target, dict):
        return dict(target)
    if hasattr(target, "kind"):  # a tvm.target.Target
        return {"kind": target.kind.name}
    text = str(target).strip()
    if text.startswith("{"):
        try:
            config = json.loads(text)
        except json.JSONDecodeError as err:
            raise OpBenchError(f"bad target JSON '{text}': {err}") from None
        return config
    if text.lower() in TARGETS:
        return {"kind": text.lower()}
    raise OpBenchError(f"unknown target '{text}' (accepted: {', '.join(TARGETS)}, or a JSON target dict)")


def resolve_target(target: Any, local_device: bool = True) -> Any:
    """Turn ``llvm``, ``cuda`` or a JSON target dict into a ``tvm.target.Target``.

    ``llvm`` compiles for the host CPU (LLVM's name for it, e.g. ``znver4``). ``cuda`` needs a visible NVIDIA GPU;
    its architecture is read from the device (``sm_90`` on H100/H200). With ``local_device=False``
    (measuring on a remote device) nothing is read from this machine's GPU, and a CUDA target must
    name its ``arch``.
    """
    import tvm

    if isinstance(target, tvm.target.Target):
        return target
    config = target_config(target)
    kind = config.get("kind")
    if kind == "llvm":
        from tvm.target.codegen import llvm_get_system_cpu, llvm_get_system_triple, llvm_is_valid_cpu

        config.setdefault("mcpu", llvm_get_system_cpu())
        triple = str(config.get("mtriple") or llvm_get_system_triple())
        if not llvm_is_valid_cpu(str(config["mcpu"]), triple):  # LLVM would build for a generic CPU
            raise OpBenchError(f"unknown mcpu '{config['mcpu']}' for {triple} (accepted: a CPU LLVM knows, e.g. "
                               f"'{llvm_get_system_cpu()}' for this machine, or leave mcpu out)")
    elif kind == "cuda" and not local_device:
        if "arch" not in config:
            raise OpBenchError("a remote GPU's architecture cannot be read from this machine: give it in the "
                               'target, e.g. --target \'{"kind":"cuda","arch":"sm_90"}\'')
    elif kind == "cuda":
        dev = tvm.cuda(gpu_index())
        if not dev.exist:
            raise OpBenchError("target 'cuda' needs an NVIDIA GPU, but no CUDA device is visible "
                               "(use --target llvm on this machine)")
        config.setdefault("arch", "sm_" + dev.compute_version.replace(".", ""))
    elif kind not in TARGETS:
        raise OpBenchError(f"unknown target kind '{kind}' (accepted: {', '.join(TARGETS)})")
    try:
        return tvm.target.Target(config)
    except Exception as err:
        raise OpBenchError(f"bad target {json.dumps(config)}: {first_line(err)}") from None


def tuning_target(target: Any, device: Any = None) -> Any:
    """The target MetaSchedule tunes for: the collection target, with the core count on CPUs
    (its parallel rules need ``num-cores``) and the device's limits on GPUs (``device``: the
    measuring device, remote or this machine's; without one, CUDA's limits for every sm_70 and later
    GPU, so that design spaces can be generated on a machine without a GPU)."""
    import tvm

    if is_gpu(target):
        # MetaSchedule's GPU rules and its VerifyGPUCode check read the device's limits from the target
        dev = device if device is not None else tvm.cuda(gpu_index())
        if device is None and not _has_cuda(dev):  # design spaces need no GPU: CUDA's limits for every sm_70+
            limits = {"max_threads_per_block": 1024, "max_shared_memory_per_block": 49152, "thread_warp_size": 32}
        else:
            limits = {"max_threads_per_block": int(dev.max_threads_per_block),
                      "max_shared_memory_per_block": int(dev.max_shared_memory_per_block),
                      "thread_warp_size": int(dev.warp_size)}
        config = {**target.export(), **limits, "max_num_threads": limits["max_threads_per_block"]}
        config["keys"] = list(config.get("keys", ()))
        return tvm.target.Target({k: v for k, v in config.items() if k != "tag"})
    if "num-cores" in target.attrs:
        return target
    config = {"kind": "llvm", **{k: v for k, v in target.export().items() if k in ("mcpu", "mtriple", "mattr")}}
    config["num-cores"] = max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)
    return tvm.target.Target(config)


def _has_cuda(dev: Any) -> bool:
    """True when TVM sees the CUDA device ``dev`` (False on a machine without CUDA or a GPU)."""
    try:
        return bool(dev.exist)
    except Exception:  # TVM built without CUDA here: "Device API cuda is not enabled"
        return False


def is_gpu(target: Any) -> bool:
    """True for CUDA targets."""
    return target.kind.name == "cuda"


def device_for(target: Any) -> Any:
    """The TVM device a target runs on."""
    import tvm

    return tvm.cuda(gpu_index()) if is_gpu(target) else tvm.cpu(0)


def target_key(target: Any) -> str:
    """Short name of a target (``llvm`` or ``cuda``)."""
    return str(target.kind.name)


def canonical_target(target: Any) -> str:
    """The full target as canonical JSON (kind and every attribute, keys sorted): what the dataset records."""
    return json.dumps(json.loads(str(target)), sort_keys=True, separators=(",", ":"))
