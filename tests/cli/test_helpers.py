"""Small pieces of the command line: one-line messages, output paths, totals, delayed phase messages."""

from __future__ import annotations

import logging
import time

import pytest

from opbench import OpBenchError
from opbench.cli.format import check_output_path, kind_totals, one_line
from opbench.utils import announced, written_whole


def test_one_line_escapes_control_characters():
    assert one_line("a\nb\tc\x1b") == "a\\nb\\tc\\x1b"


def test_check_output_path(tmp_path):
    check_output_path(tmp_path / "ok.json", "--json")
    check_output_path("-", "--json")
    with pytest.raises(OpBenchError, match="is a folder"):
        check_output_path(tmp_path, "--json")
    with pytest.raises(OpBenchError, match="does not exist"):
        check_output_path(tmp_path / "missing" / "x.json", "--json")


def test_kind_totals():
    rows = [{"op_index": i, "func": f"f{i}", "kind": k, "latency_median_s": t}
            for i, (k, t) in enumerate([("conv2d", 3e-3), ("conv2d", 1e-3), ("pool", 0.0), ("matmul", None)])]
    totals = kind_totals(rows, top=2)
    assert [(k["kind"], k["operators"]) for k in totals["by_kind"]][0] == ("conv2d", 2)
    assert totals["by_kind"][0]["latency_ms"] == pytest.approx(4.0) and totals["by_kind"][0]["share"] == 1.0
    assert [t["op_index"] for t in totals["top_operators"]] == [0, 1]
    assert totals["top_operators"][0]["share"] == pytest.approx(0.75)


def test_announced_only_for_long_phases(caplog):
    with caplog.at_level(logging.INFO, logger="opbench"):
        with announced("quick", after_s=0.2):
            pass
        with announced("slow", after_s=0.05):
            time.sleep(0.3)
    assert [r.message for r in caplog.records] == ["slow"]


def test_a_file_is_written_whole_or_not_at_all(tmp_path):
    path = tmp_path / "new" / "f.txt"
    with written_whole(path) as part:
        part.write_text("whole")
        assert not path.exists()  # nobody sees it before the block ends
    assert path.read_text() == "whole" and list(path.parent.iterdir()) == [path]
    with pytest.raises(RuntimeError), written_whole(path) as part:
        part.write_text("half")
        raise RuntimeError("the writer failed")
    assert path.read_text() == "whole" and list(path.parent.iterdir()) == [path]  # kept, no partial left


def test_first_line_of_an_error():
    from opbench.errors import first_line

    assert first_line(RuntimeError("NVRTC compilation failed:\nwarning #1444-D ...\nerror ...")) == \
        "NVRTC compilation failed:"
    assert first_line(KeyError()) == "KeyError"  # an empty message: the type's name
    assert first_line(ValueError("\n  bad shape\n")) == "bad shape"
    assert first_line("a worker's text\nmore") == "a worker's text" and first_line("") == ""
