"""OpBench-compatible entry point.

    python python/performance_collector/op_performance_collector.py --modelsource local \\
        --modelname resnet-18 --target llvm [--batchsize 1] [--iftune false] [--tuner xgb] [--trials 64]

Every flag of ``opbench collect`` is accepted too (``--help`` lists them).
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from opbench import _startup  # noqa: E402, F401  (first: a Ctrl-C from now on stops it with its one line)
from opbench.cli.main import run  # noqa: E402

if __name__ == "__main__":
    run(["collect", *sys.argv[1:]], prog="op_performance_collector.py")
