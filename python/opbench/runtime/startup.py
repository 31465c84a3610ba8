"""Start tuning in seconds: import TVM's tensor intrinsics without the cost of ``inspect.stack``.

MetaSchedule's ``TuneContext`` imports ``tvm.s_tir.tensor_intrin`` (every tensor-core and SIMD
intrinsic, written in TVMScript) the first time a context is made. TVMScript's decorators call
``inspect.stack()`` once per parsed function to look at the frames that define it, and
``inspect.stack()`` resolves the source file and module of every frame on the stack, walking
``sys.modules`` (thousands of modules once torch is imported). That import took 18-65 s on a
2-core machine, nearly all of it in ``inspect``.

:func:`import_tensor_intrinsics` does the same import while ``inspect.stack`` returns the same
frames with their file, line, function and one line of source context read through ``linecache``,
which is what the decorators read, without resolving modules. TVM's code is not changed; the
original ``inspect.stack`` is back when the import ends.
"""

from __future__ import annotations

import contextlib
import inspect
import linecache
import sys
from collections.abc import Iterator
from typing import Any

_MODULE = "tvm.s_tir.tensor_intrin"


def _frames(context: int = 1, skip: int = 2) -> list[inspect.FrameInfo]:
    """``inspect.stack(context)``'s frames, each with at most one line of source read from the line cache."""
    out = []
    frame: Any = sys._getframe(skip)  # noqa: SLF001 (the caller of inspect.stack)
    while frame is not None:
        filename, lineno = frame.f_code.co_filename, frame.f_lineno
        line = linecache.getline(filename, lineno, frame.f_globals) if context > 0 else ""
        code = [line] if line else None
        out.append(inspect.FrameInfo(frame, filename, lineno, frame.f_code.co_name, code, 0 if code else None))
        frame = frame.f_back
    return out


@contextlib.contextmanager
def cheap_inspect_stack() -> Iterator[None]:
    """While the block runs, ``inspect.stack`` does not resolve every frame's module (module docstring)."""
    original = inspect.stack

    def stack(context: int = 1) -> list[inspect.FrameInfo]:
        return _frames(context)

    inspect.stack = stack
    try:
        yield
    finally:
        inspect.stack = original


def import_tensor_intrinsics() -> None:
    """Import ``tvm.s_tir.tensor_intrin`` quickly (once per process; see the module docstring).

    Call it before making a MetaSchedule ``TuneContext``, which imports the module itself.
    """
    if _MODULE in sys.modules:
        return
    with cheap_inspect_stack():
        import tvm.s_tir.tensor_intrin  # noqa: F401


__all__ = ["cheap_inspect_stack", "import_tensor_intrinsics"]
