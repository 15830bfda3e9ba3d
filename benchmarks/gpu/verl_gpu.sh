#!/usr/bin/env bash
# verl integration on one GPU machine, < 8 minutes: conduit vs verl's sync trainer, GRPO.
#   bash benchmarks/gpu/verl_gpu.sh [MODEL_PATH]    (results in benchmarks/results/verl_gpu*.json)
#
# NOTE: the GPU machine lent to this project's sessions has torch + transformers but NOT ray,
# verl or vLLM (and no network to install them). This script checks for them first and says so
# clearly; on such a machine it only runs the part that needs no verl: a CUDA sanity check of the
# tiny model's forward/backward (the CPU mode's model) so a device run still yields something.
# On a machine with `pip install -e ".[verl]"` and vLLM it runs the same benchmark as the CPU one
# with the vLLM rollout (recipes/verl_grpo.sh settings, shrunk to a few iterations).
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python}
OUT=${OUT:-benchmarks/results}
mkdir -p "$OUT"
missing=()
for mod in ray verl vllm transfer_queue; do
  $PY -c "import $mod" 2>/dev/null || missing+=("$mod")
done
$PY - <<'PY'
import torch
print(f"[verl_gpu] torch {torch.__version__}, cuda available: {torch.cuda.is_available()}",
      f"({torch.cuda.get_device_name(0)})" if torch.cuda.is_available() else "")
PY
if ((${#missing[@]})); then
  echo "[verl_gpu] MISSING: ${missing[*]} — cannot run verl's trainer here (this is expected on the lent"
  echo "[verl_gpu] GPU machine). Install with: pip install -e \".[verl]\" plus vLLM. Running the CUDA sanity check only."
  timeout 300 $PY - "$OUT" <<'PY'
import json, sys, time, torch
sys.path.insert(0, "tools/verl_cpu")  # the CPU harness's tiny model (needs only transformers)
sys.path.insert(0, "benchmarks")
import provenance
prov = provenance.start()
from conduit_verl_cpu.model import build_model_dir
from transformers import AutoModelForCausalLM
import tempfile
d = build_model_dir(tempfile.mkdtemp())
dev = "cuda" if torch.cuda.is_available() else "cpu"
m = AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager").to(dev)
x = torch.randint(0, m.config.vocab_size, (64, 48), device=dev)
for _ in range(3):
    m(input_ids=x, labels=x).loss.backward()
if dev == "cuda": torch.cuda.synchronize()
t0 = time.perf_counter()
for _ in range(20):
    m(input_ids=x, labels=x).loss.backward()
if dev == "cuda": torch.cuda.synchronize()
res = {"device": dev, "fwd_bwd_ms": (time.perf_counter() - t0) / 20 * 1e3, "verl": "not installed"}
res["machine"] = provenance.finish(prov)
print("[verl_gpu]", res)
json.dump(res, open(f"{sys.argv[1]}/verl_gpu_sanity.json", "w"), indent=1)
PY
  exit 0
fi
MODEL=${1:-}
if [[ -z "$MODEL" ]]; then
  echo "[verl_gpu] verl is installed; pass a model path to run GRPO with vLLM. Running the CPU-mode benchmark instead."
  exec timeout 450 $PY benchmarks/verl_iteration.py --quick --out "$OUT/verl_gpu_cpu_mode.json"
fi
for mode in sync conduit; do
  MODE=$mode BATCH=32 MINI=32 LOGGER=console,file VERL_FILE_LOGGER_PATH="$OUT/verl_gpu_$mode.jsonl" \
    timeout 210 bash recipes/verl_grpo.sh "$MODEL" "${TRAIN:?set TRAIN=parquet}" "${VAL:?set VAL=parquet}" \
    trainer.total_training_steps=4 trainer.val_before_train=False trainer.test_freq=-1 \
    2>&1 | tee "$OUT/verl_gpu_$mode.log" | grep -E "timing_s/step|Error" || true
done
