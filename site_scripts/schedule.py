"""Run the build's independent work (page generators, notebooks) several at a time, across the machine's cores.

A task is a call of a module-level function. With one job the tasks run in this process, one after another; with
more, or when the build process lives on (`mkdocs serve`: `fresh`), they run in worker processes started for this
run, which import the code as it is now, up to `jobs` at once. A task starts once the tasks it comes after have
ended. A task marked `alone` (it times what it runs, or uses every core itself) starts only when nothing else
runs, and nothing starts beside it, so that its figures are those of an otherwise idle machine; when nothing runs,
a ready alone task goes first.

Tasks side by side share the cores: each may use its share of them for BLAS and OpenMP threads (`blas_threads`),
in its own process and in those it starts (a notebook's kernel, a command), and an alone task every core. Two
processes whose OpenBLAS each takes every core make their threads wait on each other, and both run several times
slower than with their share each (tools/bench_blas_threads.py measures it).

The number of jobs: `--jobs` of the command, else SITE_JOBS in the environment (`scripts/site --jobs N` sets it),
else the number of cores this process may use.
"""

import os
import pickle
import time
import traceback
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from multiprocessing import get_context

from tools.common import blas_threads_env

from .common import cores

JOBS_ENV = "SITE_JOBS"


@dataclass(frozen=True)
class Task:
    name: str  # unique among the tasks of one run, and what the log says: "generated page home"
    call: object  # a module-level function (a worker process imports it by name)
    args: tuple = ()
    after: frozenset = field(default_factory=frozenset)  # names of tasks that must end first
    alone: str = ""  # why nothing may run beside it ("" : anything may)


def jobs_from_env():
    """SITE_JOBS when set (a whole number of at least 1), else the number of cores."""
    text = os.environ.get(JOBS_ENV, "").strip()
    if not text:
        return cores()
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{JOBS_ENV}={text!r}: give a whole number of jobs, at least 1")
    return int(text)


def order(tasks):
    """The order in which one job runs the tasks: the alone ones first, each after the tasks it comes after."""
    names = {t.name for t in tasks}
    unknown = sorted(f"{t.name} comes after {a}" for t in tasks for a in t.after if a not in names)
    if unknown or len(names) != len(tasks):
        raise ValueError("tasks that cannot be scheduled: " + ", ".join(unknown or ["two tasks share a name"]))
    done, out, left = set(), [], list(tasks)
    while left:
        ready = [t for t in left if t.after <= done]
        if not ready:
            raise ValueError("tasks wait for each other in a circle: " + ", ".join(t.name for t in left))
        task = next((t for t in ready if t.alone), ready[0])
        out.append(task)
        done.add(task.name)
        left.remove(task)
    return out


@contextmanager
def blas_threads(count):
    """At most `count` BLAS and OpenMP threads meanwhile: in this process (threadpoolctl, for the libraries already
    loaded) and in any it starts or loads later (the environment). None: as many as they take."""
    if count is None:
        yield
        return
    try:  # installed with scripts/setup's extras (bench); without it only what loads later is limited
        from threadpoolctl import threadpool_limits
    except ImportError:
        threadpool_limits = None
    limits = blas_threads_env(count)
    saved = {name: os.environ.get(name) for name in limits}
    os.environ.update(limits)
    try:
        with threadpool_limits(limits=count) if threadpool_limits else nullcontext():
            yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def threads_for(task, workers):
    """An alone task's BLAS threads: every core; one beside others: its share of them."""
    return cores() if task.alone else max(1, cores() // workers)


def timed_call(task, threads=None):
    """Run one task (in whichever process) with at most `threads` BLAS threads (`blas_threads`); return its
    wall-clock seconds. An error that could not travel back from a worker process as it is (an exception whose
    arguments do not rebuild it) comes back as a RuntimeError naming it, with its traceback."""
    start = time.perf_counter()
    try:
        with blas_threads(threads):
            task.call(*task.args)
    except Exception as e:
        try:
            pickle.loads(pickle.dumps(e))
        except Exception:
            raise RuntimeError(f"{task.name}: {type(e).__name__}: {e}\n{traceback.format_exc()}") from None
        raise
    return time.perf_counter() - start


def ended(task, seconds):
    return f"{task.name} in {seconds:.1f} s" + (f" (alone: {task.alone})" if task.alone else "")


def pid_after_a_moment():
    time.sleep(0.05)
    return os.getpid()


def start_workers(pool, workers, timeout_s=60):
    """Have every worker of the pool started and taking work: the pool starts a worker only when none is idle,
    and a worker still starting takes nothing, so two tasks handed over at once could otherwise run one after the
    other on the first worker. Each round hands every worker a short task; it ends when they came back from as
    many processes as the pool has workers."""
    seen, deadline = set(), time.monotonic() + timeout_s
    while len(seen) < workers and time.monotonic() < deadline:
        seen |= {f.result() for f in [pool.submit(pid_after_a_moment) for _ in range(workers)]}


def run(tasks, jobs=1, log=print, fresh=False):
    """Run every task; log "<name> in <s> s" as each ends, and return {name: seconds}. The first failure stops
    the run: no task starts after it, the running ones are waited for, the failed task is logged and its
    exception raised. `fresh`: in worker processes even with one job."""
    tasks = order(tasks)  # also checks the names and the order
    seconds = {}
    if not tasks or (jobs <= 1 and not fresh):
        for task in tasks:
            try:
                seconds[task.name] = timed_call(task)
            except Exception:
                log(f"{task.name} failed")
                raise
            log(ended(task, seconds[task.name]))
        return seconds
    done, running, left = set(), {}, list(tasks)
    workers = min(jobs, len(tasks))
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
        start_workers(pool, workers)
        while left or running:
            ready = [t for t in left if t.after <= done]
            alone = [t for t in ready if t.alone]
            if alone and not running:
                chosen = alone[:1]
            elif any(t.alone for t in running.values()):
                chosen = []
            else:
                chosen = [t for t in ready if not t.alone][:jobs - len(running)]
            for task in chosen:
                left.remove(task)
                running[pool.submit(timed_call, task, threads_for(task, workers))] = task
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                task = running.pop(future)
                error = future.exception()
                if error is not None:
                    wait(running)
                    log(f"{task.name} failed")
                    if isinstance(error, BrokenProcessPool):  # killed (out of memory, a signal) or exited
                        # every running task fails with it, and the pool does not say whose worker it was
                        ran = sorted([task.name, *(t.name for t in running.values())])
                        raise RuntimeError(f"a worker process died while these ran: {', '.join(ran)} "
                                           f"({error})") from None
                    raise error
                done.add(task.name)
                seconds[task.name] = future.result()
                log(ended(task, seconds[task.name]))
    return seconds
