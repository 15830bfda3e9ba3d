#!/usr/bin/env bash
# Placement on a GPU machine, < 8 minutes, torch only (no ray/verl needed):
#   bash benchmarks/gpu/placement_gpu.sh        (results in $OUT, default benchmarks/results/gpu/)
# 1. `conduit topology --recalibrate`: this machine's tiers (HBM per GPU, pinned, host, shm, disk) and
#    every link measured by the calibration (table + PNG graph + the cached JSON).
# 2. placement_ablation.py --quick: the DQN replay workload with the learner on cuda:0 — all pageable
#    host, all pinned (zero-copy style), all shm/disk, one_gpu (everything in HBM) and the planner's
#    placement, measured, with the planner's predictions and their rank correlation.
# 3. migration.py --quick: growing responses with greedy / conservative / Conduit on this machine's
#    tiers (the planner now also sees pinned and HBM).
. "$(dirname "$0")/common.sh" placement_gpu integrations/verl
timeout 120 $PY -m conduit.cli topology --recalibrate --png "$OUT/topology_gpu.png" | tee "$OUT/topology_gpu.txt"
cp ~/.cache/conduit/topology-*.json "$OUT/" 2>/dev/null || true
timeout 200 $PY benchmarks/placement_ablation.py --quick --out "$OUT/placement_ablation_gpu.json" | tail -40
timeout 150 $PY benchmarks/migration.py --quick --out "$OUT/migration_gpu.json" | tail -30
echo "[placement_gpu] done: $(ls "$OUT")"
