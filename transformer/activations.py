"""Element-wise non-linearities of the feed-forward network: ReLU, GELU, and GELU's tanh approximation (GPT-2's).

NaN semantics, the same for both, forward and backward: a NaN input gives a NaN output, and a NaN input
(or a NaN output gradient) gives a NaN input gradient, so a NaN is never turned into a number that looks
valid. The tests check it for every function of ACTIVATION_FUNCTIONS.
"""

import math
from functools import cache
from typing import NamedTuple

import numpy as np


@cache
def _erf_function():
    """scipy's erf where installed (faster), else math.erf entry by entry (just as exact). Imported on first use:
    scipy.special takes longer to import than the rest of the package, and a command that never reaches GELU,
    one refused at its arguments for instance, need not pay for it."""
    try:
        from scipy.special import erf
    except ImportError:  # pragma: no cover - exercised when scipy is absent
        erf = np.vectorize(math.erf, otypes=[float])
    return erf


def _erf(x):
    """The error function, element by element (`_erf_function`'s)."""
    return _erf_function()(x)


_INV_SQRT2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_TANH_CUBIC = 0.044715  # the cubic term's coefficient of the tanh approximation (Hendrycks and Gimpel, 2016)


def relu_forward(x):
    """ReLU, `max(0, x)` element by element.

    Parameters
    ----------
    x : ndarray of shape (...)
        The input, of any shape.

    Returns
    -------
    y : ndarray of shape (...)
        The output, shaped like x; NaN where x is NaN (np.maximum propagates it).
    cache : y
        What `relu_backward` needs: the output y itself (the same array), positive exactly where x is,
        which is where the gradient passes, and NaN where x is.
    """
    y = np.maximum(x, 0)  # eq:relu
    cache = y
    return y, cache


def relu_backward(dy, cache):
    """Let the gradient through where the input was positive and stop it elsewhere.

    At exactly x = 0 the derivative is taken to be 0; ReLU has no derivative there, so this is a convention.
    The derivative is sign(y): 1 where y > 0, 0 where y = 0, and NaN where the input was NaN, so a NaN
    input gives a NaN gradient instead of being stopped like a negative one.

    Parameters
    ----------
    dy : ndarray of shape (...)
        Gradient with respect to the output.
    cache : ndarray
        The cache from `relu_forward`.

    Returns
    -------
    dx : ndarray of shape (...)
        Gradient with respect to the input.
    """
    y = cache
    dx = dy * np.sign(y)  # eq:relu-grad eq:act-diagonal eq:relu-deriv  (y >= 0, so sign(y) is 0 or 1, or NaN)
    return dx


class GeluCache(NamedTuple):
    """What `gelu_forward` keeps for `gelu_backward`.

    Attributes
    ----------
    x : ndarray
        The input: the density term x phi(x) is recomputed from it.
    phi_cdf : ndarray
        Phi(x), shaped like x: computed once in the forward and reused by the backward.
    """

    x: np.ndarray
    phi_cdf: np.ndarray


def gelu_forward(x):
    """Exact GELU, `x * Phi(x)`, where Phi is the standard normal CDF computed with erf.

    Parameters
    ----------
    x : ndarray of shape (...)
        The input, of any shape.

    Returns
    -------
    y : ndarray of shape (...)
        The output, shaped like x; NaN where x is NaN (erf propagates it).
    cache : GeluCache
        What `gelu_backward` needs.
    """
    phi_cdf = 0.5 * (1.0 + _erf(x * _INV_SQRT2)).astype(x.dtype, copy=False)  # eq:gelu
    with np.errstate(invalid="ignore"):
        y = x * phi_cdf  # eq:gelu
    y[phi_cdf == 0] = 0  # GELU's limit at -inf, where x * Phi(x) is -inf * 0 = NaN
    cache = GeluCache(x, phi_cdf)
    return y, cache


def gelu_backward(dy, cache):
    """Gradient of GELU, `d/dx [x Phi(x)] = Phi(x) + x phi(x)`, where phi is the standard normal density.

    Parameters
    ----------
    dy : ndarray of shape (...)
        Gradient with respect to the output.
    cache : GeluCache
        The cache from `gelu_forward`.

    Returns
    -------
    dx : ndarray of shape (...)
        Gradient with respect to the input; NaN where x or dy is NaN.
    """
    x, phi_cdf = cache
    phi_pdf = _INV_SQRT_2PI * np.exp(-0.5 * x * x)  # eq:gelu-density
    with np.errstate(invalid="ignore"):
        x_phi = x * phi_pdf
    x_phi[phi_pdf == 0] = 0  # the term's limit at +-inf, where it is inf * 0 = NaN
    dx = dy * (phi_cdf + x_phi)  # eq:gelu-grad eq:act-diagonal eq:gelu-product
    return dx


class GeluTanhCache(NamedTuple):
    """What `gelu_tanh_forward` keeps for `gelu_tanh_backward`.

    Attributes
    ----------
    x : ndarray
        The input: the derivative of the tanh's argument is recomputed from it.
    tanh : ndarray
        tanh(z(x)), shaped like x: computed once in the forward and reused by the backward.
    """

    x: np.ndarray
    tanh: np.ndarray


def gelu_tanh_forward(x):
    """GELU's tanh approximation, `x (1 + tanh z) / 2` with `z = sqrt(2/pi) (x + 0.044715 x^3)`.

    GPT-2 was trained with it (transformers calls it "gelu_new", torch `gelu(x, approximate="tanh")`); it
    differs from the exact GELU by less than 1e-3 everywhere, so a model trained with one runs measurably
    differently with the other.

    Parameters
    ----------
    x : ndarray of shape (...)
        The input, of any shape.

    Returns
    -------
    y : ndarray of shape (...)
        The output, shaped like x; NaN where x is NaN (tanh propagates it).
    cache : GeluTanhCache
        What `gelu_tanh_backward` needs.
    """
    tanh = np.tanh(_SQRT_2_OVER_PI * (x + _TANH_CUBIC * x ** 3))  # eq:gelu-tanh
    with np.errstate(invalid="ignore"):
        y = 0.5 * x * (1.0 + tanh)  # eq:gelu-tanh
    y[tanh == -1] = 0  # the limit at -inf (and below about -10, where the product is -0 anyway)
    cache = GeluTanhCache(x, tanh)
    return y, cache


def gelu_tanh_backward(dy, cache):
    """Gradient of the tanh GELU: `(1 + tanh z) / 2 + x (1 - tanh^2 z) z'(x) / 2`, `z' = sqrt(2/pi) (1 + 3 0.044715 x^2)`.

    Where tanh z is exactly +-1 in floating point (|x| above about 10) the second term is zero; it is
    taken as zero there explicitly, so that an input so large that x^2 overflows still gets the gradient
    the first term gives (1 or 0) instead of 0 * inf = NaN.

    Parameters
    ----------
    dy : ndarray of shape (...)
        Gradient with respect to the output.
    cache : GeluTanhCache
        The cache from `gelu_tanh_forward`.

    Returns
    -------
    dx : ndarray of shape (...)
        Gradient with respect to the input; NaN where x or dy is NaN.
    """
    x, tanh = cache
    sech2 = 1.0 - tanh * tanh  # d tanh(z) / dz  # eq:gelu-tanh-grad
    saturated = sech2 == 0
    x_inner = np.where(saturated, 0.0, x).astype(x.dtype, copy=False)  # keeps x^2 finite where the term is zero anyway
    dz = _SQRT_2_OVER_PI * (1.0 + 3.0 * _TANH_CUBIC * x_inner * x_inner)  # eq:gelu-tanh-grad
    dx = dy * (0.5 * (1.0 + tanh) + 0.5 * x_inner * sech2 * dz)  # eq:gelu-tanh-grad eq:act-diagonal
    return dx


ACTIVATION_FUNCTIONS = {
    "relu": (relu_forward, relu_backward),
    "gelu": (gelu_forward, gelu_backward),
    "gelu_tanh": (gelu_tanh_forward, gelu_tanh_backward),
}
