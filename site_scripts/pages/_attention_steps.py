"""The Attention page's tiny example, step by step: block 0 of the tiny model recomputed from the page's equations,
forward and backward, one window at a time, with arrays of 2 axes (a head's arrays have 3: head, row, column).

site_scripts/pages/attention.py shows these steps and compares them with the code (`attention_forward`, the
replayed `attention_backward`) and with central differences."""

import math
from dataclasses import dataclass

import numpy as np

from transformer.block import block_params

from ..examples import tiny
from ..tiny_backward import tiny_backward

def heads(a, num_heads):
    """(T, d) to (H, T, d_h): `split_heads` for one window."""
    T, d = a.shape
    return a.reshape(T, num_heads, d // num_heads).transpose(1, 0, 2)


def merged(a):
    """(H, T, d_h) to (T, d): `merge_heads` for one window."""
    H, T, dh = a.shape
    return a.transpose(1, 0, 2).reshape(T, H * dh)


def row_softmax(s):
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def masked(scores):
    return scores + np.triu(np.full(scores.shape[-2:], -np.inf), 1)


def from_weights(alpha, v, p):
    """Attn(U_1) from the weights on: O^(h) = α^(h) V^(h), joined, times W_o, plus b_o."""
    return merged(alpha @ heads(v, len(alpha))) @ p["wo"] + p["bo"]


def from_scores(scores, v, p):
    return from_weights(row_softmax(masked(scores)), v, p)


def from_qkv(q, k, v, p, num_heads):
    dh = q.shape[1] // num_heads
    return from_scores(heads(q, num_heads) / math.sqrt(dh) @ heads(k, num_heads).transpose(0, 2, 1), v, p)


@dataclass(frozen=True)
class Forward:
    """Block 0's attention on the tiny example, one array per equation of the page (one window)."""
    p: dict
    u1: np.ndarray  # U_1, (T, d)
    q: np.ndarray  # Q, (T, d); head h is columns h d_h to (h+1) d_h - 1
    k: np.ndarray
    v: np.ndarray
    scores: np.ndarray  # S^(h) before the mask, (H, T, T)
    alpha: np.ndarray  # α^(h), (H, T, T)
    oh: np.ndarray  # O^(h), (H, T, d_h)
    o: np.ndarray  # O, (T, d)
    y: np.ndarray  # Attn(U_1), (T, d)

    @property
    def num_heads(self):
        return len(self.alpha)

    def head(self, a, h):
        return heads(a, self.num_heads)[h]


def forward_steps():
    ex = tiny()
    p, u1, H = block_params(ex.params, 0), ex.trace["b0.ln1"][0], ex.cfg.num_heads
    q, k, v = (u1 @ p[f"w{n}"] + p[f"b{n}"] for n in "qkv")
    scores = heads(q, H) / math.sqrt(ex.cfg.head_dim) @ heads(k, H).transpose(0, 2, 1)
    alpha = row_softmax(masked(scores))
    oh = alpha @ heads(v, H)
    o = merged(oh)
    return Forward(p, u1, q, k, v, scores, alpha, oh, o, o @ p["wo"] + p["bo"])


@dataclass(frozen=True)
class Backward:
    """The derivation's steps, in the order `attention_backward` computes them (one window)."""
    dy: np.ndarray  # ∂ℓ/∂Attn(U_1), (T, d)
    do: np.ndarray  # ∂ℓ/∂O, (T, d)
    doh: np.ndarray  # ∂ℓ/∂O^(h), (H, T, d_h)
    dalpha: np.ndarray  # ∂ℓ/∂α^(h), (H, T, T)
    dvh: np.ndarray  # ∂ℓ/∂V^(h), (H, T, d_h)
    dscores: np.ndarray  # ∂ℓ/∂S^(h), (H, T, T)
    dqh: np.ndarray  # ∂ℓ/∂Q^(h)
    dkh: np.ndarray  # ∂ℓ/∂K^(h)
    dq: np.ndarray  # ∂ℓ/∂Q, (T, d)
    dk: np.ndarray
    dv: np.ndarray
    terms: dict  # q, k, v: that projection's term of ∂ℓ/∂U_1
    du1: np.ndarray  # ∂ℓ/∂U_1, (T, d)
    grads: dict  # the parameters' gradients, by the keys of p


def backward_steps(fw, dy):
    p, H = fw.p, fw.num_heads
    scale = 1 / math.sqrt(fw.q.shape[1] // H)
    do = dy @ p["wo"].T  # eq-attn-grad-out
    doh = heads(do, H)  # eq-attn-grad-merge
    dalpha = doh @ heads(fw.v, H).transpose(0, 2, 1)  # eq-attn-grad-mix
    dvh = fw.alpha.transpose(0, 2, 1) @ doh
    dscores = fw.alpha * (dalpha - (fw.alpha * dalpha).sum(-1, keepdims=True))  # eq-attn-grad-softmax
    dqh = dscores @ heads(fw.k, H) * scale  # eq-attn-grad-qk
    dkh = dscores.transpose(0, 2, 1) @ heads(fw.q, H) * scale
    dq, dk, dv = merged(dqh), merged(dkh), merged(dvh)  # eq-attn-grad-split
    terms = {n: g @ p[f"w{n}"].T for n, g in zip("qkv", (dq, dk, dv))}  # eq-attn-grad-input
    grads = {"wo": fw.o.T @ dy, "bo": dy.sum(0)}
    for n, g in zip("qkv", (dq, dk, dv)):  # eq-attn-grad-params
        grads[f"w{n}"], grads[f"b{n}"] = fw.u1.T @ g, g.sum(0)
    return Backward(dy, do, doh, dalpha, dvh, dscores, dqh, dkh, dq, dk, dv, terms, sum(terms.values()), grads)


def tiny_steps():
    fw = forward_steps()
    return fw, backward_steps(fw, tiny_backward().steps["b0.dmid"][0])
