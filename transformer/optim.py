"""AdamW with decoupled weight decay, the learning-rate schedule, and
global-norm gradient clipping.
"""

import math
from dataclasses import dataclass, field

import numpy as np

from .config import is_finite_number
from .errors import InputError, NonFiniteError

# Weight decay pulls matrices (weights and embedding tables) towards zero.
# Biases and LayerNorm gains/shifts are not decayed: shrinking a gain towards
# zero would fight the normalisation rather than regularise the model.
DECAYED_SUFFIXES = ("tok_emb", "pos_emb", "wq", "wk", "wv", "wo", "ff1_w", "ff2_w", "head_w")


def is_decayed(name: str) -> bool:
    """Tell whether weight decay applies to a parameter (see DECAYED_SUFFIXES).

    Parameters
    ----------
    name : str
        The parameter's name, with or without its block prefix.

    Returns
    -------
    bool
        True for the matrices and embedding tables, False for biases and LayerNorm gains and shifts.
    """
    return name.rsplit(".", 1)[-1] in DECAYED_SUFFIXES


@dataclass(frozen=True)
class AdamWConfig:
    """Hyperparameters of AdamW.

    Each field's meaning is its `help`; the Configuration page of the site reads it from here.
    """
    lr: float = field(default=3e-3, metadata={"help": "learning rate; adamw_update takes each step's rate as an "
                                                      "argument instead, from the schedule"})
    beta1: float = field(default=0.9, metadata={"help": "decay of the running mean of gradients"})
    beta2: float = field(default=0.99, metadata={"help": "decay of the running mean of squared gradients"})
    eps: float = field(default=1e-8, metadata={"help": "keeps the update finite where v is ~0"})
    weight_decay: float = field(default=0.1, metadata={"help": "decoupled: p -= lr * wd * p, for the weight "
                                                               "matrices and embedding tables only (DECAYED_SUFFIXES)"})


def adamw_init(params):
    """Fresh optimizer state: zero first and second moments and a step count of 0.

    Parameters
    ----------
    params : dict
        Parameter name to array.

    Returns
    -------
    dict
        The state: "m" and "v" (dicts of arrays keyed like params) and "step".
    """
    return {"m": {k: np.zeros_like(v) for k, v in params.items()},
            "v": {k: np.zeros_like(v) for k, v in params.items()},
            "step": 0}


def first_nonfinite(arrays):
    """The name of the first array, in the dict's order, that holds a NaN or an infinity.

    Parameters
    ----------
    arrays : dict
        Name to array (parameters, gradients).

    Returns
    -------
    str or None
        The name, or None when every entry of every array is finite.
    """
    return next((name for name, a in arrays.items() if not np.isfinite(a).all()), None)


def adamw_update(params, grads, state, lr, cfg: AdamWConfig):
    """Take one AdamW step, updating params and state in place, all or nothing.

    For each parameter p with gradient g, in the order torch.optim.AdamW uses:

    ```text
    p <- p * (1 - lr * wd)                       (decayed keys only)
    m <- b1 m + (1 - b1) g;   v <- b2 v + (1 - b2) g^2
    p <- p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
    ```

    Every new value is computed first; they are committed only when every gradient and every new
    parameter is finite. Otherwise nothing changes: no parameter, no moment, not the step count.

    Parameters
    ----------
    params : dict
        Parameter name to array; updated in place.
    grads : dict
        Gradient of each parameter, keyed like params.
    state : dict
        The state from `adamw_init`; updated in place.
    lr : float
        The learning rate of this step (used instead of cfg.lr).
    cfg : AdamWConfig
        The betas, eps and weight decay.

    Raises
    ------
    NonFiniteError
        If a gradient holds a NaN or an infinity, or the update would make a parameter non-finite; its
        `name` is the first such parameter.
    """
    bad = first_nonfinite({name: grads[name] for name in params})
    if bad is not None:
        raise NonFiniteError(f"the gradient of {bad} is not finite", bad)
    t = state["step"] + 1
    new = {name: adamw_param(name, p, grads[name], state["m"][name], state["v"][name], lr, t, cfg)
           for name, p in params.items()}
    bad = first_nonfinite({name: p for name, (p, _, _) in new.items()})
    if bad is not None:
        raise NonFiniteError(f"the update would make {bad} non-finite", bad)
    for name, (p, m, v) in new.items():  # commit: every check has passed
        params[name][...], state["m"][name][...], state["v"][name][...] = p, m, v
    state["step"] = t


def adamw_param(name, p, g, m, v, lr, t, cfg: AdamWConfig):
    """One parameter's AdamW step at step count t, into new arrays; p, m and v are left as they are.

    Returns
    -------
    (p, m, v)
        The new parameter and moments.
    """
    bias1 = 1.0 - cfg.beta1 ** t  # eq:adam-bias-correction
    bias2_sqrt = math.sqrt(1.0 - cfg.beta2 ** t)  # eq:adam-bias-correction
    if cfg.weight_decay and is_decayed(name):
        p = p * (1.0 - lr * cfg.weight_decay)  # eq:adamw-decay
    m = m * cfg.beta1  # eq:adam-moments
    m += (1.0 - cfg.beta1) * g  # eq:adam-moments
    v = v * cfg.beta2  # eq:adam-moments
    v += (1.0 - cfg.beta2) * (g * g)  # eq:adam-moments
    denom = np.sqrt(v) / bias2_sqrt + cfg.eps
    p = p - (lr / bias1) * (m / denom)  # eq:adam-update
    return p, m, v


def lr_at(step, peak_lr, warmup_steps, total_steps, min_lr=0.0):
    """Learning rate at a step: linear warm-up to peak_lr, then cosine decay to min_lr.

    Parameters
    ----------
    step : int
        The step, counted from 0.
    peak_lr : float
        The rate reached at the end of warm-up.
    warmup_steps : int
        The number of warm-up steps.
    total_steps : int
        The step at which the decay reaches min_lr; later steps also get min_lr.
    min_lr : float
        The rate at the end of the decay.

    Returns
    -------
    float
        The learning rate.
    """
    if step < warmup_steps:  # eq:lr-schedule
        return peak_lr * (step + 1) / warmup_steps  # eq:lr-warmup
    if step >= total_steps:  # eq:lr-schedule
        return min_lr  # eq:lr-schedule
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)  # eq:lr-cosine
    return min_lr + 0.5 * (peak_lr - min_lr) * (1.0 + math.cos(math.pi * progress))  # eq:lr-cosine


def global_norm(grads) -> float:
    """Global norm of the gradients: the square root of the sum of squares of every entry.

    Every entry is divided by a power of two s near the largest magnitude before it is squared, and the
    root is multiplied back: `s * sqrt(sum (g / s)^2)`. Scaling by a power of two is exact, so where the
    plain `sqrt(sum g^2)` neither overflows nor underflows this gives the very same bits; where the
    squares would overflow (entries past about 1e154 in float64, 1.8e19 in float32) it still gives the
    norm instead of inf. A NaN or an infinity among the entries gives a NaN or an infinite norm.

    Parameters
    ----------
    grads : dict
        Parameter name to gradient array.

    Returns
    -------
    float
        The norm.
    """
    largest = max((float(np.max(np.abs(g))) for g in grads.values() if g.size), default=0.0)
    if largest == 0.0 or not math.isfinite(largest):
        return largest  # all zero, or a NaN (the max propagates it) or an infinity
    s = math.ldexp(1.0, math.frexp(largest)[1] - 1)  # eq:global-norm-scale  s <= largest < 2 s
    total = 0.0
    for g in grads.values():
        scaled = g / s  # eq:global-norm  exact (s is a power of two), made once for both factors of the product
        total += float(np.vdot(scaled, scaled))  # eq:global-norm  each term <= 4
    return s * math.sqrt(total)  # eq:global-norm


def clip_grads(grads, max_norm):
    """Scale all gradients by one factor so that their global norm is at most max_norm.

    The input arrays are never modified. Gradients whose norm is not finite are returned as they are:
    no factor can clip them, and the caller (`train_step`, `adamw_update`) refuses them.

    Parameters
    ----------
    grads : dict
        Parameter name to gradient array.
    max_norm : float or None
        The largest norm allowed; None disables clipping.

    Returns
    -------
    grads : dict
        New arrays when clipping, else the input dict itself (its norm is already within max_norm, or
        not finite).
    norm : float
        The global norm before clipping.
    """
    if max_norm is not None and not (is_finite_number(max_norm) and max_norm > 0):
        raise InputError(f"max_norm must be None or a positive finite number, got {max_norm!r} (a negative one "
                         "would flip the gradients' sign)")
    norm = global_norm(grads)
    if max_norm is None or not math.isfinite(norm) or norm <= max_norm:  # eq:clip
        return grads, norm
    scale = max_norm / (norm + 1e-6)  # eq:clip
    return {k: g * scale for k, g in grads.items()}, norm
