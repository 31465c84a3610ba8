#!/usr/bin/env bash
# Predictors and the report on the dataset shipped in data/ (collected on an H100): train a latency
# predictor with whole models held out, predict a model that was left out of training, compare with
# its measurement, and write the HTML report. Runs on a CPU in under a minute; nothing is measured.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=${1:-/tmp/opbench-example}
mkdir -p "$OUT"
export PYTHONPATH=python
D=data/dataset/h100.sqlite.gz
# 1. held-out metrics (each model predicted by a predictor trained without it); googlenet left out entirely
"$PY" -m opbench train --dataset $D --what latency --split by_model --exclude googlenet --out "$OUT/latency.opm"
# 2. googlenet was never seen: predict every operator from the extracted graph (no compile, no GPU)
"$PY" -m opbench predict --model "$OUT/latency.opm" --modelsource local --modelname googlenet --target cuda \
    --json "$OUT/googlenet.json" -q > /dev/null
"$PY" - "$OUT/googlenet.json" "$D" <<'CHECK'
import json, sys
import opbench
predicted = json.load(open(sys.argv[1]))["predicted_sum_ms"]
models = opbench.load(sys.argv[2], "models")
row = models[(models.model == "googlenet") & (models.config == "default")].iloc[0]
measured = row.sum_op_latency_s * 1e3
print(f"googlenet, never trained on: predicted {predicted:.3f} ms, measured {measured:.3f} ms "
      f"({predicted / measured - 1:+.1%})")
CHECK
# 3. the report: latency by kind, roofline, co-runs, predicted vs measured, tuning curves, a timeline
"$PY" -m opbench report --dataset $D --out "$OUT/report" -q
echo "open $OUT/report/index.html"
