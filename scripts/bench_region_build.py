"""How long a fused build's regions take when their compiled code is stored: a zoo model's ``FusedBackend``
built in new processes, one after another, on the CPU or the GPU.

1. A first build fills an empty store of compiled regions (``$OPBENCH_CACHE`` of its own under ``--out``).
2. Then ``--rounds`` pairs of warm builds, alternating: one finds each region's stored code through its quick
   key (the store's index), the other with the index removed, so that every region is traced to ATen again.
3. With ``--bytecode-cache``, each round also has a quick-key build whose Python writes and reads the bytecode
   of the modules it imports in a folder of its own (``PYTHONPYCACHEPREFIX``, filled by a build before the rounds):
   where torch is installed without its modules' bytecode (``bytecode_cached`` false in the rows) and Python
   may not write it (``PYTHONDONTWRITEBYTECODE``), every new process compiles the sources of the Inductor
   modules it imports, which a usual install does not.

Each build is a new process (as a user's second build is), timed by the build itself: the regions' seconds
and where they went (``FusedBackend.compile_seconds``). ``OUT/bench_region_build.json`` has every build and
the medians.

    PYTHONPATH=python python3 scripts/bench_region_build.py --out out --model googlenet
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path


def build(name: str, batch: int, device: str, dtype: str) -> dict:
    """One ``FusedBackend`` of the model in this process: its seconds and how its regions were built."""
    import torch

    from opbench.models import get_source
    from opbench.runtime.fused import FusedBackend, torch_bytecode_found

    torch.manual_seed(0)
    model, x = get_source("local").torch_model(name, batch, dtype=dtype)
    model, x = model.to(device).eval(), x.to(device)
    start = time.perf_counter()
    fused = FusedBackend(model, [x])
    return {"build_s": time.perf_counter() - start, "regions_s": fused.compile_s, "regions": len(fused.regions),
            "built": fused.built, "seconds": fused.compile_seconds,
            "bytecode_cached": torch_bytecode_found(),  # after the build, which imported the modules
            "pycache_prefix": sys.pycache_prefix, "dont_write_bytecode": sys.dont_write_bytecode}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for bench_region_build.json and the store")
    parser.add_argument("--model", default="googlenet", help="a zoo model")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--device", default="cuda", help="cuda or cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--rounds", type=int, default=2, help="pairs of warm builds")
    parser.add_argument("--bytecode-cache", action="store_true",
                        help="also a quick-key build per round with a bytecode folder of its own (PYTHONPYCACHEPREFIX)")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(build(args.model, args.batch, args.device, args.dtype)))
        return 0
    out = Path(args.out)
    store = out / "cache"
    shutil.rmtree(store, ignore_errors=True)
    env = dict(os.environ, OPBENCH_CACHE=str(store))
    cmd = [sys.executable, __file__, "--out", str(out), "--model", args.model, "--batch", str(args.batch),
           "--device", args.device, "--dtype", args.dtype, "--one"]

    pycache = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    pycache["PYTHONPYCACHEPREFIX"] = str((out / "pycache").resolve())

    def one(label: str, environ: dict | None = None) -> dict:
        clock = time.perf_counter()
        done = subprocess.run(cmd, env=environ or env, capture_output=True, text=True, check=False)
        if done.returncode:
            sys.stderr.write(done.stderr[-3000:])
            raise SystemExit(f"the {label} build failed ({done.returncode})")
        row = dict(json.loads(done.stdout.strip().splitlines()[-1]), build=label,
                   process_s=time.perf_counter() - clock)
        print(f"{label:>12}: process {row['process_s']:.2f} s, build {row['build_s']:.2f} s, "
              f"regions {row['regions_s']:.2f} s {row['built']} "
              f"{ {k: round(v, 2) for k, v in row['seconds'].items()} }", flush=True)
        return row

    rows: list[dict] = []
    labels = ["quick keys", "traced"]
    if args.bytecode_cache:
        labels.insert(1, "quick keys, bytecode cached")

    def keep(row: dict) -> None:
        """Add a build and write the JSON again, so that a run stopped part-way keeps every finished build."""
        rows.append(row)
        medians = {f"median_{key}": {label: statistics.median(r[key] for r in rows if r["build"] == label)
                                     for label in labels if any(r["build"] == label for r in rows)}
                   for key in ("regions_s", "build_s", "process_s")}
        doc = {"command": "PYTHONPATH=python python3 scripts/bench_region_build.py " + " ".join(sys.argv[1:]),
               "model": args.model, "batch": args.batch, "device": args.device, "dtype": args.dtype,
               "cores": os.cpu_count(), "builds": rows, **medians}
        from opbench.utils import written_whole

        with written_whole(out / "bench_region_build.json") as part:
            part.write_text(json.dumps(doc, indent=1) + "\n")

    keep(one("first"))
    if args.bytecode_cache:
        one("bytecode warm-up", pycache)  # fills the bytecode folder; not counted
    for _ in range(args.rounds):
        keep(one("quick keys"))
        if args.bytecode_cache:
            keep(one("quick keys, bytecode cached", pycache))
        shutil.rmtree(store / "regions" / "index", ignore_errors=True)
        keep(one("traced"))
    doc = json.loads((out / "bench_region_build.json").read_text())
    for key in ("regions_s", "build_s", "process_s"):
        print(f"median {key}: { {k: round(v, 2) for k, v in doc[f'median_{key}'].items()} }")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
