"""Shards computed in worker processes: the cut of `parallel.Sharded`, without Python's global lock.

Two threads of one process can run numpy's loops at once, but every numpy call also runs some Python (reading
its arguments, making its result), and that part holds the global lock: a training step makes many small
calls, and each thread keeps waiting for the other's. A process has a lock of its own. So on Linux, `Sharded`
computes every shard but the first in a worker process of its own, and the first in the calling process, all
at once.

Nothing large is pickled. The parameters and the gradients travel through one block of shared memory, an
anonymous file (memfd) that the parent and every worker map:

```text
| parameters | gradients of worker 1 | gradients of worker 2 | ...
```

Each step the parent copies the parameters in, sends each worker its rows of the batch through a socket,
computes the first shard itself, then reads each worker's loss from its socket and its gradients where the
worker wrote them. A worker runs the same function on the same rows with BLAS on one thread, as a thread of
the parent would, so both ways give the same bits (tests/unit/test_parallel.py).

A worker starts at its pool's first step, with the parent's interpreter, its flags and its `sys.path` (as
PYTHONPATH), so it imports the module-level functions the parent does; when the parent's `sys.path` changes, the
pool starts new workers at the next step. It stays in the parent's process group, so whatever kills
the group kills it too, but it ignores Ctrl-C, which the parent handles. It ends when its socket closes: when
the parent closes the pool, exits or is killed. If a step is cut short (the parent's own shard fails, or it is
interrupted) while workers still compute, the parent kills them at once, so no late answer can be taken for
the next step's; the next step starts new workers. The pool is for one thread at a time: a second thread that
calls while a step is on gets threads instead (`parallel.Sharded`).
"""

import mmap
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from importlib import import_module
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np

ALIGN = 64  # bytes: every array in the shared block starts on a cache line


def supported():
    """True where workers can share memory this way: Linux, with memfd."""
    return sys.platform.startswith("linux") and hasattr(os, "memfd_create") and bool(sys.executable)


def by_name(function):
    """(module, qualified name) of a function a worker can import, or None: a lambda, a closure, a function of
    the script being run (`__main__`, which is another module in a worker)."""
    module, qualname = getattr(function, "__module__", None), getattr(function, "__qualname__", "")
    found = sys.modules.get(module)
    spec = getattr(found, "__spec__", None)
    if found is None or "<" in qualname or spec is None or spec.name != module:
        return None
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return (module, qualname) if found is function else None


def layout_of(params):
    """Where each parameter lies in a section of the block: [(name, shape, dtype, offset)] and the section's
    size in bytes. A worker's gradients have the same layout as the parameters."""
    entries, offset = [], 0
    for name, array in params.items():
        entries.append((name, array.shape, array.dtype.str, offset))
        offset += -(-array.nbytes // ALIGN) * ALIGN
    return entries, max(offset, ALIGN)


def views(block, entries, start):
    """The arrays of one section of the block, as views (no copy)."""
    return {name: np.ndarray(shape, dtype, block, start + offset) for name, shape, dtype, offset in entries}


class ShardWorkerError(RuntimeError):
    """A worker process ended before it answered."""


class ShardWorkers:
    """`count` worker processes and the shared block they read parameters from and write gradients into.

    Parameters
    ----------
    count : int
        How many workers; each computes one shard per step.
    """

    def __init__(self, count):
        self.count = count
        self.lock = threading.Lock()  # one step at a time
        self.fd = os.memfd_create("transformer-shards", os.MFD_CLOEXEC)
        self.layout, self.path = None, None
        self.procs, self.conns = [], []
        # Closes the workers when this object is collected, or at exit; holds the lists, not self.
        self.finalizer = weakref.finalize(self, end_workers, self.procs, self.conns, [self.fd])
        LIVE.add(self)
        self.start()

    def start(self):
        """Start the workers, with this process's `sys.path` as theirs (the `transformer` it runs first)."""
        self.path = list(sys.path)
        package_parent = str(Path(__file__).resolve().parent.parent)
        path = os.pathsep.join(dict.fromkeys(p for p in (package_parent, *self.path) if p))  # no "": cwd
        env = {**os.environ, "PYTHONPATH": path,
               "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        # This interpreter's flags (-W, -X, -O, -B, ...), and -P: no current folder on the path.
        flags = [*subprocess._args_from_interpreter_flags(), "-P"]
        try:
            for index in range(self.count):
                ours, theirs = socket.socketpair()
                self.conns.append(Connection(ours.detach()))
                command = [sys.executable, *flags, "-c", "from transformer.shard_processes import serve; serve()",
                           str(theirs.fileno()), str(self.fd), str(index)]
                with theirs:
                    self.procs.append(subprocess.Popen(command, pass_fds=(theirs.fileno(), self.fd), env=env,
                                                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL))
        except BaseException:
            self.close(now=True)
            raise

    @property
    def closed(self):
        return not self.finalizer.alive

    def share(self, params):
        """Copy the parameters into the block, laying it out anew (and telling the workers) when their names,
        shapes or dtypes changed; start new workers when this process's `sys.path` changed."""
        if sys.path != self.path:
            end_workers(self.procs, self.conns, [])
            self.procs.clear()
            self.conns.clear()
            self.layout = None  # the new workers have not mapped the block yet
            self.start()
        layout = layout_of(params)
        if layout != self.layout:
            entries, size = layout
            total = size * (1 + self.count)
            if os.fstat(self.fd).st_size < total:  # grow only: a worker may still map the old size
                os.ftruncate(self.fd, total)
            block = mmap.mmap(self.fd, total)
            self.params = views(block, entries, 0)
            self.grads = [views(block, entries, size * (1 + i)) for i in range(self.count)]
            for i in range(self.count):
                self.tell(i, ("layout", entries, size, total))
            self.layout = layout
        for name, array in params.items():
            np.copyto(self.params[name], array)  # every step: the parameters have changed since the last

    def __call__(self, compute, params, cfg, shards, first):
        """Each shard's (loss, gradients): `first()` in this process, shards[i] = (x, y) by worker i.

        The workers' gradients are views into the block, valid until the next call. Call with `lock` held.
        """
        answers = []
        try:
            self.share(params)
            for i, (x, y) in enumerate(shards):
                self.tell(i, ("compute", compute, x, y, cfg))
            mine = first()
            for i in range(len(shards)):
                answers.append(self.answer(i))
        except BaseException:
            # Answers still on their way would be taken for the next step's: end the workers now.
            self.close(now=len(answers) < len(shards))
            raise
        errors = [value for kind, value in answers if kind == "error"]
        if errors:
            raise errors[0]  # every answer was read: the workers are ready for the next step
        return [mine] + [(loss, self.grads[i]) for i, (_, loss) in enumerate(answers)]

    def tell(self, i, message):
        """Send worker i a message."""
        try:
            self.conns[i].send(message)
        except OSError:
            self.ended(i)

    def answer(self, i):
        """Worker i's answer: ("ok", loss) or ("error", exception)."""
        try:
            return self.conns[i].recv()
        except (EOFError, OSError):
            self.ended(i)

    def ended(self, i):
        proc = self.procs[i]
        raise ShardWorkerError(f"shard worker {i + 1} (pid {proc.pid}) ended before it answered "
                               f"(exit status {proc.wait()})") from None

    def close(self, now=False):
        """End the workers: they see their sockets close and exit; now=True kills them instead."""
        if now:
            for proc in self.procs:
                proc.kill()
        self.finalizer()


LIVE = weakref.WeakSet()  # every pool of this process, for a fork (below)


def end_workers(procs, conns, fds, wait_s=10):
    """Close the sockets and the block, then wait for the workers to exit (killed after wait_s in all)."""
    for conn in conns:
        conn.close()
    for fd in fds:
        os.close(fd)
    deadline = time.monotonic() + wait_s
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def forget_in_child():
    """In a child forked from a process with pools: its copies of their sockets and blocks are closed, and the
    pools are marked closed, so the child neither reads another process's answers nor keeps workers alive."""
    for pool in list(LIVE):
        if pool.closed:  # its descriptors are closed already, and their numbers may be another's now
            continue
        for conn in pool.conns:
            conn.close()
        os.close(pool.fd)
        pool.procs.clear()  # not the child's to wait for
        pool.finalizer.detach()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=forget_in_child)


def one_blas_thread():
    """Make BLAS run one thread per call from now on, in this whole process (threadpoolctl); False when
    threadpoolctl is not installed, and then the shards share the cores with BLAS's own threads."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return False
    ThreadpoolController().limit(limits=1, user_api="blas")
    return True


def serve():
    """A worker's life: map the block, then compute the shards the parent sends until its socket closes."""
    from .memory import keep_freed_memory

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it then ends the workers
    conn_fd, block_fd, index = (int(a) for a in sys.argv[1:4])
    conn = Connection(conn_fd)
    one_blas_thread()
    keep_freed_memory()
    params = grads = None
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message[0] == "layout":
            _, entries, size, total = message
            block = mmap.mmap(block_fd, total)
            params, grads = views(block, entries, 0), views(block, entries, size * (1 + index))
            continue
        _, (module, qualname), x, y, cfg = message
        try:
            compute = import_module(module)
            for part in qualname.split("."):
                compute = getattr(compute, part)
            loss, shard_grads = compute(params, x, y, cfg)
            if shard_grads.keys() != grads.keys():
                raise ValueError(f"{qualname} returned gradients for {sorted(shard_grads)}, not the parameters")
            for name, grad in shard_grads.items():
                if grad.shape != grads[name].shape or grad.dtype != grads[name].dtype:
                    raise ValueError(f"{qualname} returned a {grad.dtype} {grad.shape} gradient for {name}, "
                                     f"whose parameter is {grads[name].dtype} {grads[name].shape}")
                np.copyto(grads[name], grad)
            answer = ("ok", loss)
        except Exception as error:  # sent to the parent, which raises it
            answer = ("error", error)
        try:
            try:
                conn.send(answer)
            except Exception:  # an exception that does not pickle
                if answer[0] != "error":
                    raise
                conn.send(("error", RuntimeError(f"in shard worker {index + 1}: {answer[1]!r}")))
        except OSError:  # the parent is gone
            return
