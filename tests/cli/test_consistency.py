"""CLI habits: one name for a predictor file (old names warn and still work), --json FILE|- everywhere,
collect's grouped help, argparse choices in our one-line words, no side effect before validation."""

from __future__ import annotations

import json

import pytest

from helpers import run
from opbench.cli.main import build_parser

from ..predict.conftest import write_synthetic


def _subparsers():
    import argparse

    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices


def test_every_command_takes_json_file_or_stdout():
    for name, sub in _subparsers().items():
        flags = {s: a for a in sub._actions for s in a.option_strings}
        assert "--json" in flags, name
        action = flags["--json"]
        assert action.nargs == "?" and action.const == "-", name


def test_a_predictor_file_has_one_name():
    subs = _subparsers()
    for name in ("collect", "compare", "predict", "report"):
        assert "--predictor" in {s for a in subs[name]._actions for s in a.option_strings}, name
    old = {"collect": "--pretrained", "predict": "--model"}
    for name, flag in old.items():
        action = next(a for a in subs[name]._actions if flag in a.option_strings)
        assert action.dest == "predictor" and action.help.startswith("deprecated: use --predictor")


@pytest.fixture
def synthetic(tmp_path):
    path = tmp_path / "synthetic.sqlite"
    write_synthetic(path)
    return path


@pytest.mark.slow
def test_deprecated_names_warn_and_still_work(synthetic, tmp_path):
    out = run("train", "--dataset", str(synthetic), "--what", "latency", "--out", str(tmp_path / "l.opm"), "-q",
              script=False)
    assert out.returncode == 0, out.stderr
    args = ["--modelsource", "simple", "--modelname", "branchy", "--target", "cuda", "--json", "-"]
    new = run("predict", "--predictor", str(tmp_path / "l.opm"), *args, script=False)
    old = run("predict", "--model", str(tmp_path / "l.opm"), *args, script=False)
    assert new.returncode == old.returncode == 0, old.stderr
    assert json.loads(new.stdout)["predicted_sum_ms"] == json.loads(old.stdout)["predicted_sum_ms"]
    assert "opbench predict: warning: --model is deprecated and will be removed: use --predictor" in old.stderr
    assert "deprecated" not in new.stderr
    both = run("train", "--dataset", str(synthetic), "--what", "latency", "--device", "nothing", script=False)
    assert "--device is deprecated" in both.stderr and "nothing" in both.stderr


def test_collect_help_is_grouped():
    out = run("collect", "--help", script=False)
    groups = [line.rstrip(":") for line in out.stdout.splitlines() if line and not line.startswith(" ")
              and line.endswith(":")]
    for group in ("model", "measurement", "tuning", "remote devices (TVM RPC tracker; builds stay on this machine)",
                  "parallel schedules (--ifcompare, compare)", "output"):
        assert group in groups
    assert "{local,simple,remoteonnx,transformers}" in out.stdout  # choices: shell completion sees them


@pytest.mark.parametrize("argv, message", [
    (["compare", "--modelsource", "simple", "--modelname", "matmul", "--sm-partition", "half"],
     "unknown --sm-partition 'half' (accepted: off, auto)"),
    (["train", "--what", "speed"], "unknown --what 'speed' (accepted: latency, corun, trials)"),
    (["export", "--out", "x.csv", "--format", "xls"], "unknown --format 'xls' (accepted: csv, parquet)"),
])
def test_choices_are_one_line(argv, message):
    out = run(*argv, script=False)
    assert out.returncode == 2 and message in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_export_refuses_a_foreign_file_in_one_line(tmp_path):
    import sqlite3

    foreign = tmp_path / "other.sqlite"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE t (x)")
    out = run("export", "--dataset", str(foreign), "--out", str(tmp_path / "x.csv"), script=False)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert not (tmp_path / "x.csv").exists()


def test_json_file_is_written_where_asked(tmp_path):
    out = run("models", "--json", str(tmp_path / "m.json"), script=False)
    assert out.returncode == 0, out.stderr
    assert "resnet-18" in json.loads((tmp_path / "m.json").read_text())["local"]
    assert out.stdout.startswith("local: ")  # the list still goes to the terminal
    stdout = run("models", "--json", script=False)
    assert "resnet-18" in json.loads(stdout.stdout)["local"]
