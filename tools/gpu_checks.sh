#!/usr/bin/env bash
# The GPU checks of issue #11, as one script: the tests marked `gpu` (agents on cuda:0/cuda:1, nccl DDP; they
# skip themselves without enough CUDA devices) and benchmark (a), the 2-turn MAGRPO rollouts batched against the
# per-node loop, on a random Qwen2 of Qwen2.5-0.5B's shape on one GPU (prints generated tokens/s).
#
#   tools/gpu_checks.sh [PYTHON]      # PYTHON: an interpreter with a CUDA build of torch (default: python)
#
# About 5 minutes on one H200-class GPU. Everything it runs also passes (or skips) on CPU.
set -euo pipefail
PY="${1:-python}"
cd "$(dirname "$0")/.."
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.device_count())"
"$PY" -m pytest -q -m gpu tests -p no:cacheprovider
"$PY" benchmarks/rollouts.py --models q05b --accelerator gpu --threads 4 --steps 4 --reps 1 --max-new-tokens 64
