"""The custom-gradient seam: a fused operation with its own backward, put on the tape as one node.

The engine differentiates a composition of primitives automatically. Sometimes a hand-written backward
is better: it keeps a smaller cache (LayerNorm keeps xhat and 1/sigma, not the dozen intermediates of
its composition), or the composition could not run at all (Flash attention never forms the (T, T)
probabilities a composed softmax would keep). `custom_op` runs such a forward on plain arrays and
records one node whose rule is the operation's vector-Jacobian product (VJP).

A wrong VJP would corrupt every gradient upstream of it without a trace, so the seam checks what the
VJP returns against the inputs: one gradient per input, each with that input's shape and dtype.
"""

import numpy as np

from .autograd import Tensor, as_tensor
from .errors import TransformerError


class CustomGradientError(TransformerError):
    """A custom operation's VJP returned the wrong number of gradients, or one of the wrong shape or dtype."""


def check_vjp_result(name, grads, inputs):
    """Refuse a VJP result that does not fit the inputs.

    Parameters
    ----------
    name : str
        The operation's name, for the message.
    grads : tuple
        What the VJP returned.
    inputs : tuple of Tensor
        The operation's inputs.

    Returns
    -------
    tuple of ndarray
        The gradients, one per input.

    Raises
    ------
    CustomGradientError
        If the count, a shape or a dtype is wrong; the message names the operation and the input.
    """
    grads = tuple(grads)
    if len(grads) != len(inputs):
        raise CustomGradientError(
            f"custom op {name!r}: the VJP returned {len(grads)} gradients for {len(inputs)} inputs")
    for position, (g, x) in enumerate(zip(grads, inputs)):
        g = np.asarray(g)
        if g.shape != x.shape:  # eq:ag-vjp  each gradient shaped like its input
            raise CustomGradientError(f"custom op {name!r}: the gradient of input {position} has shape "
                                      f"{g.shape}, the input has shape {x.shape}")
        if g.dtype != x.data.dtype:
            raise CustomGradientError(f"custom op {name!r}: the gradient of input {position} has dtype "
                                      f"{g.dtype}, the input has dtype {x.data.dtype}")
    return grads


def custom_op(name, forward, vjp, *inputs):
    """Apply a fused operation whose backward is given, recording it on the tape as one node.

    Parameters
    ----------
    name : str
        The operation's name (shown in the graph and in errors).
    forward : callable
        `forward(*arrays) -> (out, saved)`: computes the output array from the inputs' arrays and
        returns whatever its VJP needs, its cache.
    vjp : callable
        `vjp(grad_out, saved) -> tuple`: the gradient of each input, in the order of inputs.
    *inputs : Tensor or array_like
        The operation's inputs; anything that is not a Tensor is a constant.

    Returns
    -------
    Tensor
        The output. Its rule calls vjp and checks the result (see `check_vjp_result`).
    """
    inputs = tuple(as_tensor(x) for x in inputs)
    out, saved = forward(*(x.data for x in inputs))
    return Tensor(out, parents=inputs, op=name,
                  rule=lambda g: check_vjp_result(name, vjp(g, saved), inputs))  # eq:ag-vjp
