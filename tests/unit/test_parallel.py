"""A batch computed in shards, by threads or worker processes, gives the numbers of one pass over it, up to
rounding; processes give the very bits of threads, and end with their pool, their parent or a failed step."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from transformer.autograd_model import loss_and_grads as autograd_loss_and_grads
from transformer.config import ModelConfig
from transformer.model import init_params, loss_and_grads
from transformer.parallel import Sharded, shard_rows
from transformer.shard_processes import ShardWorkerError, by_name, supported
from transformer.train import evaluate

CFG = ModelConfig(vocab_size=11, context_len=8, emb_dim=8, num_heads=2, num_layers=2, ff_dim=12)


@pytest.mark.parametrize("batch,shards", [(1, 2), (2, 2), (7, 2), (7, 3), (8, 16)])
def test_shards_cover_every_row_once_and_differ_in_size_by_at_most_one(batch, shards):
    rows = shard_rows(batch, shards)
    assert [r for a, b in rows for r in range(a, b)] == list(range(batch))
    sizes = [b - a for a, b in rows]
    assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1 and len(rows) == min(batch, shards)


needs_processes = pytest.mark.skipif(not supported(), reason="worker processes need Linux (memfd)")
MODES = [pytest.param(False, id="threads"), pytest.param(True, id="processes", marks=needs_processes)]


@pytest.mark.parametrize("processes", MODES)
@pytest.mark.parametrize("compute", [loss_and_grads, autograd_loss_and_grads], ids=["handwritten", "autograd"])
@pytest.mark.parametrize("batch,threads", [(7, 2), (7, 3), (5, 8), (1, 2)])
def test_a_sharded_batch_has_the_loss_and_gradients_of_one_pass(compute, batch, threads, processes):
    """The shards are weighted by their share of the rows: 3 and 4 rows of 7 weigh 3/7 and 4/7, not 1/2 each
    (a plain mean of the shards' means would be off by a relative 1/7 here)."""
    params = init_params(CFG, seed=3)
    rng = np.random.default_rng(4)
    x, y = rng.integers(0, CFG.vocab_size, (2, batch, CFG.context_len))
    loss, grads = compute(params, x, y, CFG)
    sharded = Sharded(threads, processes)
    shard_loss, shard_grads = sharded(compute, params, x, y, CFG)
    if sharded.workers:
        sharded.workers.close()
    assert shard_loss == pytest.approx(loss, rel=1e-12)
    for name, g in grads.items():
        if not name.endswith(".bk"):  # exactly zero in theory: its entries are rounding noise
            np.testing.assert_allclose(shard_grads[name], g, rtol=1e-12, atol=1e-12 * np.abs(g).max())


@pytest.mark.parametrize("processes", MODES)
def test_sharded_float32_gradients_stay_float32(processes):
    params = init_params(CFG, seed=3, dtype=np.float32)
    x = np.zeros((4, CFG.context_len), dtype=int)
    sharded = Sharded(2, processes)
    _, grads = sharded(loss_and_grads, params, x, x, CFG)
    assert {g.dtype for g in grads.values()} == {np.dtype(np.float32)}
    assert sharded.workers is None if not processes else sharded.workers.fd is not None
    if sharded.workers:
        sharded.workers.close()


@pytest.fixture
def workers():
    """A Sharded of three shards whose two worker processes are closed after the test."""
    sharded = Sharded(3, processes=True)
    yield sharded
    if sharded.workers:
        sharded.workers.close()


def batch(rng, size=7, cfg=CFG):
    return rng.integers(0, cfg.vocab_size, (2, size, cfg.context_len))


@needs_processes
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_worker_processes_give_the_bits_of_threads_step_after_step(workers, dtype):
    """Three steps, the parameters changed in place between them (as AdamW does), then another model with
    other shapes: each step's loss and gradients are those of threads, bit for bit. Watched failing with the
    parameters copied into the shared block only when its layout changes."""
    threads = Sharded(3, processes=False)
    rng = np.random.default_rng(8)
    params = init_params(CFG, seed=3, dtype=dtype)
    other_cfg = ModelConfig(vocab_size=7, context_len=6, emb_dim=12, num_heads=3, num_layers=1, ff_dim=10)
    steps = [(params, CFG)] * 3 + [(init_params(other_cfg, seed=4, dtype=dtype), other_cfg)]
    for step, (p, cfg) in enumerate(steps):
        x, y = batch(rng, cfg=cfg)
        loss, grads = workers(loss_and_grads, p, x, y, cfg)
        want_loss, want = threads(loss_and_grads, p, x, y, cfg)
        assert loss == want_loss, step
        assert grads.keys() == want.keys()
        for name in want:
            assert np.array_equal(grads[name], want[name]), (step, name)
        for name in p:
            p[name] += dtype(0.01) * (step + 1)


def test_only_functions_a_new_process_can_import_go_to_workers():
    def local(params, x, y, cfg):
        return loss_and_grads(params, x, y, cfg)

    assert by_name(loss_and_grads) == ("transformer.model", "loss_and_grads")
    assert by_name(local) is None and by_name(lambda *a: 0) is None


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
def test_workers_run_in_a_session_of_their_own_and_end_with_their_pool(workers):
    """Ctrl-C at a terminal signals the terminal's foreground group: the workers are not in it."""
    x, y = batch(np.random.default_rng(1))
    workers(loss_and_grads, init_params(CFG, seed=3), x, y, CFG)
    pids = [proc.pid for proc in workers.workers.procs]
    assert len(pids) == 2 and all(os.getsid(pid) == pid != os.getsid(0) for pid in pids)
    workers.workers.close()
    assert all(gone(pid) for pid in pids)


def failing_compute(params, x, y, cfg):
    """Refuses the shard whose first window starts with token 0, as a model refuses bad input."""
    if x[0, 0] == 0:
        raise ValueError(f"first token {x[0, 0]}")
    return loss_and_grads(params, x, y, cfg)


@needs_processes
def test_an_error_in_a_worker_is_raised_in_the_parent_and_the_next_step_starts_new_workers(workers):
    params = init_params(CFG, seed=3)
    x, y = batch(np.random.default_rng(1))
    x[:, 0] = 1
    x[4, 0] = 0  # the third shard (rows 4 to 6): the second worker's
    with pytest.raises(ValueError, match="first token 0"):
        workers(failing_compute, params, x, y, CFG)
    assert workers.workers.fd is None  # closed
    x[4, 0] = 1
    loss, _ = workers(failing_compute, params, x, y, CFG)
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


PARENT = """
import sys, time, numpy as np
from transformer.config import ModelConfig
from transformer.model import init_params, loss_and_grads
from transformer.parallel import Sharded
cfg = ModelConfig(vocab_size=11, context_len=8, emb_dim=8, num_heads=2, num_layers=2, ff_dim=12)
sharded = Sharded(3, processes=True)
x = np.zeros((6, 8), dtype=int)
sharded(loss_and_grads, init_params(cfg), x, x, cfg)
print(*(proc.pid for proc in sharded.workers.procs), flush=True)
time.sleep(float(sys.argv[1]))
"""


@needs_processes
@pytest.mark.parametrize("how", ["exits", "is killed"])
def test_workers_end_when_their_parent_exits_or_is_killed(how, tmp_path):
    parent = subprocess.Popen([sys.executable, "-c", PARENT, "0" if how == "exits" else "60"],
                              stdout=subprocess.PIPE, text=True)
    pids = [int(pid) for pid in parent.stdout.readline().split()]
    assert len(pids) == 2
    if how == "is killed":
        parent.kill()
    assert parent.wait(timeout=30) == (0 if how == "exits" else -signal.SIGKILL)
    assert all(gone(pid) for pid in pids)


def test_evaluation_in_threads_gives_the_same_mean_loss():
    params = init_params(CFG, seed=5)
    data = np.random.default_rng(6).integers(0, CFG.vocab_size, 301)
    one = evaluate(params, CFG, data, seq_len=8, batch_size=4, threads=1)
    assert evaluate(params, CFG, data, seq_len=8, batch_size=4, threads=3) == one
