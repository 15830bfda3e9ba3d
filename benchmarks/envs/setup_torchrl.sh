#!/usr/bin/env bash
# Create the separate TorchRL venv used by benchmarks/peers/torchrl_peer.py.
#
# Default: TorchRL on the SAME CPU torch as Conduit's main env (torch 2.13.0+cpu), so that the
# buffer benchmark compares the two libraries on one torch build.
#
# What a release allows (checked 2026-12 with `pip index versions torchrl` and
# `pip download --no-deps torchrl==X`, reading each wheel's METADATA and `nm -D` of its extension):
#   * every release's requirements admit torch 2.13.0 (0.11.1 ... 0.14.1: `torch>=2.1.0`);
#   * no release's prebuilt C++ extension (torchrl/_torchrl*.so, the sum/min segment trees behind
#     PrioritizedSampler) links against torch 2.13: 0.14.0/0.14.1 were built against torch 2.14
#     (need `torch::autograd::fire_node_creation_hooks` and a 10-argument `_wrap_outputs`), and
#     0.11.1 ... 0.13.3 against an older torch (`std::shared_ptr<Node>` autograd symbols). Loading
#     either on 2.13.0 fails with "undefined symbol".
#   * torchrl 0.14.1's wheel ships its CPU C++ sources (torchrl/csrc/pybind.cpp, utils.cpp,
#     segment_tree.h, ...). This script installs the 0.14.1 wheel (tensordict 0.14.x, whose _C.so
#     does not link torch) next to torch 2.13.0+cpu and rebuilds torchrl/_torchrl*.so from those
#     shipped sources with torch.utils.cpp_extension (-O3, CPU only; a minute or two). The Python
#     code and the C++ code are the 0.14.1 release's; only the compile is local.
#
# TORCHRL_TORCH=wheel builds the previous layout instead: torch 2.14.1 (PyPI's default build, the
# release 0.14.1's extension is built against) with the prebuilt extension, for comparison.
#
# Idempotent: exits 0 at once when the venv already builds a PrioritizedSampler.
# Usage: benchmarks/envs/setup_torchrl.sh [VENV_DIR]   (default: <repo>/.venv-torchrl)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${1:-$REPO/.venv-torchrl}"
PY="${PYTHON:-python3}"
MODE="${TORCHRL_TORCH:-same}"
TORCHRL_VERSION=0.14.1

check() {
    "$VENV/bin/python" -c "import torch, torchrl, tensordict; \
from torchrl.data import PrioritizedSampler; PrioritizedSampler(8, 0.6, 0.4); \
print('torchrl', torchrl.__version__, 'torch', torch.__version__, 'tensordict', tensordict.__version__)"
}

if [ -x "$VENV/bin/python" ] && check 2>/dev/null; then
    echo "torchrl venv ready: $VENV"
    exit 0
fi

if [ "$MODE" = wheel ]; then
    TORCH_SPEC="torch==2.14.1"
else
    MAIN_TORCH="$("$REPO/.venv/bin/python" -c 'import torch; print(torch.__version__)')"
    TORCH_SPEC="torch==$MAIN_TORCH"
fi

echo "creating torchrl venv at $VENV ($TORCH_SPEC, torchrl $TORCHRL_VERSION; takes minutes)"
"$PY" -m venv "$VENV"
CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
echo "$TORCH_SPEC" > "$CONSTRAINTS"
"$VENV/bin/pip" install --quiet -c "$CONSTRAINTS" "$TORCH_SPEC" "torchrl==$TORCHRL_VERSION" "tensordict<0.15"

if [ "$MODE" != wheel ]; then
    echo "rebuilding torchrl's C++ extension from its shipped sources against $TORCH_SPEC"
    "$VENV/bin/pip" install --quiet ninja setuptools
    PATH="$VENV/bin:$PATH" "$VENV/bin/python" - <<'EOF'
import glob
import os
import shutil
import tempfile

import torchrl
from torch.utils import cpp_extension

pkg = os.path.dirname(torchrl.__file__)
csrc = os.path.join(pkg, "csrc")
build = tempfile.mkdtemp(prefix="torchrl_ext_")
so = cpp_extension.load(
    name="_torchrl",
    sources=[os.path.join(csrc, "pybind.cpp"), os.path.join(csrc, "utils.cpp")],
    extra_include_paths=[csrc],
    extra_cflags=["-O3"],
    build_directory=build,
    is_python_module=True,
    verbose=False,
).__file__
for old in glob.glob(os.path.join(pkg, "_torchrl*.so")):
    os.remove(old)
shutil.copy(so, os.path.join(pkg, "_torchrl" + os.path.splitext(so)[1]))
with open(os.path.join(pkg, "_torchrl_rebuilt.txt"), "w") as f:
    import torch

    f.write(f"torchrl/_torchrl rebuilt from torchrl/csrc against torch {torch.__version__}\n")
shutil.rmtree(build, ignore_errors=True)
EOF
fi
check
echo "torchrl venv ready: $VENV"
