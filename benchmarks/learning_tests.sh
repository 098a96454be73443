#!/usr/bin/env bash
# Run the single-seed learning tests once per seed (COMLRL_LEARNING_SEED, tests/learning_seed.py) and print a
# pass/fail line per test and seed. Usage: benchmarks/learning_tests.sh [FIRST_SEED] [LAST_SEED] (default 0 9).
# The MARLHF learning tests are parametrized over seeds; benchmarks/learning.py checks their recipes on more.
set -uo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
first=${1:-0}
last=${2:-9}
tests=(
  tests/modules/test_madpo.py::test_madpo_raises_task_reward_on_builtin_task
  tests/learning/test_magrpo_learning.py::test_single_turn_magrpo_learns_the_cooperative_task
  tests/learning/test_magrpo_learning.py::test_two_turn_magrpo_learns_with_the_plain_transition
  tests/learning/test_iterative_learning.py::test_win_rate_against_initial_policy_rises
)
for seed in $(seq "$first" "$last"); do
  COMLRL_LEARNING_SEED=$seed OMP_NUM_THREADS=1 "$python" -m pytest -q -p no:cacheprovider -rA "${tests[@]}" 2>&1 \
    | grep -E '^(PASSED|FAILED|ERROR) ' | sed "s/^/seed $seed: /"
done
