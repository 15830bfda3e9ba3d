# What the GPU scripts share; sourced as `. "$(dirname "$0")/common.sh" NAME [MORE_PYTHONPATH]`:
# the repository root as working directory, $PY (default python), $OUT (default benchmarks/results/gpu,
# created), the repository (and MORE_PYTHONPATH, relative to it) on PYTHONPATH, and a line naming
# torch's version and whether CUDA is there.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
PY=${PYTHON:-python}
OUT=${OUT:-benchmarks/results/gpu}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${2:+:$PWD/$2}:${PYTHONPATH:-}"
$PY -c "import torch; print('[$1] torch', torch.__version__, 'cuda', torch.cuda.is_available())"
