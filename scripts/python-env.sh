#!/usr/bin/env bash
# Creates or updates the Python environment that checks autopp's launch files with
# Megatron-Core, torchtitan and DeepSpeed on the CPU. It lives outside the clone (several GB):
# ${AUTOPP_VENV:-$HOME/.cache/autopp/venv}. Idempotent: it installs only when
# scripts/python-requirements.txt changed since the last successful install.
#
#   scripts/python-env.sh            # then: AUTOPP_VENV=... cargo test --test launch_frameworks
set -euo pipefail
cd "$(dirname "$0")/.."

venv=${AUTOPP_VENV:-$HOME/.cache/autopp/venv}
requirements=scripts/python-requirements.txt
stamp="$venv/.autopp-requirements"

python=${PYTHON:-python3}
if [ ! -x "$venv/bin/python" ]; then
  echo "creating $venv"
  mkdir -p "$(dirname "$venv")"
  "$python" -m venv "$venv"
fi

if [ -f "$stamp" ] && cmp -s "$requirements" "$stamp"; then
  echo "$venv is up to date with $requirements"
else
  # DeepSpeed builds no C++/CUDA ops at install (they are compiled on first use, and the
  # checks need none); megatron-core imports without Transformer Engine or Apex
  DS_BUILD_OPS=0 "$venv/bin/pip" install --quiet --upgrade pip
  DS_BUILD_OPS=0 "$venv/bin/pip" install --quiet -r "$requirements"
  cp "$requirements" "$stamp"
fi

# the imports the checks make, and the versions they find
"$venv/bin/python" - <<'PY'
import importlib.metadata as md
import warnings

warnings.filterwarnings("ignore")
import deepspeed.runtime.config  # noqa: F401
import megatron.core.transformer.transformer_config  # noqa: F401
import torchtitan.config  # noqa: F401
import torchao.float8  # noqa: F401

print(", ".join(f"{p} {md.version(p)}"
                for p in ("torch", "megatron-core", "torchtitan", "torchao", "deepspeed")))
PY
