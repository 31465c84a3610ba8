"""What the benchmark scripts share: running one ``opbench`` command with a time limit, its output logged."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def shown(path: str | Path) -> str:
    """``path`` as a JSON result records it: relative to the repository when inside it."""
    full = Path(path).resolve()
    return str(full.relative_to(ROOT)) if full.is_relative_to(ROOT) else str(path)


def bad_input(message: str) -> None:
    """Stop on bad input before any work: ``error: MESSAGE`` on stderr, exit code 2 (as argparse does)."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def run_opbench(args: list[str], env: dict[str, str], log: Path, limit: float, wrap: list[str] | None = None
                ) -> tuple[int | str, float, str]:
    """Run ``opbench ARGS`` (under ``wrap``, e.g. ``nsys profile ...``) from the repository root, appending the
    command and its output to ``log``; its exit code (or ``"timeout"``), wall seconds and output."""
    cmd = [*(wrap or []), sys.executable, "-m", "opbench", *args]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=limit)
        code: int | str = proc.returncode
        text = proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        code = "timeout"
        text = "".join(p.decode(errors="replace") if isinstance(p, bytes) else p for p in (exc.stdout, exc.stderr)
                       if p)
    wall = time.perf_counter() - start
    with open(log, "a") as fh:
        fh.write(f"$ {' '.join(cmd)}\n{text}\n(exit {code}, {wall:.1f} s)\n\n")
    print(f"opbench {' '.join(args[:3])} ...: exit {code} in {wall:.1f} s", flush=True)
    return code, wall, text
