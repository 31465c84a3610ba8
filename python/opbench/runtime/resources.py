"""Kernel resources of compiled CUDA kernels: from the driver API, launch extents from TIR, L2 size.

Resources are read the way Opara's launch order needs them: for each kernel of an operator, its
grid and block, registers per thread, static and dynamic shared memory, and the occupancy the
driver computes for that block size (``cuOccupancyMaxActiveBlocksPerMultiprocessor``). The cubin
is compiled from the same CUDA source TVM generated (``tvm.support.nvcc``), and loaded with
``cuModuleLoadData`` through ctypes. A binary this process's build compiled is loaded as it is
(:func:`remember_cuda_binaries`): no second compilation of a model's kernels, and the figures are those
of the kernels that run.
"""

from __future__ import annotations

import collections
import ctypes
import hashlib
import re
import struct
import threading
from typing import Any

#: the CUDA binaries this process's builds compiled, by the digest of their source (the last few)
_BINARIES: collections.OrderedDict[str, bytes] = collections.OrderedDict()
_KEEP = 8
_LOCK = threading.Lock()
_INSTALLED: list[Any] = []  # the callback :func:`remember_cuda_binaries` registered, once it has


def _source_key(source: str) -> str:
    return hashlib.sha256(str(source).encode()).hexdigest()


def remember_cuda_binaries() -> None:
    """Keep the binary of every CUDA compile of this process (TVM's ``tvm_callback_cuda_compile``, whichever
    compiler is registered, wrapped) so that :func:`kernel_resources` loads it instead of compiling the
    same source again. Idempotent; a compiler registered later replaces the wrapper (then resources
    compile as before)."""
    import tvm.support.nvcc  # noqa: F401  (registers TVM's callback)
    import tvm_ffi

    current = tvm_ffi.get_global_func("tvm_callback_cuda_compile", allow_missing=True)
    if current is None or (_INSTALLED and current.same_as(_INSTALLED[0])):
        return

    def compile_and_keep(code: str, *rest: Any) -> Any:
        binary = current(code, *rest)
        with _LOCK:
            _BINARIES[_source_key(code)] = bytes(binary)
            while len(_BINARIES) > _KEEP:
                _BINARIES.popitem(last=False)
        return binary

    tvm_ffi.register_global_func("tvm_callback_cuda_compile", compile_and_keep, override=True)
    _INSTALLED[:] = [tvm_ffi.get_global_func("tvm_callback_cuda_compile")]


def compiled_binary(source: str) -> bytes | None:
    """The binary a build of this process compiled from ``source``, if it is still kept."""
    with _LOCK:
        return _BINARIES.get(_source_key(source))

_ATTR_MAX_THREADS, _ATTR_SHARED, _ATTR_LOCAL, _ATTR_REGS = 0, 1, 3, 4

#: attributes of a cubin's global ``.nv.info`` section (``EIATTR_*``) read by :func:`cubin_resources`:
#: each an SVAL of (symbol index, value)
_EIATTR = {0x2F: "registers", 0x11: "frame_bytes", 0x12: "min_stack_bytes"}
#: shared memory that sm_90's cubins reserve per block in ``.nv.shared.<kernel>`` (``.nv.shared.reserved.0``)
_RESERVED_SMEM = 1024
_SHT_SYMTAB, _SHT_NOBITS = 2, 8


def cubin_resources(image: bytes) -> dict[str, dict[str, int]]:
    """Registers per thread, stack frame and static shared memory of each kernel of a CUDA binary, read
    from the ELF file itself (no GPU, no driver): what ``ptxas -v`` prints.

    ``registers`` and ``frame_bytes`` (the local memory a thread's stack takes, spills included) come
    from the global ``.nv.info`` section; ``static_smem`` is the size of the kernel's ``.nv.shared.``
    section less the 1 KiB the sm_90 toolchain reserves there. Kernels are keyed by their symbol names.

    Raises
    ------
    ValueError
        ``image`` is not a 64-bit little-endian ELF file (a PTX text, say).
    """
    image = bytes(image)
    if image[:6] != b"\x7fELF\x02\x01":
        raise ValueError("not a cubin (a 64-bit little-endian ELF image)")

    def text(at: int) -> str:
        return image[at:image.index(b"\0", at)].decode("utf-8", "replace")

    shoff, = struct.unpack_from("<Q", image, 0x28)
    entsize, count, names_at = struct.unpack_from("<HHH", image, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", image, shoff + i * entsize) for i in range(count)]
    names_off = headers[names_at][4]
    sections = [(text(names_off + h[0]), h[1], h[4], h[5], h[6]) for h in headers]  # name, type, off, size, link
    symbols: list[str] = []
    for _, kind, off, size, link in sections:
        if kind == _SHT_SYMTAB:
            strings = sections[link][2]
            symbols = [text(strings + struct.unpack_from("<I", image, off + 24 * k)[0]) for k in range(size // 24)]
    out: dict[str, dict[str, int]] = {}
    for name, kind, off, size, _ in sections:
        if name == ".nv.info":
            at, end = off, off + size
            while at + 4 <= end:
                fmt, attr = image[at], image[at + 1]
                if fmt != 0x04:  # NVAL / BVAL / HVAL: four bytes in all
                    at += 4
                    continue
                length, = struct.unpack_from("<H", image, at + 2)
                if attr in _EIATTR and length >= 8:
                    sym, value = struct.unpack_from("<II", image, at + 4)
                    if sym < len(symbols):
                        out.setdefault(symbols[sym], {})[_EIATTR[attr]] = value
                at += 4 + length
        elif kind == _SHT_NOBITS and name.startswith(".nv.shared.") and not name.startswith(".nv.shared.reserved"):
            out.setdefault(name[len(".nv.shared."):], {})["static_smem"] = max(0, size - _RESERVED_SMEM)
    for figures in out.values():
        figures.setdefault("static_smem", 0)
    return {k: v for k, v in out.items() if "registers" in v}


def _walk(node: Any, visit: Any, depth: int = 0) -> None:
    """Pre-order walk over TIR statements (generic over statement kinds)."""
    if node is None or depth > 200:
        return
    if visit(node) is False:
        return
    for field in ("body", "block", "init", "then_case", "else_case"):
        child = getattr(node, field, None)
        if child is not None and not isinstance(child, int | float | str):
            _walk(child, visit, depth + 1)
    seq = getattr(node, "seq", None)
    if seq is not None:
        for child in seq:
            _walk(child, visit, depth + 1)


def launch_extents(prim_func: Any) -> list[dict[str, Any]]:
    """Grid, block and dynamic shared memory of each kernel a scheduled PrimFunc launches.

    Every outermost loop nest bound to ``blockIdx.*`` becomes one kernel, in program order (the
    order of TVM's ``<func>_kernel``, ``<func>_kernel_1``, ... names).
    """
    from tvm.tirx.stmt import ForKind

    kernels: list[dict[str, Any]] = []

    def bytes_of(buf: Any) -> int:
        n = 1
        for d in buf.shape:
            n *= int(d)
        return n * max(1, buf.dtype.bits // 8 if hasattr(buf.dtype, "bits") else 4)

    def in_kernel(kernel: dict[str, Any]) -> Any:
        def visit(node: Any) -> None:
            kind = getattr(node, "kind", None)
            binding = getattr(node, "thread_binding", None)
            if kind == ForKind.THREAD_BINDING and binding is not None:
                tag = binding.thread_tag
                if tag.startswith(("blockIdx", "threadIdx")):
                    kernel[tag] = max(kernel.get(tag, 1), int(node.extent))
            for buf in getattr(node, "alloc_buffers", []) or []:
                if str(buf.scope()) == "shared.dyn":
                    kernel["dynamic_smem"] += bytes_of(buf)
        return visit

    def visit(node: Any) -> bool:
        binding = getattr(node, "thread_binding", None)
        if binding is not None and binding.thread_tag.startswith("blockIdx"):
            kernel: dict[str, Any] = {"dynamic_smem": 0}
            _walk(node, in_kernel(kernel))
            kernels.append(kernel)
            return False
        return True

    _walk(prim_func.body, visit)
    out = []
    for k in kernels:
        grid = [k.get(f"blockIdx.{a}", 1) for a in "xyz"]
        block = [k.get(f"threadIdx.{a}", 1) for a in "xyz"]
        out.append({"grid": grid, "block": block, "dynamic_smem": k["dynamic_smem"]})
    return out


def kernel_index(name: str) -> int:
    """Where a kernel TVM named ``<func>_kernel`` (0) or ``<func>_kernel_<i>`` (i) stands among its function's
    launches."""
    tail = name.rsplit("_", 1)[-1]
    return int(tail) if tail.isdigit() and "_kernel_" in name else 0


def kernel_names(source: str) -> list[str]:
    """Names of the ``__global__`` functions in a CUDA source, in order, without repeats."""
    names: list[str] = []
    for match in re.finditer(r'extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(', source):
        if match.group(1) not in names:
            names.append(match.group(1))
    return names


class CudaDriver:
    """The few CUDA driver calls we need, through ctypes (a context must be current, e.g. torch's)."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        self._check(self.lib.cuInit(0), "cuInit")

    def _check(self, status: int, what: str) -> None:
        if status != 0:
            raise RuntimeError(f"{what} failed with CUDA driver error {status}")

    def load(self, image: bytes) -> ctypes.c_void_p:
        module = ctypes.c_void_p()
        self._check(self.lib.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(image)), "cuModuleLoadData")
        return module

    def function(self, module: ctypes.c_void_p, name: str) -> ctypes.c_void_p:
        func = ctypes.c_void_p()
        self._check(self.lib.cuModuleGetFunction(ctypes.byref(func), module, name.encode()),
                    f"cuModuleGetFunction({name})")
        return func

    def attribute(self, func: ctypes.c_void_p, attr: int) -> int:
        value = ctypes.c_int()
        self._check(self.lib.cuFuncGetAttribute(ctypes.byref(value), attr, func), "cuFuncGetAttribute")
        return value.value

    def active_blocks(self, func: ctypes.c_void_p, threads: int, dynamic_smem: int) -> int:
        value = ctypes.c_int()
        self._check(self.lib.cuOccupancyMaxActiveBlocksPerMultiprocessor(
            ctypes.byref(value), func, ctypes.c_int(threads), ctypes.c_size_t(dynamic_smem)),
            "cuOccupancyMaxActiveBlocksPerMultiprocessor")
        return value.value


def kernel_resources(source: str, arch: str, scheduled: Any, funcs: list[str], sm_count: int,
                     max_threads_per_sm: int) -> dict[str, dict[str, Any]]:
    """Resources of every kernel of each PrimFunc in ``funcs``, keyed by function name.

    Each value holds ``kernels`` (a list of per-kernel dicts) and the figures of the kernel with
    the most threads in flight, which stands for the operator in the dataset row.
    """
    cubin = compiled_binary(source)
    if cubin is None:  # built elsewhere (another process, a loaded library): compiled here once more
        from tvm.support.nvcc import compile_cuda

        try:
            cubin = compile_cuda(source, target_format="cubin", arch=arch, compiler="nvrtc")
        except Exception:  # NVRTC missing or without headers: the nvcc command line
            cubin = compile_cuda(source, target_format="cubin", arch=arch, compiler="nvcc")
    driver = CudaDriver()
    module = driver.load(bytes(cubin))
    names = kernel_names(source)
    out: dict[str, dict[str, Any]] = {}
    for func in funcs:
        mine = sorted((n for n in names if re.fullmatch(rf"{re.escape(func)}_kernel(_\d+)?", n)), key=kernel_index)
        extents = launch_extents(scheduled[func])
        kernels = []
        for i, name in enumerate(mine):
            handle = driver.function(module, name)
            ext = extents[i] if i < len(extents) else {"grid": [1, 1, 1], "block": [1, 1, 1], "dynamic_smem": 0}
            threads = ext["block"][0] * ext["block"][1] * ext["block"][2]
            blocks = ext["grid"][0] * ext["grid"][1] * ext["grid"][2]
            active = driver.active_blocks(handle, threads, ext["dynamic_smem"])
            kernels.append({
                "name": name, "grid": ext["grid"], "block": ext["block"], "threads": threads,
                "blocks": blocks, "registers": driver.attribute(handle, _ATTR_REGS),
                "static_smem": driver.attribute(handle, _ATTR_SHARED),
                "local_bytes": driver.attribute(handle, _ATTR_LOCAL),
                "dynamic_smem": ext["dynamic_smem"], "active_blocks_per_sm": active,
                "occupancy": active * threads / max_threads_per_sm if max_threads_per_sm else None,
                "sms_used": min(blocks, sm_count),
            })
        main = max(kernels, key=lambda k: k["blocks"] * k["threads"]) if kernels else None
        out[func] = {
            "num_kernels": len(kernels),
            "grid": [k["grid"] for k in kernels], "block": [k["block"] for k in kernels],
            "registers": main["registers"] if main else None,
            "static_smem": main["static_smem"] if main else None,
            "dynamic_smem": main["dynamic_smem"] if main else None,
            "threads": main["threads"] if main else None,
            "occupancy": main["occupancy"] if main else None,
            "sms_used": main["sms_used"] if main else None,
        }
    return out
