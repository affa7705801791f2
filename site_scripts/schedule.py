"""Run the build's independent work (page generators, notebooks) several at a time, across the machine's cores.

A task is a call of a module-level function. With one job the tasks run in this process, one after another; with
more they run in worker processes (started fresh, so that no state of the build process leaks into a page), up to
`jobs` at once. A task starts once the tasks it comes after have ended. A task marked `alone` (it times what it
runs, or uses every core itself) starts only when nothing else runs, and nothing starts beside it; the alone tasks
go first, while no other task is running, so that their figures are those of an otherwise idle machine.

The number of jobs: `--jobs` of the command, else SITE_JOBS in the environment (`scripts/site --jobs N` sets it),
else the number of cores this process may use.
"""

import os
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from multiprocessing import get_context

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
        from transformer.parallel import cores

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


def timed_call(task):
    """Run one task (in whichever process); return its wall-clock seconds."""
    start = time.perf_counter()
    task.call(*task.args)
    return time.perf_counter() - start


def run(tasks, jobs=1, log=print):
    """Run every task; log "<name> in <s> s" as each ends. The first failure stops the run: no task starts
    after it, the running ones are waited for, and its exception is raised."""
    tasks = order(tasks)  # also checks the names and the order
    if jobs <= 1 or len(tasks) <= 1:
        for task in tasks:
            log(f"{task.name} in {timed_call(task):.1f} s")
        return [t.name for t in tasks]
    done, running, left = set(), {}, list(tasks)
    with ProcessPoolExecutor(min(jobs, len(tasks)), mp_context=get_context("spawn")) as pool:
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
                running[pool.submit(timed_call, task)] = task
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                task = running.pop(future)
                error = future.exception()
                if error is not None:
                    wait(running)
                    raise error
                done.add(task.name)
                log(f"{task.name} in {future.result():.1f} s" + (f" (alone: {task.alone})" if task.alone else ""))
    return [t.name for t in tasks]
