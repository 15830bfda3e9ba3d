#!/usr/bin/env bash
# Create the separate TorchRL venv used by benchmarks/peers/torchrl_peer.py.
#
# TorchRL's compiled sum tree is built for one torch release, and torchrl 0.14.1 needs a newer
# tensordict than Conduit's main env admits, so TorchRL lives in its own venv and is driven by
# subprocess. Idempotent: exits 0 at once when the venv already imports torchrl.
#
# No TorchRL release pairs with Conduit's torch 2.13.0 (checked 2026-11 on the main env's
# torch-2.13.0+cpu wheel): the C++ extension of torchrl 0.14.1 (tensordict 0.14.3) and of 0.13.3
# (tensordict 0.13) fails to load ("undefined symbol" in torchrl/_torchrl*.so), so its
# PrioritizedSampler refuses to build. TorchRL therefore runs on torch 2.14.1, the release its
# wheel is built against (PyPI's default build of it, which bundles CUDA libraries; its CPU kernels
# are the ones timed here).
#
# Usage: benchmarks/envs/setup_torchrl.sh [VENV_DIR]   (default: <repo>/.venv-torchrl)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${1:-$REPO/.venv-torchrl}"
PY="${PYTHON:-python3}"

check() {
    "$VENV/bin/python" -c "import torch, torchrl, tensordict; \
from torchrl.data import PrioritizedSampler; PrioritizedSampler(8, 0.6, 0.4); \
print('torchrl', torchrl.__version__, 'torch', torch.__version__, 'tensordict', tensordict.__version__)"
}

if [ -x "$VENV/bin/python" ] && check 2>/dev/null; then
    echo "torchrl venv ready: $VENV"
    exit 0
fi

echo "creating torchrl venv at $VENV (several GB, takes minutes)"
"$PY" -m venv "$VENV"
CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
echo "torch==2.14.1" > "$CONSTRAINTS"
"$VENV/bin/pip" install --quiet -c "$CONSTRAINTS" torch==2.14.1 torchrl==0.14.1 "tensordict<0.15"
check
echo "torchrl venv ready: $VENV"
