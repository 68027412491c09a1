#!/bin/bash
# The lent-GPU measurement of docs/cost-model.md's measured table, in one call on the device machine:
# kernel throughput (kernels.py) and the per-layer F, B, W of two Llama-style layer sets (zbsolve profile
# --per-layer). zbsolve's dependencies travel as wheels in .whl, zbsolve itself (the committed tree) in .gpuhead.
set -e
OUT=${OUT:-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=.gpuhead:benchmarks/gpu:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit,driver_version --format=csv | tee "$OUT/nvidia-smi.csv"
python3 benchmarks/gpu/kernels.py "$OUT/kernels.json" "$@"
for model in llama3_8b llama3_70b_tp4; do
  python3 -m zbsolve profile --model llama_block:$model --per-layer --device cuda --no-latency --repeats 10 \
    --warmup 3 -o "$OUT/$model.yaml"
done
