"""The seed of the single-seed learning tests: 0, or ``COMLRL_LEARNING_SEED`` to check them on other seeds.

`benchmarks/learning_tests.sh` runs those tests once per seed with it set (README, "Learning benchmark"); CI runs
them with seed 0. The MARLHF learning tests are parametrized over their seeds instead.
"""

import os

LEARNING_SEED = int(os.environ.get("COMLRL_LEARNING_SEED", "0"))
