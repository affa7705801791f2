"""The engine's functions beyond arithmetic: exp, log, tanh, ReLU, erf and the two GELUs, the embedding gather,
softmax.

Each is a primitive with its own rule (the derivative of one function of one input), or a composition
of primitives whose gradient the tape finds by itself (softmax, both GELUs). They build on `autograd.Tensor`
exactly as the arithmetic of transformer/autograd.py does; the composed model (autograd_model) uses both.

NaN semantics, the same as transformer/activations.py's: a NaN input gives a NaN output, and a NaN input
gives a NaN gradient wherever the derivative reads it (all of these do, but the embedding's scatter-add,
which reads no value). A softmax row that is -inf everywhere is refused with the `MaskedRowError` that
`softmax_forward` raises, instead of turning into NaN.
"""

import math

import numpy as np

from .activations import _erf as erf_values  # scipy's erf where installed, else math.erf entry by entry
from .autograd import Tensor
from .softmax import check_not_fully_masked

# ---- elementwise functions ---------------------------------------------------------------------


def exp(a):
    """e^a; its derivative is itself."""
    out = np.exp(a.data)
    return Tensor(out, parents=(a,), op="exp", rule=lambda g: (g * out,))


def log(a):
    """Natural log; d/da = 1/a."""
    return Tensor(np.log(a.data), parents=(a,), op="log", rule=lambda g: (g / a.data,))


def tanh(a):
    """tanh(a); d/da = 1 - tanh(a)^2."""
    out = np.tanh(a.data)
    return Tensor(out, parents=(a,), op="tanh", rule=lambda g: (g * (1.0 - out * out),))


def relu(a):
    """max(0, a). Its slope is sign(max(0, a)): 1 where a > 0, 0 where a <= 0 (at exactly 0 a convention),
    NaN where a is NaN, so a NaN stays NaN forward and backward, as in transformer/activations.py."""
    out = np.maximum(a.data, 0)  # np.maximum keeps NaN; np.where(a > 0, a, 0) would turn it into 0
    return Tensor(out, parents=(a,), op="relu", rule=lambda g: (g * np.sign(out),))


def erf(a):
    """The error function (scipy's, else math.erf entry by entry); d/da = 2/sqrt(pi) exp(-a^2)."""
    x = a.data
    out = erf_values(x).astype(x.dtype, copy=False)
    return Tensor(out, parents=(a,), op="erf",
                  rule=lambda g: (g * (2.0 / math.sqrt(math.pi)) * np.exp(-x * x),))


def detach(a):
    """The same value, cut from the graph: a constant that no gradient flows into."""
    return Tensor(a.data)



def embedding(table, ids):
    """Gather rows: `table[ids]`; the backward scatter-adds each row's gradient back into the table.

    A row read k times receives k contributions. `np.add.at` adds them all; the plain fancy-index
    update `grad[ids] += g` would keep only the last one for a repeated id.

    Parameters
    ----------
    table : Tensor of shape (n, d)
    ids : ndarray of int, any shape S

    Returns
    -------
    Tensor of shape S + (d,)
    """
    ids = np.asarray(ids)

    def rule(g):
        grad = np.zeros(table.shape, dtype=g.dtype)
        np.add.at(grad, ids.reshape(-1), g.reshape(-1, table.shape[-1]))
        return (grad,)

    return Tensor(table.data[ids], parents=(table,), op="embedding", rule=rule)


# ---- compositions ------------------------------------------------------------------------------


def softmax(x, axis=-1):
    """Softmax over axis, as a composition of exp, sum and div, shifted by the row maximum.

    The shift changes nothing mathematically (softmax(x - c) = softmax(x)), so its gradient through the
    maximum is exactly zero and the maximum is taken as a constant (`detach_max`). It keeps exp from
    overflowing, and it makes a -inf entry (a masked score) exp(-inf) = 0 with no special case.

    Raises
    ------
    MaskedRowError
        If a row is -inf everywhere: no probability can be given (its shifted scores would be NaN).
    """
    shifted = x - detach_max(x, axis)
    e = exp(shifted)
    return e / e.sum(axis=axis, keepdims=True)


def detach_max(x, axis=-1, what="softmax"):
    """The maximum over axis, kept as size 1, as a constant; a row that is -inf everywhere is refused,
    naming `what` the rows are."""
    row_max = x.data.max(axis=axis, keepdims=True)
    check_not_fully_masked(row_max, what)
    return Tensor(row_max)


def gelu(x):
    """Exact GELU, x Phi(x) with Phi(x) = (1 + erf(x / sqrt 2)) / 2, composed from erf, mul and add.

    Composed, it keeps floating point's arithmetic at the infinities: at x = -inf it is -inf * 0 = NaN, where the
    hand-written `gelu_forward` gives the limit 0 (a case the tape's comparisons with it never feed)."""
    return x * ((erf(x * (1.0 / math.sqrt(2.0))) + 1.0) * 0.5)


def gelu_tanh(x):
    """GELU's tanh approximation (GPT-2's), x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) / 2, composed from tanh,
    power, mul and add: the tape finds its derivative, which transformer/activations.py writes by hand."""
    return x * ((tanh((x + (x ** 3) * 0.044715) * math.sqrt(2.0 / math.pi)) + 1.0) * 0.5)
