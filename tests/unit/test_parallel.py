"""A batch computed in shards, by threads or worker processes, gives the numbers of one pass over it, up to
rounding; processes give the very bits of threads, and end with their pool, their parent or a failed step."""

import os
import select
import signal
import subprocess
import sys
import threading
import time
import warnings

import numpy as np
import pytest

from transformer.autograd_model import loss_and_grads as autograd_loss_and_grads
from transformer.config import ModelConfig
from transformer.model import init_params, loss_and_grads
from transformer import parallel
from transformer.parallel import Sharded, shard_rows
from transformer.shard_processes import ShardWorkerError, by_name, supported
from transformer.step import evaluate

CFG = ModelConfig(vocab_size=11, context_len=8, emb_dim=8, num_heads=2, num_layers=2, ff_dim=12)


@pytest.mark.parametrize("batch,shards", [(1, 2), (2, 2), (7, 2), (7, 3), (8, 16)])
def test_shards_cover_every_row_once_and_differ_in_size_by_at_most_one(batch, shards):
    rows = shard_rows(batch, shards)
    assert [r for a, b in rows for r in range(a, b)] == list(range(batch))
    sizes = [b - a for a, b in rows]
    assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1 and len(rows) == min(batch, shards)


needs_processes = pytest.mark.skipif(not supported(), reason="worker processes need Linux (memfd)")
MODES = [pytest.param(False, id="threads"), pytest.param(True, id="processes", marks=needs_processes)]


# More shards than rows: (5, 8) in threads; in processes (2, 3), which starts fewer workers than 7 (0.25 s each).
@pytest.mark.parametrize("processes,batch,threads", [
    *((False, b, t) for b, t in [(7, 2), (7, 3), (5, 8), (1, 2)]),
    *(pytest.param(True, b, t, marks=needs_processes) for b, t in [(7, 2), (7, 3), (2, 3), (1, 2)])])
@pytest.mark.parametrize("compute", [loss_and_grads, autograd_loss_and_grads], ids=["handwritten", "autograd"])
def test_a_sharded_batch_has_the_loss_and_gradients_of_one_pass(compute, batch, threads, processes):
    """The shards are weighted by their share of the rows: 3 and 4 rows of 7 weigh 3/7 and 4/7, not 1/2 each
    (a plain mean of the shards' means would be off by a relative 1/7 here)."""
    params = init_params(CFG, seed=3)
    rng = np.random.default_rng(4)
    x, y = rng.integers(0, CFG.vocab_size, (2, batch, CFG.context_len))
    loss, grads = compute(params, x, y, CFG)
    sharded = Sharded(threads, processes)
    shard_loss, shard_grads = sharded(compute, params, x, y, CFG)
    assert (sharded.workers is not None) == (processes and batch > 1)  # the workers computed
    sharded.close()
    assert shard_loss == pytest.approx(loss, rel=1e-12)
    for name, g in grads.items():
        if not name.endswith(".bk"):  # exactly zero in theory: its entries are rounding noise
            np.testing.assert_allclose(shard_grads[name], g, rtol=1e-12, atol=1e-12 * np.abs(g).max())


def test_sharded_float32_gradients_stay_float32():
    params = init_params(CFG, seed=3, dtype=np.float32)
    x = np.zeros((4, CFG.context_len), dtype=int)
    _, grads = Sharded(2, processes=False)(loss_and_grads, params, x, x, CFG)
    assert {g.dtype for g in grads.values()} == {np.dtype(np.float32)}


def test_evaluation_in_threads_gives_the_same_mean_loss():
    params = init_params(CFG, seed=5)
    data = np.random.default_rng(6).integers(0, CFG.vocab_size, 301)
    one = evaluate(params, CFG, data, seq_len=8, batch_size=4, threads=1)
    assert evaluate(params, CFG, data, seq_len=8, batch_size=4, threads=3) == one


@pytest.fixture
def workers():
    """A Sharded of three shards, two of them in worker processes, ended after the test."""
    sharded = Sharded(3, processes=True)
    yield sharded
    sharded.close()


def batch(rng, size=7, cfg=CFG):
    return rng.integers(0, cfg.vocab_size, (2, size, cfg.context_len))


@needs_processes
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_worker_processes_give_the_bits_of_threads_step_after_step(workers, dtype):
    """Three steps, the parameters changed in place between them (as AdamW does), then another model with
    other shapes: each step's loss and gradients are those of threads, bit for bit, and float32 stays float32.
    Watched failing with the parameters copied into the shared block only when its layout changes."""
    threads = Sharded(3, processes=False)
    rng = np.random.default_rng(8)
    params = init_params(CFG, seed=3, dtype=dtype)
    other_cfg = ModelConfig(vocab_size=7, context_len=6, emb_dim=12, num_heads=3, num_layers=1, ff_dim=10)
    steps = [(params, CFG)] * 3 + [(init_params(other_cfg, seed=4, dtype=dtype), other_cfg)]
    for step, (p, cfg) in enumerate(steps):
        x, y = batch(rng, cfg=cfg)
        loss, grads = workers(loss_and_grads, p, x, y, cfg)
        assert len(workers.workers.procs) == 2  # they, not threads, computed two of the shards
        want_loss, want = threads(loss_and_grads, p, x, y, cfg)
        assert loss == want_loss, step
        assert grads.keys() == want.keys()
        for name in want:
            assert grads[name].dtype == dtype and np.array_equal(grads[name], want[name]), (step, name)
        for name in p:
            p[name] += dtype(0.01) * (step + 1)


def test_without_one_blas_thread_the_shards_are_threads(monkeypatch):
    """Workers run BLAS on one thread; a parent that cannot do the same (no threadpoolctl) would round its
    shard's matmuls otherwise, so it keeps to threads."""
    monkeypatch.setattr(parallel, "one_blas_thread", lambda: False)
    assert not Sharded(2, processes=True).processes


def test_only_functions_a_worker_can_import_go_to_workers(monkeypatch):
    """A script's own function lives in `__main__`, which in a worker is another module. Watched failing with
    `__main__` let through."""
    def local(params, x, y, cfg):
        return loss_and_grads(params, x, y, cfg)

    assert by_name(loss_and_grads) == ("transformer.model", "loss_and_grads")
    assert by_name(local) is None and by_name(lambda *a: 0) is None
    scripted = type(local)(local.__code__, {"__name__": "__main__"}, "scripted")
    scripted.__module__, scripted.__qualname__ = "__main__", "scripted"
    monkeypatch.setattr(sys.modules["__main__"], "scripted", scripted, raising=False)
    assert by_name(scripted) is None


def gone(pid, within=10.0):
    """True once pid has exited (a zombie counts: an init that does not reap it keeps its entry)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


@needs_processes
def test_workers_are_in_the_parents_process_group_and_end_with_their_pool(workers):
    """Whatever kills the parent's group (the mutation run's time limit) kills the workers too."""
    x, y = batch(np.random.default_rng(1))
    workers(loss_and_grads, init_params(CFG, seed=3), x, y, CFG)
    pids = [proc.pid for proc in workers.workers.procs]
    assert len(pids) == 2 and all(os.getpgid(pid) == os.getpgid(0) for pid in pids)
    workers.close()
    assert workers.workers.closed and all(gone(pid) for pid in pids)


def failing_compute(params, x, y, cfg):
    """Refuses the shard whose first window starts with token 0, as a model refuses bad input."""
    if x[0, 0] == 0:
        raise ValueError(f"first token {x[0, 0]}")
    return loss_and_grads(params, x, y, cfg)


@needs_processes
def test_an_error_in_a_worker_is_raised_in_the_parent_and_the_workers_stay(workers):
    params = init_params(CFG, seed=3)
    x, y = batch(np.random.default_rng(1))
    x[:, 0] = 1
    workers(failing_compute, params, x, y, CFG)
    pids = [proc.pid for proc in workers.workers.procs]
    x[4, 0] = 0  # the third shard (rows 4 to 6): the second worker's
    with pytest.raises(ValueError, match="first token 0"):
        workers(failing_compute, params, x, y, CFG)
    x[4, 0] = 1  # every answer was read: the same workers compute the next step
    loss, _ = workers(failing_compute, params, x, y, CFG)
    assert [proc.pid for proc in workers.workers.procs] == pids
    assert loss == pytest.approx(loss_and_grads(params, x, y, CFG)[0], rel=1e-12)


@needs_processes
def test_a_step_that_fails_in_the_parent_leaves_no_answer_for_the_next(workers):
    """The parent's own shard fails while the workers compute theirs: their answers must not be taken for the
    next step's. Watched failing with the pool kept open after a failed step (the next step got the old
    losses)."""
    params = init_params(CFG, seed=3)
    x, y = batch(np.random.default_rng(1))
    x[:, 0] = 1
    x[0, 0] = 0  # the first shard: the parent's
    with pytest.raises(ValueError, match="first token 0"):
        workers(failing_compute, params, x, y, CFG)
    x2, y2 = batch(np.random.default_rng(2))
    x2[:, 0] = 1
    loss, grads = workers(loss_and_grads, params, x2, y2, CFG)
    want_loss, want = Sharded(3, processes=False)(loss_and_grads, params, x2, y2, CFG)
    assert loss == want_loss and all(np.array_equal(grads[name], want[name]) for name in want)


@needs_processes
def test_a_worker_that_dies_is_named_and_the_next_step_starts_new_workers(workers):
    params = init_params(CFG, seed=3)
    x, y = batch(np.random.default_rng(1))
    workers(loss_and_grads, params, x, y, CFG)
    victim = workers.workers.procs[1]
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    with pytest.raises(ShardWorkerError, match=rf"shard worker 2 \(pid {victim.pid}\) ended before it answered"):
        workers(loss_and_grads, params, x, y, CFG)
    workers(loss_and_grads, params, x, y, CFG)
    assert all(proc.poll() is None for proc in workers.workers.procs)


def slow_compute(params, x, y, cfg):
    """loss_and_grads, but a minute long for a shard whose first token is 2 (a worker's, below)."""
    if x[0, 0] == 2:
        time.sleep(60)
    return loss_and_grads(params, x, y, cfg)


@needs_processes
def test_while_one_thread_steps_another_gets_threads_and_the_same_numbers(workers):
    """The pool is one thread's at a time: a second thread's step, taken meanwhile, runs in threads."""
    params = init_params(CFG, seed=3)
    x, y = batch(np.random.default_rng(1))
    want = Sharded(3, processes=False)(loss_and_grads, params, x, y, CFG)[0]
    workers.idle_workers(loss_and_grads)  # start them, and hold them as a step would
    try:
        got = []
        other = threading.Thread(target=lambda: got.append(workers(loss_and_grads, params, x, y, CFG)[0]))
        other.start()
        other.join(timeout=20)
        assert got == [want]
    finally:
        workers.workers.lock.release()
    assert workers(loss_and_grads, params, x, y, CFG)[0] == want


PARENT = """
import signal, sys, time, numpy as np
# Ctrl-C raises KeyboardInterrupt, as in a terminal's foreground process: one started by a background job of a
# script (`cmd &`, nohup) inherits Ctrl-C ignored, and Python then keeps ignoring it.
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.path.insert(0, sys.argv[2])
from test_parallel import slow_compute
from transformer.config import ModelConfig
from transformer.model import init_params, loss_and_grads
from transformer.parallel import Sharded
cfg = ModelConfig(vocab_size=11, context_len=8, emb_dim=8, num_heads=2, num_layers=2, ff_dim=12)
sharded = Sharded(3, processes=True)
x = np.zeros((6, 8), dtype=int)
sharded(loss_and_grads, init_params(cfg), x, x, cfg)
print(*(proc.pid for proc in sharded.workers.procs), flush=True)
if sys.argv[1] == "step":
    x[2:4] = 2  # the first worker's shard: a minute long
    sharded(slow_compute, init_params(cfg), x, x, cfg)
else:
    time.sleep(float(sys.argv[1]))
"""


def start_parent(how):
    """A process with a pool of two workers: their pids, once its first step is done."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT, how, os.path.dirname(__file__)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    ready, _, _ = select.select([parent.stdout], [], [], 60)
    assert ready, "the parent did not report its workers within a minute"
    pids = [int(pid) for pid in parent.stdout.readline().split()]
    assert len(pids) == 2, parent.stderr.read()
    return parent, pids


@needs_processes
@pytest.mark.parametrize("how", ["exits", "is killed", "its group is killed mid-step", "Ctrl-C mid-step"])
def test_workers_end_with_their_parent(how):
    """Mid-step, one worker sleeps through a minute-long shard: it must end at once all the same, and print
    nothing. Watched failing with the workers in a session of their own (a killed group left them running) and
    with the pool ended politely after Ctrl-C (ten seconds' wait)."""
    parent, pids = start_parent({"exits": "0", "is killed": "60"}.get(how, "step"))
    time.sleep(0.5)  # into the step
    start = time.monotonic()
    if how == "is killed":
        parent.kill()
    elif how == "its group is killed mid-step":
        os.killpg(parent.pid, signal.SIGKILL)
    elif how == "Ctrl-C mid-step":
        os.killpg(parent.pid, signal.SIGINT)  # what a terminal does: the whole foreground group
    _, err = parent.communicate(timeout=60)
    assert all(gone(pid, within=5.0) for pid in pids)
    assert time.monotonic() - start < 5.0
    if how == "exits":
        assert parent.returncode == 0 and err == ""
    elif how == "Ctrl-C mid-step":  # the parent's own KeyboardInterrupt, and nothing from the workers
        assert err.count("KeyboardInterrupt") == 1 and "serve" not in err, err


@needs_processes
def test_a_forked_child_forgets_the_pool_and_the_parent_keeps_it(workers):
    """A child forked without exec holds copies of the pool's sockets: it must not use them, nor keep the
    workers alive. Watched failing without the fork handler (the child saw the pool open)."""
    params = init_params(CFG, seed=3)
    x, y = batch(np.random.default_rng(1))
    want = workers(loss_and_grads, params, x, y, CFG)[0]
    pids = [proc.pid for proc in workers.workers.procs]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # Python 3.12+: fork() in a process with threads
        child = os.fork()
    if child == 0:
        os._exit(0 if workers.workers.closed and not workers.workers.procs else 1)
    assert os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == 0
    assert workers(loss_and_grads, params, x, y, CFG)[0] == want
    assert [proc.pid for proc in workers.workers.procs] == pids
