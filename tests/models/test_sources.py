"""Every model source: names, shapes, errors."""

from __future__ import annotations

import hashlib
import http.server
import threading
from pathlib import Path

import numpy as np
import pytest

from helpers import onnx_reference, replay_vs_vm, tiny_onnx_bytes
from opbench import OpBenchError
from opbench.models import get_source, list_sources, load_workload


def test_sources_are_listed():
    sources = list_sources()
    assert {"local", "simple", "remoteonnx", "transformers"} <= set(sources)
    expected = {"resnet-18", "resnet-34", "resnet-50", "mobilenet", "squeezenet_v1.1",
                "inception_v3", "googlenet", "vgg-16", "densenet-121", "nasnet", "randwire"}
    assert expected <= set(sources["local"])
    assert {"matmul", "matmul_matmul_add", "ios_block", "branchy"} <= set(sources["simple"])


@pytest.mark.parametrize("source, name, message", [
    ("nosuch", "resnet-18", "unknown model source 'nosuch' (accepted: local, remoteonnx, simple, transformers)"),
    ("local", "resnet-19", "unknown model 'resnet-19' for source 'local' (accepted: convnext_tiny, densenet-121"),
    ("simple", "branchy:width=3", "unknown option 'width'"),
    ("simple", "branchy:branches=0", "must be a positive integer"),
    ("transformers", "llama", "unknown model 'llama' for source 'transformers'"),
])
def test_unknown_names(source, name, message):
    with pytest.raises(OpBenchError, match=None) as info:
        load_workload(source, name, 1)
    assert message in str(info.value)


@pytest.mark.parametrize("batch", ["0", "-2", "abc", "1.5", 0])
def test_bad_batch_size(batch):
    with pytest.raises(OpBenchError, match="bad batch size"):
        load_workload("simple", "matmul", batch)


def test_simple_shapes_and_batch():
    w = load_workload("simple", "branchy:branches=3,depth=2,channels=8,size=6", 2)
    assert w.inputs[0].shape == (2, 3, 6, 6)
    assert w.provenance["options"] == {"branches": 3, "depth": 2, "channels": 8, "size": 6}
    assert w.name == "branchy" and w.options == {"branches": 3, "depth": 2, "channels": 8, "size": 6, "seed": 0}
    m = load_workload("simple", "matmul", 1)
    assert m.inputs[0].shape == (1, 1024, 1024)


@pytest.mark.slow
def test_local_model_matches_torch(llvm_target):
    torch = pytest.importorskip("torch")
    w = load_workload("local", "resnet18", 1, image_size=64)
    assert w.name == "resnet-18" and w.inputs[0].shape == (1, 3, 64, 64)
    err, outs, _ = replay_vs_vm(w, llvm_target)
    assert err < 1e-5
    with torch.no_grad():
        ref = w.torch_module(torch.from_numpy(w.example_inputs()[0])).numpy()
    assert np.abs(outs[0] - ref).max() / np.abs(ref).max() < 1e-4
    # batch-norm statistics were re-estimated: different inputs give clearly different outputs
    x2 = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        other = w.torch_module(x2).numpy()
    assert np.abs(other - ref).max() > 1e-2 * np.abs(ref).max()


def test_onnx_local_file(tmp_path, llvm_target):
    data = tiny_onnx_bytes()
    path = tmp_path / "tiny.onnx"
    path.write_bytes(data)
    w = load_workload("remoteonnx", str(path), 2)
    assert w.inputs[0].shape == (2, 3, 8, 8)
    assert w.provenance["sha256"] == hashlib.sha256(data).hexdigest()
    err, outs, graph = replay_vs_vm(w, llvm_target)
    assert err < 1e-5
    ref = onnx_reference(data, w.example_inputs()[0])
    np.testing.assert_allclose(outs[0], ref, rtol=1e-4, atol=1e-4)
    assert graph[0].kind == "conv2d"


class _Handler(http.server.BaseHTTPRequestHandler):
    payload = b""
    hits = 0

    def do_GET(self):  # noqa: N802
        type(self).hits += 1
        if self.path != "/tiny.onnx":
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.payload)))
        self.end_headers()
        self.wfile.write(self.payload)

    def log_message(self, *args):
        pass


@pytest.fixture
def onnx_server():
    _Handler.payload = tiny_onnx_bytes()
    _Handler.hits = 0
    server = http.server.HTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", _Handler
    server.shutdown()


def test_onnx_url_is_downloaded_once_and_cached(onnx_server, tmp_path):
    base, handler = onnx_server
    url = f"{base}/tiny.onnx"
    digest = hashlib.sha256(handler.payload).hexdigest()
    w = load_workload("remoteonnx", url, 1, cache_dir=tmp_path)
    assert w.provenance["sha256"] == digest
    assert (tmp_path / f"{digest}.onnx").read_bytes() == handler.payload
    assert handler.hits == 1
    load_workload("remoteonnx", url, 1, cache_dir=tmp_path)
    assert handler.hits == 1  # second load reads the cache
    load_workload("onnx", url, 1, cache_dir=tmp_path, sha256=digest)
    assert handler.hits == 1


def test_onnx_url_errors(onnx_server, tmp_path):
    base, _ = onnx_server
    with pytest.raises(OpBenchError, match="download failed for .*missing.onnx"):
        load_workload("remoteonnx", f"{base}/missing.onnx", 1, cache_dir=tmp_path)
    with pytest.raises(OpBenchError, match="checksum mismatch"):
        load_workload("remoteonnx", f"{base}/tiny.onnx", 1, cache_dir=tmp_path, sha256="0" * 64)
    assert not list(Path(tmp_path).glob("*.onnx"))  # nothing bad left in the cache
    with pytest.raises(OpBenchError, match="download failed"):
        load_workload("remoteonnx", "http://127.0.0.1:9/none.onnx", 1, cache_dir=tmp_path)


def test_onnx_bad_files(tmp_path):
    with pytest.raises(OpBenchError, match="ONNX file not found"):
        load_workload("remoteonnx", str(tmp_path / "absent.onnx"), 1)
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"this is not a protobuf")
    with pytest.raises(OpBenchError, match="invalid ONNX file"):
        load_workload("remoteonnx", str(bad), 1)


@pytest.mark.parametrize("name", ["bert-small", "roberta-small", "gpt2-small"])
@pytest.mark.slow
def test_transformers_match_torch(name, llvm_target):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    w = load_workload("transformers", name, 1, seqlen=16)
    assert w.inputs[0].shape == (1, 16) and w.inputs[0].dtype == "int64"
    err, outs, _ = replay_vs_vm(w, llvm_target)
    assert err < 1e-5
    with torch.no_grad():
        ref = w.torch_module(torch.from_numpy(w.example_inputs()[0])).numpy()
    assert np.abs(outs[0] - ref).max() / np.abs(ref).max() < 1e-4


def test_transformers_seqlen_too_long():
    pytest.importorskip("transformers")
    with pytest.raises(OpBenchError, match="sequence length 100000 too long"):
        load_workload("transformers", "bert-small", 1, seqlen=100000)


def test_source_object_passes_through():
    src = get_source("simple")
    assert get_source(src) is src
    assert load_workload(src, "ios_block", 1).source == "simple"


def test_fingerprint_canonical_and_honest():
    """Defaults spelled out or left out give one workload; any option that changes the graph another."""
    a = load_workload("simple", "branchy:branches=2,depth=2,channels=4,size=6", 1)
    b = load_workload("simple", "branchy:size=6,channels=4,depth=2,branches=2", 1)
    assert a.workload_id == b.workload_id
    plain = load_workload("simple", "matmul:n=32", 1)
    assert load_workload("simple", "matmul:n=32", 1, seed=0).workload_id == plain.workload_id
    assert load_workload("simple", "matmul", 1).workload_id == load_workload("simple", "matmul:n=1024", 1).workload_id
    others = [load_workload("simple", "matmul:n=64", 1), load_workload("simple", "matmul:n=32", 2),
              load_workload("simple", "matmul:n=32", 1, seed=1)]
    assert len({plain.workload_id, *(w.workload_id for w in others)}) == 4


def test_two_onnx_files_with_one_name_are_two_workloads(tmp_path):
    for i in (1, 2):
        (tmp_path / f"d{i}").mkdir()
        (tmp_path / f"d{i}" / "model.onnx").write_bytes(tiny_onnx_bytes(seed=i))
    a = load_workload("remoteonnx", str(tmp_path / "d1" / "model.onnx"), 1)
    b = load_workload("remoteonnx", str(tmp_path / "d2" / "model.onnx"), 1)
    assert a.name == b.name == "model.onnx"
    assert a.workload_id != b.workload_id and a.options["sha256"] != b.options["sha256"]


@pytest.mark.parametrize("source, name, options", [
    ("simple", "matmul:n=1000000", {}),
    ("local", "resnet-18", {"image_size": 100000}),
    ("simple", "matmul", {"batch": 100000}),
])
def test_too_big_for_memory_is_refused_before_allocating(source, name, options):
    batch = options.pop("batch", 1)
    with pytest.raises(OpBenchError, match=r"needs about .* GiB of memory, more than the .* GiB available"):
        load_workload(source, name, batch, **options)


def test_model_name_with_control_character():
    with pytest.raises(OpBenchError, match=r"model name 'mat\\nmul' contains a control character"):
        load_workload("simple", "mat\nmul", 1)
