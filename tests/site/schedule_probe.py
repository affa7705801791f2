"""Tasks for tests/site/test_schedule.py: module-level, so that a worker process of site_scripts/schedule.py can
import them. Each records when it ran, as seconds on the machine's monotonic clock, in <folder>/<name>.json."""

import json
import os
import time
from pathlib import Path


def record(folder, name, seconds=0.4, fail=False):
    start = time.monotonic()
    time.sleep(seconds)
    if fail:
        raise RuntimeError(f"task {name} failed on purpose")
    Path(folder, f"{name}.json").write_text(json.dumps([start, time.monotonic()]))


class TwoPartError(Exception):
    """An exception whose arguments do not rebuild it: it cannot travel back from a worker process as it is."""

    def __init__(self, what, why):
        super().__init__(f"{what}: {why}")


def raise_two_part():
    raise TwoPartError("probe", "its arguments do not rebuild it")


def die():
    os._exit(3)  # as a worker killed for memory would end: no exception, no result


def write_pid(folder, name):
    Path(folder, f"{name}.pid").write_text(str(os.getpid()))


def blas_threads_seen(folder, name):
    """Record the BLAS threads this task may use: in its environment (what a process it starts gets) and in
    this process's OpenBLAS (threadpoolctl)."""
    from threadpoolctl import threadpool_info

    import numpy  # noqa: F401  (its BLAS must be loaded to be seen)

    inner = [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]
    Path(folder, f"{name}.threads").write_text(json.dumps([os.environ.get("OPENBLAS_NUM_THREADS"), inner]))
