#!/usr/bin/env bash
# The cost model and auto-tuner on a GPU machine, < 8 minutes, torch + scipy + matplotlib only:
#   bash benchmarks/gpu/autotune_gpu.sh        (results in $OUT, default benchmarks/results/gpu/)
# 1. autotune.py --device cuda:0: the synthetic core loop with the consumer on the GPU (deliveries copied
#    host -> cuda:0, the per-byte term from the measured host -> HBM link): 32 configurations measured at
#    5 item sizes, the model's ranking (Kendall's tau, top-8) and the tuner's pick against the best.
# 2. granularity.py --quick --device cuda:0: latency against g_ing and g_del, overlap on/off.
. "$(dirname "$0")/common.sh" autotune_gpu
timeout 390 $PY benchmarks/autotune.py --device cuda:0 --out "$OUT/autotune_gpu.json" | tail -12
timeout 60 $PY benchmarks/granularity.py --quick --device cuda:0 --out "$OUT/granularity_gpu.json" | tail -12
echo "[autotune_gpu] done: $(ls "$OUT")"
