"""scripts/_cli.py's options of experiments whose variants take turns (exp_rebuild.py, exp_cold_build.py): the
variants checked before any work, and the medians of the builds that ran."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import _cli  # noqa: E402

VARIANTS = ("as shipped", "slower", "faster")


def _parsed(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    _cli.variant_args(parser, VARIANTS, VARIANTS[:2], "builds", timeout=60.0)
    return parser.parse_args(list(argv))


def test_variants_are_parsed_with_their_default_and_refused_in_one_line(capsys) -> None:
    args = _parsed()
    _cli.checked_variants(args, VARIANTS)
    assert args.variants == ("as shipped", "slower") and args.reps == 3 and args.child is None
    args = _parsed("--variants", " faster, as shipped ,", "--reps", "1")
    _cli.checked_variants(args, VARIANTS)
    assert args.variants == ("faster", "as shipped")
    for argv in (["--variants", "as shipped,bogus"], ["--variants", ","], ["--reps", "0"], ["--timeout", "0"]):
        with pytest.raises(SystemExit) as stopped:
            _cli.checked_variants(_parsed(*argv), VARIANTS)
        assert stopped.value.code == 2
        said = capsys.readouterr().err.strip()
        assert said.startswith("error: --") and argv[0] in said and "\n" not in said and "accepted" in said
        assert "bogus" in said or "bogus" not in argv[1]  # the wrong name is named


def test_the_medians_are_of_the_builds_that_ran_each_variant_apart() -> None:
    rows = [{"variant": "as shipped", "s": 3.0}, {"variant": "slower", "s": 9.0}, {"variant": "as shipped", "s": 5.0},
            {"variant": "as shipped", "s": 4.5}, {"variant": "as shipped", "error": "took over 60 s"},
            {"variant": "faster", "error": "no result"}]
    summary = _cli.variant_medians(rows, VARIANTS, {"s": lambda r: r["s"], "twice": lambda r: 2 * r["s"]}, "builds")
    assert summary == {"as shipped": {"s": 4.5, "twice": 9.0, "builds": 3}, "slower": {"s": 9.0, "twice": 18.0,
                                                                                     "builds": 1}}
