"""`python -m MODULE ARGS` in a copy of the project, forked from a process that has already imported torch.

Every check of the mutation run (tools/mutants.py) is a new `python -m transformer ...` or `python -m pytest
...` in a copy of the project, so that each imports the copy's code, changed, and nothing else. A new process
spends about 1.5 s before it does any of its work, most of it in `import torch` (1.4 s on two cores:
`python -X importtime -c "import torch"`), and the full run starts six per mutant.

A `Launcher` is one process, started once per worker of the run, that imports numpy, torch and pytest and
then waits. Each check it is asked for is a fork of it: the child starts with those libraries in
memory, moves into the copy (its folder, PYTHONPATH and `sys.path[0]`, no bytecode written, as
`python -m` in the copy would) and imports the project from there. The launcher never imports the project:
a child that found `transformer` already imported would check the working tree's code, not the copy's. It
reads its requests from its stdin, one JSON line each, and answers each with one line when the check is over:
its exit status, or that it ran past its time limit and was killed, with every process it started.

What a fork shares with its launcher, and a new process would not: the hash seed of str and bytes (Python
draws it at start-up), and whatever the preloaded libraries did when they were imported. The random
generators of `random` and numpy are seeded again from the system in each child.

    with Launcher(threads=1) as launcher:
        result = launcher.run(copy, "transformer", ["gradcheck"], timeout=600)   # a CompletedProcess, or None

    with launchers(jobs) as waiting:             # one per worker thread, each borrowed for a mutant:
        with lent(waiting) as launcher: ...      # tools/project_copy.py's run_in(..., launcher=launcher)

Run as a script, this file is the launcher (`python tools/preloaded.py`); a launcher and the code that asks it
share nothing else. Forking needs a POSIX system; elsewhere `Launcher` cannot start (`available()`).
"""

import json
import os
import queue
import random
import runpy
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from contextlib import ExitStack, contextmanager
from pathlib import Path

# Not hypothesis: pytest could no longer rewrite the asserts of its plugin, and warns.
PRELOAD = ("numpy", "torch", "pytest")
PROJECT = ("transformer", "tests", "tools", "site_scripts")  # imported from the copy only
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


@contextmanager
def launchers(jobs, threads=1):
    """A queue of `jobs` launchers, one for each of `jobs` worker threads to borrow (`lent`); each is None where
    this system cannot fork. They are closed on exit."""
    with ExitStack() as stack:
        waiting = queue.Queue()
        for _ in range(jobs):
            waiting.put(stack.enter_context(Launcher(threads)) if available() else None)
        yield waiting


@contextmanager
def lent(waiting):
    """A launcher from the queue of `launchers`, put back afterwards."""
    launcher = waiting.get()
    try:
        yield launcher
    finally:
        waiting.put(launcher)


def available():
    """Whether this system can fork a launcher's children."""
    return hasattr(os, "fork")


class Launcher:
    """A process with PRELOAD imported, which runs each check asked of it in a fork of itself.

    Parameters
    ----------
    threads : int
        The BLAS and OpenMP threads of every check (numpy and torch read them when they load, so one launcher
        serves one setting).
    """

    def __init__(self, threads=1):
        self.threads = threads
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # a check imports from its copy alone
        env.update({name: str(threads) for name in THREAD_VARIABLES})
        self.process = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        env=env, text=True, bufsize=1)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        self.process.stdin.close()
        self.process.wait()

    def run(self, copy, module, args, timeout=None, env=None, record=None):
        """`python -m module *args` in the copy: a CompletedProcess with its exit status and text output, or
        None when it ran past `timeout` seconds (the launcher kills it, and every process it started). `env`
        adds environment variables. `record`: a path where the check writes which of the copy's functions it
        called (tools/reached.py)."""
        with tempfile.TemporaryDirectory(prefix="check-") as tmp:
            out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
            request = {"copy": str(copy), "module": module, "args": list(args), "out": str(out), "err": str(err),
                       "env": env or {}, "timeout": timeout, "record": record and str(record)}
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            line = self.process.stdout.readline()  # one line per request, when the check is over
            if not line:
                raise RuntimeError(f"the launcher stopped (exit status {self.process.wait()})")
            done = json.loads(line)
            if done["timed_out"]:
                return None
            return subprocess.CompletedProcess([module, *args], done["returncode"], _read(out), _read(err))


def _read(path):
    return path.read_text(errors="replace") if path.exists() else ""


# ---------------------------------------------------------------- the launcher's side

POLL_S = 0.01  # how often the launcher looks whether a check has ended


def serve():
    """Import PRELOAD, then fork one child per request line on stdin until it closes, answering each with one
    line: the child's exit status, or that it ran past its time and was killed."""
    for module in PRELOAD:
        __import__(module)
    import reached  # noqa: F401  tools/reached.py, beside this script: for the children that record their calls
    for line in sys.stdin:
        request = json.loads(line)
        timeout = request.pop("timeout")
        pid = os.fork()
        if pid == 0:
            exit_without_teardown(child(**request))
        status, timed_out = wait(pid, timeout)
        print(json.dumps({"returncode": os.waitstatus_to_exitcode(status), "timed_out": timed_out}), flush=True)


def wait(pid, timeout):
    """Wait for the child; past `timeout` seconds, kill its process group (the child and whatever it started).
    Returns (its wait status, whether it was killed). It is reaped only here, so its pid stays its own until
    then, and the kill cannot reach another process."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status, False
        if deadline is not None and time.monotonic() > deadline:
            os.killpg(pid, signal.SIGKILL)
            return os.waitpid(pid, 0)[1], True
        time.sleep(POLL_S)


def exit_without_teardown(status):
    """End the child as Python ends a process, all but the last stage: wait for its threads (`threading._shutdown`,
    what the interpreter itself calls first), run its atexit handlers, flush stdout and stderr, and leave with
    `status`. The stage left out tears down every module; with torch loaded it takes about 0.65 s, and nothing
    of a check's outcome happens in it (`python -m transformer gradcheck` forked: 1.1 s with it, 0.4 s without)."""
    import atexit
    import threading

    try:
        threading._shutdown()
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # closed by the check
                pass
        os._exit(status)


def child(copy, module, args, out, err, env, record):
    """In a fork of the launcher: become `python -m module *args` run in the copy, stdout and stderr into the
    files `out` and `err`; with a `record` path, note every function of the copy's package that it calls there
    (tools/reached.py). Returns the exit status (see `exit_without_teardown` for what follows)."""
    os.setsid()  # a process group of its own, which a timeout kills whole
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, out), (2, err)):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    imported = sorted(m for m in sys.modules if m.split(".")[0] in PROJECT)
    if imported:
        print(f"the launcher has imported {', '.join(imported)}: the check would not use the copy's", file=sys.stderr)
        return 1
    os.chdir(copy)
    os.environ.update(env, PYTHONPATH=copy, PYTHONDONTWRITEBYTECODE="1")
    sys.dont_write_bytecode = True
    sys.path[0] = copy  # the launcher's own folder, tools/
    sys.argv = [module, *args]
    random.seed()  # seeded from the system, as in a new process, not left in the launcher's state
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    if record:
        sys.modules["reached"].start_recording(copy, record)  # written at exit, after the check
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:  # what `python -m` makes of it
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1
    except BaseException:  # noqa: BLE001 -- a traceback on stderr and status 1, as python prints it
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(description="A launcher: import PRELOAD, then run each check that a JSON line on "
                            "stdin asks for in a fork of this process (see tools/preloaded.py).").parse_args()
    serve()
