"""The ``remoteonnx`` source: an ONNX file from a local path or an http(s) URL.

Downloads are cached under a cache directory by the SHA-256 of their content (``<sha256>.onnx``),
with a small index from URL to checksum, so a second run reads the cache without the network.
``sha256=`` checks the file (and finds it in the cache without downloading).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from ..errors import OpBenchError
from .base import InputSpec, ModelSource, Workload

_ONNX_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 6: "int32", 7: "int64", 9: "bool", 10: "float16",
                11: "float64"}


def default_cache_dir() -> Path:
    """``$OPBENCH_CACHE`` or ``~/.cache/opbench``, with an ``onnx`` subfolder."""
    root = os.environ.get("OPBENCH_CACHE") or os.path.join(Path.home(), ".cache", "opbench")
    return Path(root) / "onnx"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fetch(location: str, cache_dir: Path | None = None, sha256: str | None = None,
          timeout: float = 60.0) -> tuple[Path, str]:
    """Return a local path to the ONNX file at ``location`` (path or URL) and its SHA-256."""
    want = sha256.lower().strip() if sha256 else None
    if not location.startswith(("http://", "https://")):
        path = Path(location).expanduser()
        if not path.is_file():
            raise OpBenchError(f"ONNX file not found: '{location}' (accepted: a path or an http(s) URL)")
        digest = _sha256(path)
        if want and digest != want:
            raise OpBenchError(f"checksum mismatch for '{location}': sha256 {digest}, expected {want}")
        return path, digest
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    index_path = cache / "index.json"
    index = json.loads(index_path.read_text()) if index_path.is_file() else {}
    known = want or index.get(location)
    if known and (cache / f"{known}.onnx").is_file():
        return cache / f"{known}.onnx", known
    fd, tmp_name = tempfile.mkstemp(dir=cache, suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(location, timeout=timeout) as resp:
            for chunk in iter(lambda: resp.read(1 << 20), b""):
                out.write(chunk)
        digest = _sha256(Path(tmp_name))
        if want and digest != want:
            raise OpBenchError(f"checksum mismatch for '{location}': sha256 {digest}, expected {want}")
        final = cache / f"{digest}.onnx"
        os.replace(tmp_name, final)
    except (urllib.error.URLError, OSError, ValueError) as err:
        reason = getattr(err, "reason", None) or err
        raise OpBenchError(f"download failed for '{location}': {reason}") from None
    finally:
        if os.path.exists(tmp_name):
            os.unlink(tmp_name)
    index[location] = digest
    index_path.write_text(json.dumps(index, indent=1))
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

    name = "remoteonnx"
    aliases = ("onnx",)

    def models(self) -> list[str]:
        return ["<path to a .onnx file>", "<http(s) URL of a .onnx file>"]

    def load(self, name: str, batch_size: int = 1, **options: Any) -> Workload:
        import onnx

        path, digest = fetch(name, options.get("cache_dir"), options.get("sha256"))
        try:
            model = onnx.load(str(path))
            onnx.checker.check_model(model)
        except Exception as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
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
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise OpBenchError(f"TVM's ONNX importer failed for '{name}': {first}") from None
        return Workload(
            name=Path(name).name if not name.startswith("http") else name.rsplit("/", 1)[-1],
            source=self.name,
            mod=mod,
            inputs=specs,
            batch_size=batch_size,
            provenance={"location": name, "sha256": digest, "opset": [o.version for o in model.opset_import]},
        )
