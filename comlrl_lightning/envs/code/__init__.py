"""The code-collaboration environment: agent 0 writes a helper ``aux(...)``, agent 1 the
entry-point function that may call it (docs/multiturn.md §5.1, §6).

- :mod:`.sandbox`: run model code against HumanEval-style tests in an isolated child process;
  ``require_sandbox()`` fails at construction, with the install command, where bubblewrap is missing.
- :mod:`.analysis`: extract the functions from model text; static checks.
- :mod:`.rewards`: the aux/main reward (``code_reward_func``, ``make_code_reward_func``).
- :mod:`.prompts`: the two agents' formatters.
- :mod:`.transitions`: external transitions ``plain``, ``level_feedback``, ``expert_edits``.
- :mod:`.problems`: built-in problems and HumanEval-format loading.
"""

from comlrl_lightning.envs.code.analysis import CodeAnalysis, analyze, extract_function
from comlrl_lightning.envs.code.problems import load_code_problems
from comlrl_lightning.envs.code.prompts import FORMATTERS, aux_formatter, main_formatter
from comlrl_lightning.envs.code.rewards import (
    RewardBreakdown,
    code_reward_func,
    code_rewards,
    make_code_reward_func,
)
from comlrl_lightning.envs.code.sandbox import (
    SandboxError,
    TestResult,
    extract_test_cases,
    isolation_info,
    isolation_level,
    require_sandbox,
    run_cases,
    run_tests,
    run_tests_many,
    unavailable_reason,
)
from comlrl_lightning.envs.code.transitions import (
    CodeTransition,
    make_code_transition,
    parse_sandbox_slice,
    slice_tests,
)

__all__ = [
    "FORMATTERS",
    "CodeAnalysis",
    "CodeTransition",
    "RewardBreakdown",
    "SandboxError",
    "TestResult",
    "analyze",
    "aux_formatter",
    "code_reward_func",
    "code_rewards",
    "extract_function",
    "extract_test_cases",
    "isolation_info",
    "isolation_level",
    "load_code_problems",
    "main_formatter",
    "make_code_reward_func",
    "make_code_transition",
    "parse_sandbox_slice",
    "require_sandbox",
    "run_cases",
    "run_tests",
    "run_tests_many",
    "slice_tests",
    "unavailable_reason",
]
