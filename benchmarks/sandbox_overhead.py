"""Overhead of the code sandbox per call and per test case, against a plain-subprocess baseline.

Both sides run the same trivial solution and N asserts, each assert compiled and executed on its
own. The baseline is a throwaway ``python -I -S -c`` subprocess without any isolation; the
sandbox adds namespaces, the uid drop, rlimits, the per-case alarm and one JSON record per case.
Per-case cost = (time with N cases - time with 1 case) / (N - 1); fixed cost = time with 1 case.
All numbers are medians over the repeats of this run.

    python benchmarks/sandbox_overhead.py [--cases 200] [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from comlrl_lightning.envs.code.sandbox import isolation_info, run_cases

CODE = "def f(x):\n    return x\n"

BASELINE = """
import sys
cases = sys.stdin.read().split("\\n\\x00\\n")
env = {"__name__": "__bench__"}
exec(compile(%r, "<solution>", "exec"), env)
for src in cases:
    try:
        exec(compile(src, "<case>", "exec"), env)
    except Exception:
        pass
"""


def cases(n: int) -> list[str]:
    return [f"assert f({i}) == {i}" for i in range(n)]


def time_sandbox(n: int) -> float:
    start = time.perf_counter()
    results = run_cases(CODE, cases(n), timeout_s=10.0)
    elapsed = time.perf_counter() - start
    assert len(results) == n and all(r.passed for r in results)
    return elapsed


def time_baseline(n: int) -> float:
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-I", "-S", "-c", BASELINE % CODE],
        input="\n\x00\n".join(cases(n)).encode(),
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - start


def time_in_process(n: int) -> float:
    env: dict = {}
    exec(CODE, env)  # noqa: S102 - trusted benchmark code
    start = time.perf_counter()
    for src in cases(n):
        exec(compile(src, "<case>", "exec"), env)  # noqa: S102
    return time.perf_counter() - start


def median(fn, n: int, repeats: int) -> float:
    fn(n)  # warm-up
    return statistics.median(fn(n) for _ in range(repeats))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    n, r = args.cases, args.repeats

    info = isolation_info()
    print(
        f"isolation: {info['isolation']} (pid namespace: {info['pidns']}, uid: {info['uid']}, "
        f"RLIMIT_NPROC enforced: {info['nproc_enforced']})"
    )

    sandbox_1, sandbox_n = median(time_sandbox, 1, r), median(time_sandbox, n, r)
    base_1, base_n = median(time_baseline, 1, r), median(time_baseline, n, r)
    inproc_n = median(time_in_process, n, r)

    sandbox_case = (sandbox_n - sandbox_1) / (n - 1)
    base_case = (base_n - base_1) / (n - 1)
    inproc_case = inproc_n / n
    print(
        f"fixed cost per call      sandbox {sandbox_1 * 1e3:8.2f} ms   subprocess {base_1 * 1e3:8.2f} ms   "
        f"ratio {sandbox_1 / base_1:6.2f}x"
    )
    print(
        f"cost per test case       sandbox {sandbox_case * 1e6:8.1f} us   "
        f"subprocess {base_case * 1e6:8.1f} us   "
        f"ratio {sandbox_case / max(base_case, 1e-9):6.2f}x"
    )
    print(
        f"                         in-process exec {inproc_case * 1e6:8.1f} us   "
        f"sandbox/in-process {sandbox_case / max(inproc_case, 1e-9):6.2f}x"
    )
    print(
        f"{n} cases in one call     sandbox {sandbox_n * 1e3:8.2f} ms   subprocess {base_n * 1e3:8.2f} ms   "
        f"ratio {sandbox_n / base_n:6.2f}x"
    )


if __name__ == "__main__":
    main()
