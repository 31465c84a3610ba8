#!/usr/bin/env bash
# OpBench's collector on a small synthetic model: every operator measured, a dataset written, the
# table printed. Usage: bash examples/opbench_collect.sh [llvm|cuda] [DATASET]
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:-llvm}
dataset=${2:-/tmp/opbench-example.sqlite}
python python/performance_collector/op_performance_collector.py \
    --modelsource simple --modelname "branchy:branches=3,depth=2,channels=16,size=16" \
    --target "$target" --dataset "$dataset" --ifcompare true
python -c "import opbench; df = opbench.load('$dataset', 'operators'); print(df[['op_index', 'kind', 'latency_median_s']].tail(4))"
