"""The ``opbench`` command line (:mod:`.main`; the console command starts in :mod:`.entry`)."""

from __future__ import annotations

from typing import Any

__all__ = ["build_parser", "main"]


def __getattr__(name: str) -> Any:  # lazy: the console command records signals before the parser's imports
    if name in __all__:
        from . import main as module

        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
