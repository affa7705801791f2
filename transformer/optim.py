"""AdamW with decoupled weight decay, the learning-rate schedule, and
global-norm gradient clipping.
"""

import math
from dataclasses import dataclass

import numpy as np

# Weight decay pulls matrices (weights and embedding tables) towards zero.
# Biases and LayerNorm gains/shifts are not decayed: shrinking a gain towards
# zero would fight the normalisation rather than regularise the model.
DECAYED_SUFFIXES = ("tok_emb", "pos_emb", "wq", "wk", "wv", "wo", "ff1_w", "ff2_w", "head_w")


def is_decayed(name: str) -> bool:
    """True for the parameters weight decay applies to (see DECAYED_SUFFIXES)."""
    return name.rsplit(".", 1)[-1] in DECAYED_SUFFIXES


@dataclass(frozen=True)
class AdamWConfig:
    lr: float = 3e-3  # peak learning rate, reached at the end of warm-up
    beta1: float = 0.9  # decay of the running mean of gradients
    beta2: float = 0.99  # decay of the running mean of squared gradients
    eps: float = 1e-8  # keeps the update finite where v is ~0
    weight_decay: float = 0.1  # decoupled: p -= lr * wd * p, decayed keys only


def adamw_init(params):
    """Optimizer state: first and second moments (zeros) and the step count."""
    return {"m": {k: np.zeros_like(v) for k, v in params.items()},
            "v": {k: np.zeros_like(v) for k, v in params.items()},
            "step": 0}


def adamw_update(params, grads, state, lr, cfg: AdamWConfig):
    """One AdamW step, updating params and state in place.

    In the order torch.optim.AdamW uses, for each parameter p with gradient g:
        p <- p * (1 - lr * wd)                       (decayed keys only)
        m <- b1 m + (1 - b1) g;   v <- b2 v + (1 - b2) g^2
        p <- p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
    """
    state["step"] += 1
    t = state["step"]
    bias1 = 1.0 - cfg.beta1 ** t  # eq:adam-bias-correction
    bias2_sqrt = math.sqrt(1.0 - cfg.beta2 ** t)  # eq:adam-bias-correction
    step_size = lr / bias1
    for name, p in params.items():
        g, m, v = grads[name], state["m"][name], state["v"][name]
        if cfg.weight_decay and is_decayed(name):
            p *= 1.0 - lr * cfg.weight_decay  # eq:adamw-decay
        m *= cfg.beta1  # eq:adam-moments
        m += (1.0 - cfg.beta1) * g  # eq:adam-moments
        v *= cfg.beta2  # eq:adam-moments
        v += (1.0 - cfg.beta2) * (g * g)  # eq:adam-moments
        denom = np.sqrt(v) / bias2_sqrt + cfg.eps
        p -= step_size * (m / denom)  # eq:adam-update


def lr_at(step, peak_lr, warmup_steps, total_steps, min_lr=0.0):
    """Learning rate for 0-based `step`: linear warm-up to peak_lr over
    warmup_steps, then cosine decay to min_lr at total_steps.
    """
    if step < warmup_steps:
        return peak_lr * (step + 1) / warmup_steps  # eq:lr-warmup
    if step >= total_steps:
        return min_lr
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return min_lr + 0.5 * (peak_lr - min_lr) * (1.0 + math.cos(math.pi * progress))  # eq:lr-cosine


def global_norm(grads) -> float:
    """sqrt of the sum of squares of every gradient entry."""
    return math.sqrt(sum(float(np.vdot(g, g)) for g in grads.values()))


def clip_grads(grads, max_norm):
    """Scale all gradients by one factor so their global norm is at most max_norm.

    Returns (grads, the norm before clipping): new arrays when clipping, the
    input dict itself when the norm is already within max_norm. The input
    arrays are never modified.
    """
    norm = global_norm(grads)
    if max_norm is None or norm <= max_norm:
        return grads, norm
    scale = max_norm / (norm + 1e-6)  # eq:clip
    return {k: g * scale for k, g in grads.items()}, norm
