"""A tape-based reverse-mode engine: a `Tensor`, its arithmetic and shape operations, and `backward`.

Every operation returns a new Tensor that records its parents and a gradient rule: a function that
takes the gradient of the output and returns one gradient per parent (the vector-Jacobian product).
A parent that wants no gradient (a constant: a number, the causal mask, the one-hot targets) gets None,
and nothing is computed for it. `backward` walks the recorded graph from the output back to the leaves
in reverse topological order, calls each rule once and adds what it returns into the parents' `grad`.

A rule is given the output's gradient as an argument, so it never has to reach for its own output
node: no node holds a reference to itself, and the graph is freed by reference counting as soon as the
last Tensor of it is dropped. `backward` also drops each intermediate gradient as soon as its rule has
passed it on, and cuts the graph after use (each node forgets its parents and its rule), so a loss kept
after the step, in a list of losses say, holds one number and not the whole step's intermediates. A
second `backward` through a freed graph is an error, not a silent no-op.

Shapes follow numpy: add, sub, mul and div broadcast, and their rules sum the gradient back down to
each operand's own shape (`unbroadcast`), because an entry that was used n times gets n contributions.

NaN semantics: a NaN reaches every output computed from it, forward; backward, a NaN upstream gradient
reaches every input gradient it flows into, and a NaN value makes NaN every gradient whose local
derivative reads it (a product's other factor, a quotient's divisor). A derivative that reads no value
(a sum's, which is 1) stays a number; the NaN still arrives, through the upstream gradient, since
everything computed from a NaN is NaN.

Beside it: `autograd_functions` (exp, log, ReLU, erf, GELU, softmax, the embedding), `custom_gradient`
(the seam for a fused operation with its own backward), `autograd_model` (the transformer composed from
these operations) and `autograd_memory` (what a graph holds, and whether it is freed).
"""

import math
import weakref

import numpy as np

from .errors import TransformerError

_LIVE = weakref.WeakSet()  # every Tensor not yet garbage: `live_tensors` counts them


class BackwardError(TransformerError):
    """backward cannot run: the root needs no gradient, its seed does not fit, or its graph was freed."""


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
        `rule(grad_out) -> tuple`, one gradient per parent, each shaped like that parent (None for a
        parent that requires no gradient).
    op : str
        The operation's name, for drawing the graph and for error messages.

    Attributes
    ----------
    grad : ndarray or None
        d(root of backward) / d(this Tensor), shaped like data. A leaf's accumulates over backward passes;
        an intermediate node's lives only while its pass needs it (see `backward`).
    is_leaf : bool
        Made by the caller, not by an operation: a parameter or a constant.
    """

    __array_ufunc__ = None  # ndarray + Tensor calls Tensor.__radd__ instead of numpy's elementwise loop
    __slots__ = ("__weakref__", "data", "grad", "is_leaf", "op", "parents", "requires_grad", "rule")

    def __init__(self, data, requires_grad=False, parents=(), rule=None, op="leaf"):
        self.data = np.asarray(data)
        self.grad = None
        self.requires_grad = requires_grad or any(p.requires_grad for p in parents)
        # A node nobody differentiates through needs no history.
        self.parents = parents if self.requires_grad else ()
        self.rule = rule if self.requires_grad else None
        self.is_leaf = not self.parents
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

    def backward(self, grad=None, free_graph=True, keep_grads=False):
        """Backpropagate from this Tensor; see the module function `backward`."""
        backward(self, grad, free_graph, keep_grads)


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
        grad = grad.sum(axis=tuple(range(extra)))  # eq:ag-unbroadcast  the axes numpy added in front
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
    if stretched:
        grad = grad.sum(axis=stretched, keepdims=True)  # eq:ag-unbroadcast  the axes of size 1 it stretched
    return grad




# ---- elementwise arithmetic, broadcasting ------------------------------------------------------
# A binary rule returns None for an operand that requires no gradient: nothing is computed for a constant.


def add(a, b):
    """a + b; each operand receives the output gradient, summed down to its shape."""
    a, b = _pair(a, b)

    def rule(g):
        return (unbroadcast(g, a.shape) if a.requires_grad else None,
                unbroadcast(g, b.shape) if b.requires_grad else None)

    return Tensor(a.data + b.data, parents=(a, b), op="add", rule=rule)


def sub(a, b):
    """a - b; a receives the output gradient, b its negative."""
    a, b = _pair(a, b)

    def rule(g):
        return (unbroadcast(g, a.shape) if a.requires_grad else None,
                unbroadcast(-g, b.shape) if b.requires_grad else None)

    return Tensor(a.data - b.data, parents=(a, b), op="sub", rule=rule)


def neg(a):
    """-a."""
    return Tensor(-a.data, parents=(a,), op="neg", rule=lambda g: (-g,))


def mul(a, b):
    """a * b; d(ab)/da = b and d(ab)/db = a, each summed down to its operand's shape."""
    a, b = _pair(a, b)

    def rule(g):
        return (unbroadcast(g * b.data, a.shape) if a.requires_grad else None,
                unbroadcast(g * a.data, b.shape) if b.requires_grad else None)

    return Tensor(a.data * b.data, parents=(a, b), op="mul", rule=rule)


def div(a, b):
    """a / b; d/da = 1/b and d/db = -a/b^2."""
    a, b = _pair(a, b)

    def rule(g):
        return (unbroadcast(g / b.data, a.shape) if a.requires_grad else None,
                unbroadcast(-g * a.data / (b.data * b.data), b.shape) if b.requires_grad else None)

    return Tensor(a.data / b.data, parents=(a, b), op="div", rule=rule)


def power(a, exponent):
    """a ** exponent for a constant number exponent; d/da = exponent * a^(exponent - 1)."""
    if isinstance(exponent, Tensor):
        raise TypeError("power: the exponent must be a number, not a Tensor")
    return Tensor(a.data ** exponent, parents=(a,), op=f"pow {exponent:g}",
                  rule=lambda g: (g * exponent * a.data ** (exponent - 1),))


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

    def rule(g):
        return (unbroadcast(g @ np.swapaxes(b.data, -1, -2), a.shape) if a.requires_grad else None,
                unbroadcast(np.swapaxes(a.data, -1, -2) @ g, b.shape) if b.requires_grad else None)

    return Tensor(a.data @ b.data, parents=(a, b), op="matmul", rule=rule)


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
        return ((g2 @ w.data.T).reshape(x.shape) if x.requires_grad else None,
                rows.T @ g2 if w.requires_grad else None)

    return Tensor(out, parents=(x, w), op="matmul", rule=rule)


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
            order.append(node)  # eq:ag-order
            stack.pop()
    return order


def accumulate(node, g):
    """Add one contribution g into node.grad. Never in place: a rule may hand one array to two parents."""
    node.grad = g if node.grad is None else node.grad + g  # eq:ag-chain


def seed_gradient(root, grad):
    """The gradient backward starts from: grad, checked against the root, or 1 for a scalar root."""
    if not root.requires_grad:
        raise BackwardError(f"backward: this {root.op} Tensor requires no gradient, and nothing it was made "
                            "from does: there is nothing to differentiate")
    if grad is None:
        if root.data.size != 1:
            raise BackwardError(f"backward: the root has shape {root.shape}; give its gradient")
        return np.ones_like(root.data)  # eq:ag-seed  d root / d root
    if np.shape(grad) != root.shape:
        raise BackwardError(f"backward: seed gradient of shape {np.shape(grad)} for a root of shape {root.shape}")
    return np.array(grad, dtype=root.data.dtype)  # eq:ag-seed  a copy: the caller's array stays theirs


def check_not_freed(order):
    """Refuse a graph that an earlier backward freed: its rules are gone, so no gradient could pass."""
    freed = [node for node in order if not node.is_leaf and node.rule is None]
    if freed:
        raise BackwardError(f"backward: {len(freed)} node(s) of this graph, the first a {freed[0].op!r} of shape "
                            f"{freed[0].shape}, were freed by an earlier backward; to backpropagate through "
                            "a graph twice, call the first backward with free_graph=False")


def backward(root, grad=None, free_graph=True, keep_grads=False):
    """Backpropagate from root: add d root / d leaf into the `grad` of every leaf it depends on.

    The seed: the pass starts from `grad` at the root. Every leaf's grad accumulates, over this pass's
    contributions and over passes (as in PyTorch: a parameter used by two losses gets the sum; make new
    leaves, or set grad to None, between training steps); a leaf root adds the seed to its own. Every
    other node's grad belongs to one pass: it starts empty (the root's is the seed) and, unless
    keep_grads, is dropped as soon as its rule has passed it on, so the pass never holds all of them.

    Parameters
    ----------
    root : Tensor
        The output; a scalar unless grad is given.
    grad : ndarray, optional
        The gradient of the root (seed); 1 for a scalar root.
    free_graph : bool
        After the pass, make every node forget its parents and its rule, so nothing the graph held
        (the intermediates each rule reads) outlives the step, even if the root itself is kept.
        False keeps the graph (to draw it, to pass through it again, or to see what holding it costs).
    keep_grads : bool
        Keep every intermediate node's gradient after the pass (to show it; PyTorch's retain_grad).

    Raises
    ------
    BackwardError
        If the root requires no gradient, needs a seed and none is given, the seed's shape is wrong, or
        an earlier backward freed the graph.
    """
    seed = seed_gradient(root, grad)
    order = topological_order(root)
    check_not_freed(order)
    for node in order:
        if not node.is_leaf:
            node.grad = None  # what an earlier pass through a kept graph left is not this pass's
    accumulate(root, seed)  # eq:ag-seed
    for node in reversed(order):  # eq:ag-order  the root first, every node before its parents
        if node.is_leaf:
            continue  # a parameter: no rule, its gradient is complete
        for parent, g in zip(node.parents, node.rule(node.grad)):  # eq:ag-chain  one VJP per parent
            if parent.requires_grad:
                accumulate(parent, g)
        if not keep_grads:
            node.grad = None  # passed on to its parents, and no rule reads it again: let it go now
    if free_graph:
        for node in order:
            node.parents, node.rule = (), None
