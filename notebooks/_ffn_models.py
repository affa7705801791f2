"""The models of the why_ffn experiment: attention pooling followed by any subset of a LayerNorm, a ReLU
feed-forward network and a residual connection, chained from the reference's own forward and backward functions.

A model is named by its `Parts` (which of the three it has). The block it adds after the attention output a is

    z = [a +] FFN(LN(a))      with LN and FFN each present or left out (then the identity), "a +" the residual,

so the model with no part is the attention-only model A, and the one with all three is model B. With a residual
but neither LN nor FFN, the branch is the identity and z = a + a. The logits are a linear read-out of z at the
last position (which attends over the whole sequence). Training is full-batch gradient descent on the mean
cross-entropy, optionally with the gradients clipped to a global norm (transformer.optim.clip_grads).
"""

import itertools
from typing import NamedTuple

import numpy as np

from transformer.activations import relu_backward, relu_forward
from transformer.attention import attention_backward, attention_forward
from transformer.embedding import embedding_backward, embedding_forward
from transformer.errors import MaskedRowError
from transformer.gradcheck import check_passes, numerical_grad, relative_gap
from transformer.layernorm import layer_norm_backward, layer_norm_forward
from transformer.linear import linear_backward, linear_forward
from transformer.optim import clip_grads
from transformer.softmax import cross_entropy_backward, cross_entropy_forward

TOKENS, LENGTH = 3, 4  # sequences of LENGTH tokens drawn from range(TOKENS)
D, F, HEADS = 8, 32, 1  # model width, FFN hidden width, attention heads
LN_EPS = 1e-5


class Parts(NamedTuple):
    ln: bool
    ffn: bool
    res: bool

    @property
    def name(self):
        on = " + ".join(n for n, flag in (("LN", self.ln), ("FFN", self.ffn), ("residual", self.res)) if flag)
        return {"": "A (none)", "LN + FFN + residual": "B (LN + FFN + residual)"}.get(on, on)


ALL_PARTS = [Parts(*flags) for flags in itertools.product((False, True), repeat=3)]  # none first, all three last
A, B = Parts(False, False, False), Parts(True, True, True)


def task():
    """Every sequence, and its label: 1 when exactly one of the tokens 1 and 2 appears."""
    sequences = np.array(list(itertools.product(range(TOKENS), repeat=LENGTH)))
    labels = np.array([int((1 in s) != (2 in s)) for s in sequences])
    return sequences, labels


def split(n, n_train, seed):
    """Sorted indices of a random training set of n_train of n sequences, and of the rest."""
    order = np.random.default_rng(seed).permutation(n)
    return np.sort(order[:n_train]), np.sort(order[n_train:])


def init(seed, parts, scale=1.0):
    """Xavier-uniform weights (times scale), zero biases, LayerNorm gain 1."""
    rng = np.random.default_rng(seed)

    def xavier(n_in, n_out):
        a = scale * np.sqrt(6 / (n_in + n_out))
        return rng.uniform(-a, a, (n_in, n_out))

    p = {"tok_emb": xavier(TOKENS, D), "pos_emb": xavier(LENGTH, D), "head_w": xavier(D, 2), "head_b": np.zeros(2)}
    for name in ("wq", "wk", "wv", "wo"):
        p[name] = xavier(D, D)
    for name in ("bq", "bk", "bv", "bo"):
        p[name] = np.zeros(D)
    if parts.ln:
        p.update({"ln_g": np.ones(D), "ln_b": np.zeros(D)})
    if parts.ffn:
        p.update({"ff1_w": xavier(D, F), "ff1_b": np.zeros(F), "ff2_w": xavier(F, D), "ff2_b": np.zeros(D)})
    return p


def block_forward(a, p, parts, c):
    """What the read-out sees: [a +] FFN(LN(a)) of the attention output a, each part present or not (then
    the identity); the caches go into c."""
    u = a
    if parts.ln:
        u, c["ln"] = layer_norm_forward(u, p["ln_g"], p["ln_b"], LN_EPS)
    if parts.ffn:
        c["pre"], c["ff1"] = linear_forward(u, p["ff1_w"], p["ff1_b"])
        u, c["relu"] = relu_forward(c["pre"])
        u, c["ff2"] = linear_forward(u, p["ff2_w"], p["ff2_b"])
    return a + u if parts.res else u


def relu_backward_at_zero_one(dy, pre):
    """The other corner convention, relu'(0) = 1: the gradient passes where the input is >= 0. (The library's
    relu_backward takes relu'(0) = 0.) It needs the pre-activation, which the library's cache does not hold."""
    return dy * (pre >= 0)


def block_backward(dz, p, parts, c, g, corner=0):
    """The gradient with respect to a; the parameters' gradients go into g. corner: relu'(0), 0 or 1."""
    du = dz
    if parts.ffn:
        du, g["ff2_w"], g["ff2_b"] = linear_backward(du, c["ff2"])
        du = relu_backward(du, c["relu"]) if corner == 0 else relu_backward_at_zero_one(du, c["pre"])
        du, g["ff1_w"], g["ff1_b"] = linear_backward(du, c["ff1"])
    if parts.ln:
        du, g["ln_g"], g["ln_b"] = layer_norm_backward(du, c["ln"])
    return dz + du if parts.res else du  # the residual: the gradient reaches a both ways


def forward(p, ids, parts):
    """logits (N, 2) read from the last position, the block's output z (N, T, D), and every cache."""
    x, emb = embedding_forward(ids, p["tok_emb"], p["pos_emb"])
    a, att = attention_forward(x, p, HEADS)
    c = {"emb": emb, "att": att}
    z = block_forward(a, p, parts, c)
    logits, c["head"] = linear_forward(z[:, -1], p["head_w"], p["head_b"])
    return logits, z, c


def loss_and_grads(p, ids, y, parts, corner=0, stats=None):
    """The loss and every gradient; stats, if given, counts in stats["corners"] the pre-activations exactly 0."""
    logits, _, c = forward(p, ids, parts)
    if stats is not None and parts.ffn:
        stats["corners"] += int(np.count_nonzero(c["pre"] == 0))
    loss, xent = cross_entropy_forward(logits, y)
    g = {}
    dlast, g["head_w"], g["head_b"] = linear_backward(cross_entropy_backward(1.0, xent), c["head"])
    dz = np.zeros((len(ids), LENGTH, D))
    dz[:, -1] = dlast
    da = block_backward(dz, p, parts, c, g, corner)
    dx, attention_grads = attention_backward(da, c["att"])
    g.update(attention_grads)
    g["tok_emb"], g["pos_emb"] = embedding_backward(dx, c["emb"])
    return loss, g


def gradient_check(parts, ids, y, seed, move):
    """(every parameter passes, largest relative gap) of the hand-chained backward against central differences,
    at an initialisation whose biases and gains are moved off 0 and 1 (which would hide their gradient terms)."""
    p = init(seed, parts)
    for v in p.values():
        if v.ndim == 1:
            v += move * np.random.default_rng(1).standard_normal(v.shape)
    _, g = loss_and_grads(p, ids, y, parts)

    def loss():
        return cross_entropy_forward(forward(p, ids, parts)[0], y)[0]

    passes, worst = True, 0.0
    for k in p:
        numeric = numerical_grad(loss, p[k])
        rel = relative_gap(g[k], numeric)
        passes &= check_passes(float(np.abs(g[k] - numeric).max()), rel)
        worst = max(worst, rel) if np.abs(numeric).max() > 1e-9 else worst  # the key bias's gradient is 0
    return passes, worst


class Run(NamedTuple):
    params: dict
    losses: np.ndarray  # the training loss before each step (shorter when it stopped being finite)
    norms: np.ndarray  # the gradient's global norm before clipping, each step
    corners: int  # how many pre-activations were exactly 0 over the run (where the corner convention acts)


def fit(seed, lr, parts, ids, y, steps, clip=None, scale=1.0, corner=0):
    p = init(seed, parts, scale)
    losses, norms, stats = [], [], {"corners": 0}
    for _ in range(steps):
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            try:
                loss, g = loss_and_grads(p, ids, y, parts, corner, stats)
            except MaskedRowError:  # scores overflowed to -inf across a whole row: the softmax refuses it
                losses.append(np.nan)
                norms.append(np.nan)
                break
            g, norm = clip_grads(g, clip)
        losses.append(loss)
        norms.append(norm)
        if not np.isfinite(loss) or not np.isfinite(norm):
            break
        for k in p:
            p[k] -= lr * g[k]
    return Run(p, np.array(losses), np.array(norms), stats["corners"])


def predictions(p, ids, parts):
    """Each sequence's predicted label; -1 (wrong whatever the label) for all of them when the model's scores
    overflow to a fully masked row on some sequence, which the softmax refuses."""
    with np.errstate(over="ignore", invalid="ignore"):
        try:
            return np.argmax(forward(p, ids, parts)[0], axis=-1)
        except MaskedRowError:
            return np.full(len(ids), -1)


def flat(p):
    return np.concatenate([p[k].ravel() for k in sorted(p)])


def unflat(vector, like):
    out, at = {}, 0
    for k in sorted(like):
        out[k] = vector[at:at + like[k].size].reshape(like[k].shape)
        at += like[k].size
    return out


def top_hessian_eigenvalue(p, ids, y, parts, iters=30, eps=1e-6, seed=0):
    """The largest-magnitude eigenvalue of the training loss's Hessian at p, by power iteration on
    Hessian-vector products taken as central differences of the hand-written gradient:
    H v ~ (grad(p + eps v) - grad(p - eps v)) / (2 eps), with v of unit norm. The loss is only piecewise
    smooth (ReLU corners), so eps is small: a corner inside the step would read as curvature of order 1/eps."""
    theta = flat(p)
    v = np.random.default_rng(seed).standard_normal(theta.size)
    v /= np.linalg.norm(v)
    value = 0.0
    for _ in range(iters):
        try:
            plus = flat(loss_and_grads(unflat(theta + eps * v, p), ids, y, parts)[1])
            minus = flat(loss_and_grads(unflat(theta - eps * v, p), ids, y, parts)[1])
        except MaskedRowError:  # scores overflowed to -inf across a row: no gradient, so no curvature
            return float("nan")
        hv = (plus - minus) / (2 * eps)
        if not np.isfinite(hv).all():  # the parameters are so large that the gradient overflows: no curvature
            return float("nan")
        value = float(v @ hv)  # the Rayleigh quotient
        if not hv.any():
            return value
        v = hv / np.abs(hv).max()  # scaled first: the norm of a huge hv would overflow
        v /= np.linalg.norm(v)
    return value


# ---------------------------------------------------------------- what a run ended as

DIVERGED, STALLED, FITTED = "diverged", "stalled", "fitted"
DEFINITIONS = {
    DIVERGED: "the training loss or the gradient's norm stopped being a finite number (overflow to inf, or nan) "
              "before the last step, or the last training loss is above the first (training made the fit worse)",
    STALLED: "the run stayed finite to the last step, yet at the end at least one training sequence is still "
             "classified wrongly",
    FITTED: "the run stayed finite and at the end classifies every training sequence rightly",
}


class Outcome(NamedTuple):
    kind: str  # DIVERGED, STALLED or FITTED
    loss: float  # the last training loss (not finite when diverged)
    right: int | None  # sequences right of all; None when diverged
    steps: int  # the step at which the loss stopped being finite; all of them if it never did


def outcome(run, parts, sequences, labels, train_idx, steps):
    if len(run.losses) < steps or not np.isfinite(run.losses[-1]):
        return Outcome(DIVERGED, float(run.losses[-1]), None, len(run.losses) - 1)
    if run.losses[-1] > run.losses[0]:
        return Outcome(DIVERGED, float(run.losses[-1]), None, steps)
    right = predictions(run.params, sequences, parts) == labels
    kind = FITTED if right[train_idx].all() else STALLED
    return Outcome(kind, float(run.losses[-1]), int(right.sum()), steps)


def reliability_text(results, how, seeds, rates):
    """Whether a variant of B is reliable, from its runs results[(rate, seed)]: no run diverges, and at some
    rate every seed fits the training set."""
    runs = {lr: [results[(lr, s)].kind for s in seeds] for lr in rates}
    fits_all = [lr for lr in rates if runs[lr].count(FITTED) == len(seeds)]
    diverged = sum(kinds.count(DIVERGED) for kinds in runs.values())
    per_rate = "; ".join(f"rate {lr:g}: {k.count(FITTED)} fit, {k.count(STALLED)} stall, {k.count(DIVERGED)} diverge"
                         for lr, k in runs.items())
    reliable = diverged == 0 and bool(fits_all)
    why = (f"no run diverges, and every seed fits at rate {', '.join(f'{lr:g}' for lr in fits_all)}" if reliable
           else f"{diverged} run(s) diverge" if diverged else "at no rate does every seed fit")
    return (f"**B {how}**, seed by seed ({len(seeds)} per rate): {per_rate}. "
            + (f"**Reliable** on this task: {why}." if reliable else f"**Not reliable** on this task: {why}."))


PART_NAMES = ("LN", "FFN", "residual")


def minimal_sets(holds):
    """The smallest subsets of PART_NAMES for which holds(set) is true (none contains another)."""
    found = []
    for size in range(len(PART_NAMES) + 1):
        for subset in map(set, itertools.combinations(PART_NAMES, size)):
            if not any(subset >= s for s in found) and holds(subset):
                found.append(subset)
    return [tuple(n for n in PART_NAMES if n in s) for s in found]


def necessary_and_sufficient(learns):
    """From {Parts: bool}, the minimal sets S of parts that are
    necessary: every model that learns has at least one part of S (S of one part: that part is necessary);
    sufficient: every model that has all the parts of S learns."""
    has = {m: {n for n, flag in zip(PART_NAMES, m) if flag} for m in learns}
    learning = [m for m in learns if learns[m]]
    necessary = minimal_sets(lambda s: bool(s) and all(has[m] & s for m in learning)) if learning else []
    sufficient = minimal_sets(lambda s: all(learns[m] for m in learns if has[m] >= s))
    return necessary, sufficient


# ---------------------------------------------------------------- linear read-outs of fixed vectors

def least_squares_readout(h, labels):
    """Predictions of the least-squares fit of +-1 targets on [h, 1]."""
    x = np.hstack([h, np.ones((len(h), 1))])
    w = np.linalg.lstsq(x, 2.0 * labels - 1, rcond=None)[0]
    return (x @ w > 0).astype(int)


def logistic_readout(h, labels, steps=20000, lr=1.0):
    """Predictions and final mean log-loss of a logistic regression on standardised [h, 1], by gradient descent
    on the mean log-loss (no penalty, so on separable vectors it keeps going towards a separating hyperplane)."""
    x = (h - h.mean(0)) / (h.std(0) + 1e-12)
    x = np.hstack([x, np.ones((len(h), 1))])
    w = np.zeros(x.shape[1])
    for _ in range(steps):
        prob = 0.5 * (1 + np.tanh(0.5 * (x @ w)))  # the logistic function, without overflow
        w -= lr * x.T @ (prob - labels) / len(h)
    margin = (2 * labels - 1) * (x @ w)
    return (x @ w > 0).astype(int), float(np.mean(np.logaddexp(0, -margin)))  # predictions, mean log-loss


# ---------------------------------------------------------------- curvature along a run

def sharpness_along(seed, lr, parts, ids, y, at_steps, iters=20):
    """(step, training loss, top Hessian eigenvalue) at each of at_steps of plain gradient descent, until the
    loss stops being finite."""
    p, rows, at_steps = init(seed, parts), [], set(at_steps)
    for step in range(max(at_steps) + 1):
        with np.errstate(over="ignore", invalid="ignore"):
            try:
                loss, g = loss_and_grads(p, ids, y, parts)
            except MaskedRowError:  # diverged so far that a row of scores is all -inf
                break
        if not np.isfinite(loss):
            break
        if step in at_steps:
            rows.append((step, float(loss), top_hessian_eigenvalue(p, ids, y, parts, iters)))
        for k in p:
            p[k] -= lr * g[k]
    return rows
