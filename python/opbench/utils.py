"""Small helpers shared by several packages."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

#: the timing percentiles every timing row carries besides the median (p50): p10, p90, p99
PERCENTILES = (10, 90, 99)


def parse_bool(text: str | bool) -> bool:
    """Parse a command-line boolean: true/false, 1/0, yes/no, on/off (any case).

    Unlike ``argparse``'s ``type=bool`` (which OpBench used), ``"false"`` is false.
    """
    if isinstance(text, bool):
        return text
    value = str(text).strip().lower()
    if value in ("true", "1", "yes", "y", "on"):
        return True
    if value in ("false", "0", "no", "n", "off"):
        return False
    raise ValueError(f"'{text}' is not a boolean (accepted: true/false, 1/0, yes/no, on/off)")


def parse_kv_options(text: str) -> dict[str, str]:
    """Parse ``key=value,key=value`` into a dict (used by ``branchy:branches=4,depth=3``)."""
    options: dict[str, str] = {}
    if not text:
        return options
    for item in text.split(","):
        if "=" not in item:
            raise ValueError(f"option '{item}' is not of the form key=value")
        key, value = item.split("=", 1)
        options[key.strip()] = value.strip()
    return options


def join_names(names: Iterable[str]) -> str:
    """Join names for an error message: ``a, b, c``."""
    return ", ".join(sorted(names))


def numpy_dtype(dtype: str) -> Any:
    """The NumPy dtype of a dtype name (``bfloat16`` through ``ml_dtypes``, as TVM uses it)."""
    import numpy as np

    if dtype == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


@contextlib.contextmanager
def written_whole(path: str | Path) -> Iterator[Path]:
    """A partial file beside ``path`` (its folder made) for the block to write: it becomes ``path`` when the
    block ends, so that no reader ever sees half a file, and is removed when the block fails."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(f"{path.name}.{os.getpid()}.part")
    try:
        yield part
        os.replace(part, path)
    finally:
        with contextlib.suppress(OSError):  # gone once replaced
            part.unlink()


def cache_root() -> Path:
    """Where OpBench keeps what it can compute again (downloads, features): ``$OPBENCH_CACHE`` or
    ``~/.cache/opbench``."""
    return Path(os.environ.get("OPBENCH_CACHE") or os.path.join(Path.home(), ".cache", "opbench"))


def worker_count(jobs: int | None, env: str, default: Callable[[], int]) -> int:
    """How many worker processes to start: ``jobs``, else ``$env`` (a whole number; empty or 0: unset), else
    ``default()``; at least one."""
    if jobs is None:
        jobs = int(os.environ.get(env) or 0) or None
    if jobs is None:
        jobs = default()
    return max(1, int(jobs))


def digest(value: Any) -> str:
    """A short stable digest of JSON-able data (16 hex digits of SHA-256 over canonical JSON)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@contextlib.contextmanager
def announced(message: str, after_s: float = 1.0) -> Iterator[None]:
    """Log ``message`` if the block is still running after ``after_s`` seconds.

    Long phases say what they are doing; a quick one that fails (bad input) leaves stderr to its
    one-line error.
    """
    timer = threading.Timer(after_s, logging.getLogger(__name__).info, (message,))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


@contextlib.contextmanager
def device_lock(what: str = "measuring") -> Iterator[None]:
    """Hold the lock file named by ``$OPBENCH_DEVICE_LOCK`` (if set) for the block.

    Several collections may share one device: they compile in parallel and take turns measuring,
    so no measurement overlaps another process's kernels. Without the variable this does nothing.
    """
    path = os.environ.get("OPBENCH_DEVICE_LOCK")
    if not path:
        yield
        return
    from filelock import FileLock, Timeout

    lock = FileLock(path)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        logging.getLogger(__name__).info("waiting for the device lock %s before %s", path, what)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def check_output_path(path: str | Path | None, flag: str) -> None:
    """Refuse an output path that cannot be written, before any work is done (``-`` is stdout).

    The check opens the file for appending (an existing file's bytes stay as they are; a new one is
    removed again), so a file the permissions allow but the file system refuses (``/proc/version``
    for root, a read-only mount) is refused too."""
    from .errors import OpBenchError

    if path is None or str(path) == "-":
        return
    p = Path(path)
    if p.is_dir():
        raise OpBenchError(f"{flag} {str(path)!r} is a folder (accepted: a file path)")
    folder = p.parent if str(p.parent) else Path(".")
    if not folder.is_dir():
        raise OpBenchError(f"{flag} {str(path)!r}: folder {str(folder)!r} does not exist")
    existed = p.exists()
    try:
        with open(p, "ab"):
            pass
    except OSError as err:
        raise OpBenchError(f"{flag} {str(path)!r} is not writable ({err.strerror})") from None
    if not existed:
        p.unlink(missing_ok=True)


#: the largest JSON file OpBench reads (a trace, held-out predictions, a predictor's metadata, a spec)
JSON_LIMIT = 64 << 20


def parse_json(text: str | bytes, what: str, kind: type = dict) -> Any:
    """``text`` parsed as JSON whose top level is a ``kind``; anything else (not JSON, not UTF-8, nested
    deeper than Python recurses, another type) is a one-line :class:`OpBenchError` naming ``what``."""
    from .errors import OpBenchError

    try:
        data = json.loads(text)
    except (ValueError, UnicodeDecodeError):
        raise OpBenchError(f"{what} is not valid JSON") from None
    except RecursionError:
        raise OpBenchError(f"{what} is nested too deeply to be read") from None
    if not isinstance(data, kind):
        raise OpBenchError(f"{what} holds a JSON {type(data).__name__}, not a JSON "
                           f"{'object' if kind is dict else kind.__name__}")
    return data


def file_sha256(path: str | Path) -> str:
    """The SHA-256 of a file's bytes (hex), read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_json(path: str | Path, what: str, kind: type = dict, limit: int = JSON_LIMIT) -> Any:
    """The JSON file at ``path`` (:func:`parse_json`), refused before it is read when it is larger than
    ``limit`` bytes."""
    from .errors import OpBenchError

    path = Path(path)
    try:
        size = path.stat().st_size
        if size > limit:
            raise OpBenchError(f"{what} is {size / 2**20:.0f} MiB, more than the {limit / 2**20:.0f} MiB OpBench "
                               "reads")
        text = path.read_bytes()
    except OSError as err:
        raise OpBenchError(f"cannot read {what}: {err.strerror or err}") from None
    return parse_json(text, what, kind)

