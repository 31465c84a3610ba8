#!/usr/bin/env bash
# Set up a fresh machine: a virtual environment in .venv with OpBench (editable), the pinned TVM
# (apache-tvm 0.27.0.post1 + apache-tvm-ffi 0.1.14.post1) and the test/model dependencies.
# Idempotent: a second run only checks what is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
if ! .venv/bin/python -c 'import opbench, tvm, tvm_ffi, torch, torchvision, transformers, pytest, pyarrow, xgboost, cloudpickle, matplotlib' 2>/dev/null || [ ! -x .venv/bin/ruff ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  # torch/torchvision first: with these exact versions pip takes the local copies where there are some
  .venv/bin/python -m pip install -q "torch==2.14.1" "torchvision==0.29.1"
  .venv/bin/python -m pip install -q -e ".[torch,parquet,dev,tune,rpc,report]"
fi
.venv/bin/python -c 'import tvm, tvm_ffi; print("opbench setup: tvm", tvm.__version__, "ffi", tvm_ffi.__version__)'
