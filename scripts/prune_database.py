"""Keep only the fastest valid record of every workload in a MetaSchedule JSON database.

A long tuning run leaves every measured candidate in its database; a build applies only the best
one of each task, so the pruned copy builds the same kernels (and ``opbench`` gives it the same
``db:<digest>`` configuration) at a fraction of the size, e.g. to ship it in ``data/tuning/``.

    PYTHONPATH=python python3 scripts/prune_database.py SRC_DIR DST_DIR
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path


def prune(src: Path, dst: Path) -> tuple[int, int]:
    """Write the best record of each workload of ``src`` to ``dst``; (records read, records kept)."""
    import tvm_ffi
    from tvm.s_tir.meta_schedule.database import TuningRecord

    from opbench.tune.database import open_database, valid_secs

    source = open_database(src, create=False)
    records = source.get_all_tuning_records()
    best: dict[int, object] = {}
    for record in records:
        secs = valid_secs(record)
        if secs is None:
            continue
        key = tvm_ffi.structural_hash(record.workload.mod)
        if key not in best or statistics.median(secs) < statistics.median(valid_secs(best[key])):
            best[key] = record
    target = open_database(dst)
    for record in best.values():
        workload = target.commit_workload(record.workload.mod)
        target.commit_tuning_record(TuningRecord(record.trace, workload, record.run_secs, record.target,
                                                 record.args_info))
    return len(records), len(best)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("src", type=Path, help="the tuning database folder to read")
    p.add_argument("dst", type=Path, help="an empty or new folder for the pruned database")
    args = p.parse_args()
    if args.dst.exists() and any(args.dst.iterdir()):
        p.error(f"{args.dst} is not empty")
    read, kept = prune(args.src, args.dst)
    print(f"{args.src}: {read} records, kept the best of each of {kept} workloads in {args.dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
