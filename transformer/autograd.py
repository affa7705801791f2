"""A tape-based reverse-mode engine: a `Tensor`, its primitive operations, and `backward`.

Every operation returns a new Tensor that records its parents and a gradient rule: a function that
takes the gradient of the output and returns one gradient per parent (the vector-Jacobian product).
`backward` walks the recorded graph from the output back to the leaves in reverse topological order,
calls each rule once and adds what it returns into the parents' `grad`.

A rule is given the output's gradient as an argument, so it never has to reach for its own output
node: no node holds a reference to itself, and the graph is freed by reference counting as soon as the
last Tensor of it is dropped. `backward` also cuts the graph after use (each node forgets its parents
and its rule), so a loss kept after the step, in a list of losses say, holds one number and not the
whole step's intermediates.

Shapes follow numpy: add, sub, mul and div broadcast, and their rules sum the gradient back down to
each operand's own shape (`unbroadcast`), because an entry that was used n times gets n contributions.

Beside it: `custom_gradient` (the seam for a fused operation with its own backward), `autograd_model` (the
transformer composed from these operations) and `autograd_memory` (what a graph holds, and whether it is
freed).
"""

import math
import weakref

import numpy as np

_LIVE = weakref.WeakSet()  # every Tensor not yet garbage: `live_tensors` counts them


def live_tensors() -> int:
    """How many Tensors exist right now (leaves, constants and graph nodes).

    Returns
    -------
    int
        The count; the memory tool and tests use it to see whether graphs are freed.
    """
    return len(_LIVE)


class Tensor:
    """An array, its gradient, and how it was made.

    Parameters
    ----------
    data : array_like
        The value. Python numbers become 0-d arrays.
    requires_grad : bool
        True for a leaf whose gradient is wanted (a parameter). A node made from such a Tensor requires
        a gradient too; one made only from constants does not, and records nothing.
    parents : tuple of Tensor
        The inputs of the operation that made this Tensor (empty for a leaf).
    rule : callable, optional
        `rule(grad_out) -> tuple of arrays`, one gradient per parent, each shaped like that parent.
    op : str
        The operation's name, for drawing the graph and for error messages.

    Attributes
    ----------
    grad : ndarray or None
        d(output of backward) / d(this Tensor), shaped like data; None until backward reaches it.
    """

    __array_ufunc__ = None  # ndarray + Tensor calls Tensor.__radd__ instead of numpy's elementwise loop
    __slots__ = ("__weakref__", "data", "grad", "op", "parents", "requires_grad", "rule")

    def __init__(self, data, requires_grad=False, parents=(), rule=None, op="leaf"):
        self.data = np.asarray(data)
        self.grad = None
        self.requires_grad = requires_grad or any(p.requires_grad for p in parents)
        # A node nobody differentiates through needs no history.
        self.parents = parents if self.requires_grad else ()
        self.rule = rule if self.requires_grad else None
        self.op = op
        _LIVE.add(self)

    @property
    def shape(self):
        return self.data.shape

    @property
    def ndim(self):
        return self.data.ndim

    def __repr__(self):
        return f"Tensor(op={self.op!r}, shape={self.shape}, dtype={self.data.dtype})"

    # Arithmetic, so that models read like maths: (x - mu) * rstd * g + b.
    def __add__(self, other):
        return add(self, other)

    def __radd__(self, other):
        return add(other, self)

    def __sub__(self, other):
        return sub(self, other)

    def __rsub__(self, other):
        return sub(other, self)

    def __mul__(self, other):
        return mul(self, other)

    def __rmul__(self, other):
        return mul(other, self)

    def __truediv__(self, other):
        return div(self, other)

    def __rtruediv__(self, other):
        return div(other, self)

    def __neg__(self):
        return neg(self)

    def __pow__(self, exponent):
        return power(self, exponent)

    def __matmul__(self, other):
        return matmul(self, other)

    def sum(self, axis=None, keepdims=False):
        return tensor_sum(self, axis, keepdims)

    def mean(self, axis=None, keepdims=False):
        return mean(self, axis, keepdims)

    def reshape(self, *shape):
        return reshape(self, shape[0] if len(shape) == 1 and isinstance(shape[0], tuple) else shape)

    def swapaxes(self, axis1, axis2):
        return swapaxes(self, axis1, axis2)

    def backward(self, grad=None, free_graph=True):
        """Backpropagate from this Tensor; see the module function `backward`."""
        backward(self, grad, free_graph)


def as_tensor(value, dtype=None):
    """A Tensor as it is, anything else (a number, an ndarray) as a constant Tensor.

    A Python number takes the dtype of the Tensor it meets (`dtype`), so `x * 0.5` stays float32 for a
    float32 x.
    """
    if isinstance(value, Tensor):
        return value
    return Tensor(np.asarray(value, dtype=dtype if np.ndim(value) == 0 else None))


def _pair(a, b):
    """Both operands of a binary operation as Tensors, a bare number taking the other's dtype."""
    if isinstance(a, Tensor):
        return a, as_tensor(b, a.data.dtype)
    return as_tensor(a, b.data.dtype), b


def unbroadcast(grad, shape):
    """Sum a gradient down to the shape of the operand it belongs to, undoing numpy broadcasting.

    Broadcasting (3,) against (2, 3) uses each of the three entries twice, so each receives the sum of
    its two gradients: sum over the leading axes numpy added, and over every axis where the operand had
    size 1.

    Parameters
    ----------
    grad : ndarray
        The gradient of the broadcast result.
    shape : tuple of int
        The operand's shape.

    Returns
    -------
    ndarray of the given shape
    """
    extra = grad.ndim - len(shape)
    if extra:
        grad = grad.sum(axis=tuple(range(extra)))  # the axes numpy added in front
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
    if stretched:
        grad = grad.sum(axis=stretched, keepdims=True)  # the axes of size 1 it stretched
    return grad


# ---- elementwise arithmetic, broadcasting ------------------------------------------------------


def add(a, b):
    """a + b; each operand receives the output gradient, summed down to its shape."""
    a, b = _pair(a, b)
    return Tensor(a.data + b.data, parents=(a, b), op="add",
                  rule=lambda g: (unbroadcast(g, a.shape), unbroadcast(g, b.shape)))


def sub(a, b):
    """a - b; a receives the output gradient, b its negative."""
    a, b = _pair(a, b)
    return Tensor(a.data - b.data, parents=(a, b), op="sub",
                  rule=lambda g: (unbroadcast(g, a.shape), unbroadcast(-g, b.shape)))


def neg(a):
    """-a."""
    return Tensor(-a.data, parents=(a,), op="neg", rule=lambda g: (-g,))


def mul(a, b):
    """a * b; d(ab)/da = b and d(ab)/db = a, each summed down to its operand's shape."""
    a, b = _pair(a, b)
    return Tensor(a.data * b.data, parents=(a, b), op="mul",
                  rule=lambda g: (unbroadcast(g * b.data, a.shape), unbroadcast(g * a.data, b.shape)))


def div(a, b):
    """a / b; d/da = 1/b and d/db = -a/b^2."""
    a, b = _pair(a, b)
    return Tensor(a.data / b.data, parents=(a, b), op="div",
                  rule=lambda g: (unbroadcast(g / b.data, a.shape),
                                  unbroadcast(-g * a.data / (b.data * b.data), b.shape)))


def power(a, exponent):
    """a ** exponent for a constant number exponent; d/da = exponent * a^(exponent - 1)."""
    if isinstance(exponent, Tensor):
        raise TypeError("power: the exponent must be a number, not a Tensor")
    return Tensor(a.data ** exponent, parents=(a,), op=f"pow {exponent:g}",
                  rule=lambda g: (g * exponent * a.data ** (exponent - 1),))


# ---- elementwise functions ---------------------------------------------------------------------


def exp(a):
    """e^a; its derivative is itself."""
    out = np.exp(a.data)
    return Tensor(out, parents=(a,), op="exp", rule=lambda g: (g * out,))


def log(a):
    """Natural log; d/da = 1/a."""
    return Tensor(np.log(a.data), parents=(a,), op="log", rule=lambda g: (g / a.data,))


def relu(a):
    """max(0, a); the gradient passes where a > 0 (at exactly 0 it is stopped, a convention)."""
    passes = a.data > 0
    return Tensor(np.where(passes, a.data, 0).astype(a.data.dtype), parents=(a,), op="relu",
                  rule=lambda g: (g * passes,))


_erf_array = np.vectorize(math.erf, otypes=[float])


def erf(a):
    """The error function, from math.erf element by element; d/da = 2/sqrt(pi) exp(-a^2)."""
    x = a.data
    out = _erf_array(x).astype(x.dtype, copy=False)
    return Tensor(out, parents=(a,), op="erf",
                  rule=lambda g: (g * (2.0 / math.sqrt(math.pi)) * np.exp(-x * x),))


def detach(a):
    """The same value, cut from the graph: a constant that no gradient flows into."""
    return Tensor(a.data)


# ---- reductions and shapes ---------------------------------------------------------------------


def tensor_sum(a, axis=None, keepdims=False):
    """Sum over axis (all axes when None); every summed entry receives the output's gradient."""
    out = a.data.sum(axis=axis, keepdims=keepdims)

    def rule(g):
        if not keepdims and axis is not None:
            g = np.expand_dims(g, axis)  # put the summed axes back as size 1 ...
        return (np.zeros(a.shape, dtype=g.dtype) + g,)  # ... and spread the gradient along them

    return Tensor(out, parents=(a,), op="sum", rule=rule)


def mean(a, axis=None, keepdims=False):
    """Mean over axis: a sum, divided by how many entries each output averages (a composition)."""
    axes = range(a.ndim) if axis is None else np.atleast_1d(axis)
    count = math.prod(a.shape[ax] for ax in axes)
    return tensor_sum(a, axis, keepdims) * (1.0 / count)


def reshape(a, shape):
    """The same entries in a new shape; the gradient is reshaped back."""
    return Tensor(a.data.reshape(shape), parents=(a,), op="reshape", rule=lambda g: (g.reshape(a.shape),))


def swapaxes(a, axis1, axis2):
    """Exchange two axes; swapping them again is the inverse, so that is the rule."""
    return Tensor(np.swapaxes(a.data, axis1, axis2), parents=(a,), op="swapaxes",
                  rule=lambda g: (np.swapaxes(g, axis1, axis2),))


def matmul(a, b):
    """a @ b, batched over leading axes like numpy; both operands have at least two axes.

    For C = A B: dA = dC B^T and dB = A^T dC, with the transposes on the last two axes; a matrix shared
    by every batch entry gets the sum over the batch (`unbroadcast`).
    """
    a, b = _pair(a, b)
    if a.ndim < 2 or b.ndim < 2:
        raise ValueError(f"matmul: operands need at least two axes, got shapes {a.shape} and {b.shape}")
    if b.ndim == 2:
        return _matmul_weight(a, b)
    return Tensor(a.data @ b.data, parents=(a, b), op="matmul",
                  rule=lambda g: (unbroadcast(g @ np.swapaxes(b.data, -1, -2), a.shape),
                                  unbroadcast(np.swapaxes(a.data, -1, -2) @ g, b.shape)))


def _matmul_weight(x, w):
    """x (..., in) @ w (in, out): the same product with every row of x stacked into one 2-D matmul.

    Mathematically this is `matmul`; in numpy one (rows, in) @ (in, out) product is several times
    faster than a batch of small ones, and dW = x^T dy sums over all rows inside the matmul itself
    instead of forming one (in, out) matrix per batch entry and adding them up.
    """
    rows = x.data.reshape(-1, x.shape[-1])  # (N, in)
    out = (rows @ w.data).reshape(*x.shape[:-1], w.shape[1])

    def rule(g):
        g2 = g.reshape(-1, w.shape[1])  # (N, out)
        return (g2 @ w.data.T).reshape(x.shape), rows.T @ g2

    return Tensor(out, parents=(x, w), op="matmul", rule=rule)


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
    maximum is exactly zero and the maximum is taken as a constant (`detach`). It keeps exp from
    overflowing, and it makes a -inf entry (a masked score) exp(-inf) = 0 with no special case.
    """
    shifted = x - detach_max(x, axis)
    e = exp(shifted)
    return e / e.sum(axis=axis, keepdims=True)


def detach_max(x, axis=-1):
    """The maximum over axis, kept as size 1, as a constant."""
    return Tensor(x.data.max(axis=axis, keepdims=True))


def gelu(x):
    """Exact GELU, x Phi(x) with Phi(x) = (1 + erf(x / sqrt 2)) / 2, composed from erf, mul and add."""
    return x * ((erf(x * (1.0 / math.sqrt(2.0))) + 1.0) * 0.5)


# ---- the backward pass -------------------------------------------------------------------------


def topological_order(root):
    """Every node the root depends on, each after all of its parents (a depth-first post-order).

    Written with an explicit stack instead of recursion, so a deep graph cannot exceed Python's
    recursion limit.
    """
    order, seen, stack = [], {id(root)}, [(root, iter(root.parents))]
    while stack:
        node, parents = stack[-1]
        for parent in parents:
            if id(parent) not in seen and parent.requires_grad:
                seen.add(id(parent))
                stack.append((parent, iter(parent.parents)))
                break
        else:  # every parent is placed: the node can follow them
            order.append(node)
            stack.pop()
    return order


def backward(root, grad=None, free_graph=True):
    """Backpropagate from root: accumulate d root / d leaf into the `grad` of every Tensor it depends on.

    Parameters
    ----------
    root : Tensor
        The output; a scalar unless grad is given.
    grad : ndarray, optional
        The gradient of the root (seed); 1 for a scalar root.
    free_graph : bool
        After the pass, make every node forget its parents and its rule, so nothing the graph held
        (the intermediates each rule reads) outlives the step, even if the root itself is kept.
        False keeps the graph (to draw it, or to see what holding it costs).

    Raises
    ------
    ValueError
        If the root needs a seed gradient and none is given, or the seed's shape is wrong.
    """
    if grad is None:
        if root.data.size != 1:
            raise ValueError(f"backward: the root has shape {root.shape}; give its gradient")
        grad = np.ones_like(root.data)
    if np.shape(grad) != root.shape:
        raise ValueError(f"backward: seed gradient of shape {np.shape(grad)} for a root of shape {root.shape}")
    order = topological_order(root)
    root.grad = np.asarray(grad, dtype=root.data.dtype)
    for node in reversed(order):  # the root first, every node before its parents
        if node.rule is None or node.grad is None:
            continue
        for parent, g in zip(node.parents, node.rule(node.grad)):
            if parent.requires_grad:
                # Never in place: a rule may hand the same array to two parents.
                parent.grad = g if parent.grad is None else parent.grad + g
    if free_graph:
        for node in order:
            node.parents, node.rule = (), None
