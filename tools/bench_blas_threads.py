"""Benchmark: training runs side by side, each with the BLAS threads it takes by default, or with its share of the
cores (what site_scripts/schedule.py gives a task that runs beside others).

Each run is `python -m transformer train` (config A on Tiny Shakespeare, batches of 32, `--steps` steps) in a
process of its own, its batch in one shard computed in that process (`--threads 1`), as a notebook or a page's
generator computes. A round starts one run alone with the default threads (the reference), then as many runs as
there are cores side by side with the default threads, then the same number side by side with
OPENBLAS_NUM_THREADS (and OMP, MKL) set to cores // runs. It reports each round's wall times, and the ratio of
the slowest run side by side to the run alone, for both settings (the median over the rounds, and the worst:
the threads' waiting on each other comes and goes).

    python -m tools.bench_blas_threads [--steps 100] [--rounds 3]
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

from tools.common import CORPUS, blas_threads_env, cores, ensure_corpus, positive_int


def side_by_side(count, steps, threads=None):
    """Wall seconds of the slowest of `count` training runs started at once (threads: None, the default)."""
    env = dict(os.environ, **(blas_threads_env(threads) if threads else {}))
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        runs = [subprocess.Popen([sys.executable, "-m", "transformer", "train", "--corpus", str(CORPUS), "--out",
                                  f"{out}/{i}", "--preset", "A", "--batch-size", "32", "--steps", str(steps),
                                  "--eval-every", str(steps), "--seed", str(i), "--threads", "1", "--no-progress"],
                                 env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                for i in range(count)]
        for run in runs:
            if run.wait() != 0:
                raise RuntimeError(f"a training run failed: {run.stderr.read()[-500:]}")
        return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(prog="python -m tools.bench_blas_threads", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=positive_int, default=100, help="training steps per run")
    parser.add_argument("--rounds", type=positive_int, default=3, help="rounds of the three measurements")
    args = parser.parse_args()
    ensure_corpus()
    count = cores()
    share = max(1, cores() // count)
    rows = []
    for round_ in range(1, args.rounds + 1):
        alone = side_by_side(1, args.steps)
        default = side_by_side(count, args.steps)
        shared = side_by_side(count, args.steps, share)
        rows.append((alone, default, shared))
        print(f"round {round_}: one run alone {alone:.1f} s; {count} side by side, default threads {default:.1f} s, "
              f"{share} thread{'s' * (share > 1)} each {shared:.1f} s", flush=True)
    for label, column in (("default threads", 1), (f"{share} thread{'s' * (share > 1)} each", 2)):
        ratios = [row[column] / row[0] for row in rows]
        print(f"{count} runs side by side, {label}: the slowest took {statistics.median(ratios):.2f} times as long "
              f"as one run alone (median of {args.rounds} rounds; at worst {max(ratios):.2f} times)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
