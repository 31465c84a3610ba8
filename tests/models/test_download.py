"""remoteonnx downloads through a loopback HTTP server: truncation, checksums on cache hits, the index
under concurrency and corruption, redirects, size cap, URLs that are refused, tokens never stored."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import threading
import time
from pathlib import Path

import pytest

from helpers import tiny_onnx_bytes
from opbench import OpBenchError
from opbench.models.remoteonnx import fetch


class _Handler(http.server.BaseHTTPRequestHandler):
    payload = b""
    hits = 0
    protocol_version = "HTTP/1.1"

    def do_GET(self):  # noqa: N802
        type(self).hits += 1
        path = self.path.split("?")[0]
        if path == "/short.onnx":  # promises more than it sends
            self.send_response(200)
            self.send_header("Content-Length", str(len(self.payload) + 100))
            self.end_headers()
            self.wfile.write(self.payload)
            self.wfile.flush()
            self.close_connection = True
            return
        if path == "/to-ftp":
            self._redirect("ftp://127.0.0.1/x.onnx")
            return
        if path == "/loop":
            self._redirect("/loop")
            return
        if path.startswith("/m") and path.endswith(".onnx"):
            self.send_response(200)
            self.send_header("Content-Length", str(len(self.payload)))
            self.end_headers()
            self.wfile.write(self.payload)
            return
        self.send_error(404)

    def _redirect(self, where):
        self.send_response(302)
        self.send_header("Location", where)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    _Handler.payload = tiny_onnx_bytes()
    _Handler.hits = 0
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_truncated_download_is_never_cached(server, tmp_path):
    with pytest.raises(OpBenchError, match="download"):
        fetch(f"{server}/short.onnx", tmp_path)
    assert not list(tmp_path.glob("*.onnx")) and not list(tmp_path.glob("*.part"))
    index = tmp_path / "index.json"
    assert not index.exists() or json.loads(index.read_text()) == {}


def test_sha256_checked_on_cache_hits(server, tmp_path):
    url = f"{server}/m1.onnx"
    path, digest = fetch(url, tmp_path)
    assert digest == hashlib.sha256(_Handler.payload).hexdigest()
    # the cached file is altered behind our back: a hit must not hand it out under the old checksum
    path.write_bytes(b"something else")
    again, digest2 = fetch(url, tmp_path, sha256=digest)
    assert digest2 == digest and hashlib.sha256(again.read_bytes()).hexdigest() == digest
    assert _Handler.hits == 2  # downloaded again
    with pytest.raises(OpBenchError, match="checksum mismatch"):
        fetch(url, tmp_path, sha256="0" * 64)


@pytest.mark.parametrize("bad", ["../../x", "abc", "g" * 64, "0" * 63])
def test_sha256_must_be_64_hex_digits(bad, tmp_path):
    with pytest.raises(OpBenchError, match="bad --sha256"):
        fetch("http://127.0.0.1:9/x.onnx", tmp_path, sha256=bad)


def test_concurrent_downloads_keep_every_url_in_the_index(server, tmp_path):
    urls = [f"{server}/m{i}.onnx" for i in range(6)]
    errors = []

    def get(url):
        try:
            fetch(url, tmp_path)
        except Exception as err:  # noqa: BLE001
            errors.append(err)

    threads = [threading.Thread(target=get, args=(u,)) for u in urls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sorted(json.loads((tmp_path / "index.json").read_text())) == sorted(urls)


def test_corrupt_index_is_rebuilt(server, tmp_path):
    (tmp_path / "index.json").write_text("{not json")
    path, _ = fetch(f"{server}/m1.onnx", tmp_path)
    assert path.is_file()
    assert list(json.loads((tmp_path / "index.json").read_text())) == [f"{server}/m1.onnx"]


def test_stale_part_files_are_cleaned(server, tmp_path):
    stale = tmp_path / "old.part"
    stale.write_bytes(b"x")
    old = time.time() - 7200
    os.utime(stale, (old, old))
    fresh = tmp_path / "new.part"
    fresh.write_bytes(b"y")
    fetch(f"{server}/m1.onnx", tmp_path)
    assert not stale.exists() and fresh.exists()  # a fresh one may belong to a download in progress


def test_size_cap(server, tmp_path, monkeypatch):
    with pytest.raises(OpBenchError, match="over the cap"):
        fetch(f"{server}/m1.onnx", tmp_path, max_download_mb=0.0001)
    monkeypatch.setenv("OPBENCH_MAX_DOWNLOAD_MB", "0.0001")
    with pytest.raises(OpBenchError, match="over the cap"):
        fetch(f"{server}/m1.onnx", tmp_path)
    monkeypatch.setenv("OPBENCH_MAX_DOWNLOAD_MB", "lots")
    with pytest.raises(OpBenchError, match="bad download size cap 'lots'"):
        fetch(f"{server}/m1.onnx", tmp_path)
    assert not list(tmp_path.glob("*.onnx"))


def test_redirects_only_to_http(server, tmp_path):
    with pytest.raises(OpBenchError, match="redirects to 'ftp://.*not an http"):
        fetch(f"{server}/to-ftp", tmp_path)
    with pytest.raises(OpBenchError, match="download failed.*HTTP 302") as info:
        fetch(f"{server}/loop", tmp_path)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("url, message", [
    ("http://127.0.0.1/a b.onnx", "spaces or control characters"),
    ("http://127.0.0.1/a\x07.onnx", "spaces or control characters"),
    ("ftp://127.0.0.1/a.onnx", "accepted: an http"),
    ("file:///etc/passwd", "accepted: an http"),
])
def test_refused_urls(url, message, tmp_path):
    with pytest.raises(OpBenchError, match=message) as info:
        fetch(url, tmp_path)
    assert "\n" not in str(info.value)


def test_query_tokens_are_never_stored(server, tmp_path):
    from opbench.models import load_workload

    url = f"{server}/m1.onnx?token=SECRET123"
    w = load_workload("remoteonnx", url, 1, cache_dir=tmp_path)
    assert "SECRET123" not in (tmp_path / "index.json").read_text()
    assert "SECRET123" not in json.dumps(w.provenance) and "SECRET123" not in w.name
    assert w.name == "m1.onnx"
    # a second token for the same path is told apart without being stored
    other, _ = fetch(f"{server}/m1.onnx?token=OTHER", tmp_path)
    index = json.loads((tmp_path / "index.json").read_text())
    assert len(index) == 2 and not any("OTHER" in k or "SECRET" in k for k in index)
    assert Path(other).is_file()
