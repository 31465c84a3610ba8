"""The ``remoteonnx`` source: an ONNX file from a local path or an http(s) URL.

Downloads are cached under a cache directory by the SHA-256 of their content (``<sha256>.onnx``),
with a small index from URL to checksum, so a second run reads the cache without the network.
``sha256=`` checks the file on every use, cache hits included.

Safety rules: only http(s) URLs (redirects included) without spaces or control characters; a body
shorter than its ``Content-Length`` is never cached; a download larger than the size cap
(``max_download_mb=`` or ``$OPBENCH_MAX_DOWNLOAD_MB``, default 2048) stops with an error; query
strings (tokens) are never written to the index or the dataset; the index is updated under a file
lock and atomically, and a corrupt index is rebuilt.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import OpBenchError, first_line
from ..utils import cache_root, file_sha256
from .base import InputSpec, ModelSource, Workload

log = logging.getLogger(__name__)

_ONNX_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 6: "int32", 7: "int64", 9: "bool", 10: "float16",
                11: "float64", 16: "bfloat16"}
_SHA256 = re.compile(r"[0-9a-f]{64}")
_BAD_URL_CHARS = re.compile(r"[\s\x00-\x1f\x7f]")
DEFAULT_MAX_DOWNLOAD_MB = 2048
STALE_PART_S = 3600.0


def default_cache_dir() -> Path:
    """``$OPBENCH_CACHE`` or ``~/.cache/opbench``, with an ``onnx`` subfolder."""
    return cache_root() / "onnx"


def check_sha256(text: str | None) -> str | None:
    """``--sha256`` as 64 lower-case hex digits (or None)."""
    if text is None:
        return None
    value = str(text).strip().lower()
    if not _SHA256.fullmatch(value):
        raise OpBenchError(f"bad --sha256 {text!r} (accepted: 64 hexadecimal digits)")
    return value


def redact(url: str) -> str:
    """``url`` without its query string and fragment: a query is replaced by a digest of it, so two
    URLs that differ only in their query stay apart while tokens are never stored."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:  # not a URL Python can split (a malformed IPv6 host): keep what precedes ? and #
        base, _, rest = url.partition("?") if "?" in url else url.partition("#")
        query = f"?q-sha256={hashlib.sha256(rest.encode()).hexdigest()[:12]}" if rest else ""
        return base.partition("#")[0] + query
    query = f"?q-sha256={hashlib.sha256(parts.query.encode()).hexdigest()[:12]}" if parts.query else ""
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path, "", "")) + query


def check_url(url: str) -> None:
    """Refuse anything but a plain http(s) URL, in one line."""
    if _BAD_URL_CHARS.search(url):
        raise OpBenchError(f"bad URL {url!r}: it contains spaces or control characters (accepted: an http(s) URL)")
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 (a bad port raises here)
    except ValueError as err:
        raise OpBenchError(f"bad URL {redact(url)!r}: {err} (accepted: an http(s) URL with a host)") from None
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise OpBenchError(f"bad URL {redact(url)!r} (accepted: an http(s) URL with a host)")


class _HttpOnlyRedirects(urllib.request.HTTPRedirectHandler):
    """Follow redirects to http(s) only."""

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> Any:
        newurl = urllib.parse.urljoin(req.full_url, newurl)
        if urllib.parse.urlsplit(newurl).scheme not in ("http", "https") or _BAD_URL_CHARS.search(newurl):
            raise OpBenchError(f"download of {redact(req.full_url)!r} redirects to {redact(newurl)!r}, "
                               "which is not an http(s) URL")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _max_bytes(max_download_mb: float | None) -> int:
    text = max_download_mb if max_download_mb is not None else os.environ.get("OPBENCH_MAX_DOWNLOAD_MB")
    try:
        value = float(text) if text is not None else DEFAULT_MAX_DOWNLOAD_MB
    except ValueError:
        value = -1
    if not value > 0 or value == float("inf"):
        raise OpBenchError(f"bad download size cap {text!r} (accepted: a positive number of MB)")
    return int(value * (1 << 20))


@contextlib.contextmanager
def _locked(cache: Path) -> Iterator[None]:
    """An exclusive lock on the cache index (other processes and threads wait)."""
    from filelock import FileLock

    with FileLock(cache / "index.lock"):
        yield


def _read_index(path: Path) -> dict[str, str]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
        if isinstance(data, dict) and all(isinstance(v, str) for v in data.values()):
            return data
    except (OSError, ValueError):
        pass
    log.warning("download cache index %s is corrupt; rebuilding it", path)
    return {}


def _update_index(cache: Path, url: str, digest: str) -> None:
    index_path = cache / "index.json"
    with _locked(cache):
        index = _read_index(index_path)
        index[url] = digest
        fd, tmp = tempfile.mkstemp(dir=cache, suffix=".index")
        with os.fdopen(fd, "w") as out:
            json.dump(index, out, indent=1)
        os.replace(tmp, index_path)


def _clean_parts(cache: Path) -> None:
    """Remove ``.part`` files that an interrupted download left behind (older than an hour)."""
    now = time.time()
    for part in cache.glob("*.part"):
        with contextlib.suppress(OSError):
            if now - part.stat().st_mtime > STALE_PART_S:
                part.unlink()


def _cached(cache: Path, digest: str | None, want: str | None) -> Path | None:
    """The cached file for ``digest`` if its content still has that checksum (else it is removed)."""
    if not digest:
        return None
    path = cache / f"{digest}.onnx"
    if not path.is_file():
        return None
    actual = file_sha256(path)
    if actual != digest:
        log.warning("cached file %s is corrupt (sha256 %s); downloading again", path, actual)
        path.unlink(missing_ok=True)
        return None
    if want and actual != want:
        return None
    return path


def _check_onnx(path: Path, name: str) -> None:
    """Refuse a file that does not parse as an ONNX model with a graph (one line naming it)."""
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as err:
        first = first_line(err)
        raise OpBenchError(f"{name!r} is not an ONNX model ({first}); nothing cached") from None
    if not model.ir_version or not model.graph.node:
        raise OpBenchError(f"{name!r} is not an ONNX model (no graph); nothing cached")


def fetch(location: str, cache_dir: Path | None = None, sha256: str | None = None,
          timeout: float = 60.0, max_download_mb: float | None = None) -> tuple[Path, str]:
    """Return a local path to the ONNX file at ``location`` (path or URL) and its SHA-256."""
    want = check_sha256(sha256)
    if not location.startswith(("http://", "https://")) and "://" not in location:
        path = Path(location).expanduser()
        if not path.is_file():
            raise OpBenchError(f"ONNX file not found: {location!r} (accepted: a path or an http(s) URL)")
        digest = file_sha256(path)
        if want and digest != want:
            raise OpBenchError(f"checksum mismatch for {location!r}: sha256 {digest}, expected {want}")
        return path, digest
    check_url(location)
    limit = _max_bytes(max_download_mb)
    public = redact(location)
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OpBenchError(f"cannot create download cache {str(cache)!r}: {err.strerror}") from None
    _clean_parts(cache)
    with _locked(cache):
        known = want or _read_index(cache / "index.json").get(public)
    hit = _cached(cache, known, want)
    if hit is not None:
        return hit, hit.stem
    fd, tmp_name = tempfile.mkstemp(dir=cache, suffix=".part")
    opener = urllib.request.build_opener(_HttpOnlyRedirects())
    try:
        with os.fdopen(fd, "wb") as out, opener.open(location, timeout=timeout) as resp:
            length = resp.headers.get("Content-Length")
            expected = int(length) if length and length.isdigit() else None
            if expected is not None and expected > limit:
                raise OpBenchError(f"download of {public!r} is {expected / 2**20:.1f} MB, over the cap of "
                                   f"{limit / 2**20:.0f} MB (raise --max-download-mb or $OPBENCH_MAX_DOWNLOAD_MB)")
            got = 0
            for chunk in iter(lambda: resp.read(1 << 20), b""):
                got += len(chunk)
                if got > limit:
                    raise OpBenchError(f"download of {public!r} passed the cap of {limit / 2**20:.0f} MB "
                                       "(raise --max-download-mb or $OPBENCH_MAX_DOWNLOAD_MB)")
                out.write(chunk)
        if expected is not None and got != expected:
            raise OpBenchError(f"download of {public!r} was cut short: {got} of {expected} bytes; nothing cached")
        digest = file_sha256(Path(tmp_name))
        if want and digest != want:
            raise OpBenchError(f"checksum mismatch for {public!r}: sha256 {digest}, expected {want}")
        _check_onnx(Path(tmp_name), public)  # an HTML page or anything else is refused before it is cached
        final = cache / f"{digest}.onnx"
        os.replace(tmp_name, final)
    except urllib.error.HTTPError as err:
        raise OpBenchError(f"download failed for {public!r}: HTTP {err.code} {' '.join(str(err.reason).split())}") \
            from None
    except (urllib.error.URLError, OSError, ValueError) as err:
        reason = getattr(err, "reason", None) or err
        raise OpBenchError(f"download failed for {public!r}: {' '.join(str(reason).split())}") from None
    except Exception as err:  # http.client raises its own errors on a broken connection
        if isinstance(err, OpBenchError):
            raise
        raise OpBenchError(f"download failed for {public!r}: {type(err).__name__} "
                           f"{' '.join(str(err).split())}") from None
    finally:
        if os.path.exists(tmp_name):
            os.unlink(tmp_name)
    _update_index(cache, public, digest)
    return final, digest


class OnnxSource(ModelSource):
    """ONNX models (OpBench's ``--modelsource remoteonnx``); ``--modelname`` is a path or URL.

    Options
    -------
    sha256 : str
        Expected SHA-256 of the file.
    cache_dir : str
        Download cache (default ``$OPBENCH_CACHE/onnx`` or ``~/.cache/opbench/onnx``).
    """

    dtypes = ("float32",)  # an ONNX model keeps the dtypes it was exported with

    name = "remoteonnx"
    aliases = ("onnx",)

    def models(self) -> list[str]:
        return ["<path to a .onnx file>", "<http(s) URL of a .onnx file>"]

    def load(self, name: str, batch_size: int = 1, **options: Any) -> Workload:
        import onnx

        path, digest = fetch(name, options.get("cache_dir"), options.get("sha256"),
                             max_download_mb=options.get("max_download_mb"))
        try:
            model = onnx.load(str(path))
            onnx.checker.check_model(model)
        except Exception as err:
            first = first_line(err)
            raise OpBenchError(f"invalid ONNX file '{name}': {first}") from None
        inits = {init.name for init in model.graph.initializer}
        specs = []
        for value in model.graph.input:
            if value.name in inits:
                continue
            ttype = value.type.tensor_type
            shape = []
            for i, dim in enumerate(ttype.shape.dim):
                if dim.HasField("dim_value") and dim.dim_value > 0:
                    shape.append(int(dim.dim_value))
                elif i == 0:
                    shape.append(batch_size)  # symbolic leading dimension = batch
                else:
                    raise OpBenchError(
                        f"ONNX input '{value.name}' has a symbolic dimension {i} "
                        f"('{dim.dim_param}'); only the batch dimension may be symbolic"
                    )
            dtype = _ONNX_DTYPES.get(ttype.elem_type)
            if dtype is None:
                raise OpBenchError(f"ONNX input '{value.name}' has unsupported element type {ttype.elem_type}")
            specs.append(InputSpec(value.name, tuple(shape), dtype))
        from tvm.relax.frontend.onnx import from_onnx

        try:
            mod = from_onnx(model, {s.name: list(s.shape) for s in specs},
                            {s.name: s.dtype for s in specs})
        except Exception as err:
            first = first_line(err)
            raise OpBenchError(f"TVM's ONNX importer failed for '{name}': {first}") from None
        is_url = "://" in name
        location = redact(name) if is_url else str(Path(name).expanduser().resolve())
        label = urllib.parse.urlsplit(name).path.rsplit("/", 1)[-1] if is_url else Path(name).name
        return Workload(
            name=label or "model.onnx",
            source=self.name,
            mod=mod,
            inputs=specs,
            batch_size=batch_size,
            provenance={"location": location, "sha256": digest, "opset": [o.version for o in model.opset_import]},
            options={"sha256": digest},
        )
