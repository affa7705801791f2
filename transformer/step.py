"""One training step, all or nothing, and the validation loss.

A step whose loss, a gradient or an update is not finite commits nothing (no parameter, no AdamW moment,
no step count); the loop then stops with a checkpoint of its last good step, or skips the batch
(TrainConfig.on_nonfinite).
"""

import math
import time

import numpy as np

from .config import ModelConfig
from .data import eval_windows, sample_batch
from .errors import MaskedRowError, NonFiniteError
from .model import forward
from .optim import adamw_update, clip_grads, lr_at
from .parallel import sharded
from .run_state import Run
from .softmax import cross_entropy_forward


def train_step(run: Run, train_ids, seq_len, change_grads=None) -> dict:
    """Take one optimizer step on a fresh random batch, all or nothing.

    Parameters
    ----------
    run : Run
        The run; its parameters, optimizer state, sampler and step are updated in place.
    train_ids : ndarray of shape (n,)
        The training split.
    seq_len : int
        Tokens per window.
    change_grads : callable, optional
        See `finite_loss_and_grads`.

    Returns
    -------
    dict
        The step's metrics record: step, loss, lr, grad_norm and tokens_per_s.

    Raises
    ------
    NonFiniteError
        If the loss, a gradient or the update is not finite. Then no parameter, no moment and not the step
        count changed; only the sampler has moved past the batch. The message names the step and what was
        not finite first (the loss, or the first parameter in the model's order).
    """
    tc = run.train_cfg
    t0 = time.perf_counter()
    lr = lr_at(run.step, tc.lr, tc.warmup, tc.steps, tc.min_lr)
    x, y = sample_batch(train_ids, tc.batch_size, seq_len, run.rng)
    where = f"step {run.step + 1}"
    with np.errstate(over="ignore", invalid="ignore"):  # what is not finite is reported below
        loss, grads = finite_loss_and_grads(run, x, y, where, change_grads)
        grads, norm = clip_grads(grads, tc.grad_clip or None)
        try:
            adamw_update(run.params, grads, run.opt_state, lr, tc.adamw())
        except NonFiniteError as e:
            raise NonFiniteError(f"{where}: {e} (loss {loss:.4f})", e.name) from None
    run.step += 1
    return {"step": run.step, "loss": loss, "lr": lr, "grad_norm": norm,
            "tokens_per_s": x.size / (time.perf_counter() - t0)}


def finite_loss_and_grads(run: Run, x, y, where, change_grads=None):
    """The run's loss and gradients on a batch, refused unless the loss is finite.

    Parameters
    ----------
    run : Run
        The run whose `loss_and_grads` computes them.
    x, y : ndarray of shape (B, T)
        The batch's inputs and targets.
    where : str
        The step, for messages.
    change_grads : callable, optional
        Called as change_grads(grads) on the gradients as they leave the backward, before any check; the step
        uses what it returns (`Hooks.gradients` of transformer/train.py: a fault injected into one batch).

    Raises
    ------
    NonFiniteError
        Naming `where` (the step), when the loss is not finite.
    """
    try:
        loss, grads = run.loss_and_grads(x, y)
    except MaskedRowError as e:  # scores that overflowed to -inf: a diverged model, not a bad input
        raise NonFiniteError(f"{where}: the loss is not finite ({e}); training diverged", "loss") from None
    if change_grads is not None:
        grads = change_grads(grads)
    if not math.isfinite(loss):
        hint = "" if run.train_cfg.grad_clip else " (--grad-clip, e.g. 1.0, bounds each step)"
        raise NonFiniteError(f"{where}: the loss became {loss}: training diverged{hint}", "loss")
    return loss, grads  # a gradient that is not finite is refused by adamw_update, which names the first


def evaluate(params, cfg: ModelConfig, data, seq_len, batch_size=64, threads=1) -> float:
    """Mean cross-entropy over every token of data, each predicted once.

    Parameters
    ----------
    params : dict
        Parameter name to array.
    cfg : ModelConfig
        The model configuration.
    data : ndarray of shape (n,)
        Token ids.
    seq_len : int
        Tokens per window.
    batch_size : int
        Windows per forward pass.
    threads : int
        Forward passes computed at once (0: one per core).

    Returns
    -------
    float
        The mean loss.
    """
    windows = list(eval_windows(data, seq_len))
    full = [w for w in windows if len(w[0]) == seq_len]
    batches = [(np.stack([w[0] for w in full[i:i + batch_size]]), np.stack([w[1] for w in full[i:i + batch_size]]))
               for i in range(0, len(full), batch_size)] + windows[len(full):]  # and the shorter tail window, if any
    sums = sharded(threads).map(lambda xy: _sum_loss(params, *xy, cfg), batches)
    return sum(sums) / sum(y.size for _, y in batches)


def _sum_loss(params, x, y, cfg):
    logits, _ = forward(params, x, cfg)
    mean, _ = cross_entropy_forward(logits, y)
    return mean * y.size
