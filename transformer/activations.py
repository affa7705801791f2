"""Element-wise non-linearities of the feed-forward network: ReLU and GELU."""

import math

import numpy as np

try:  # scipy's erf is faster; math.erf is just as exact. Either suffices.
    from scipy.special import erf as _erf
except ImportError:  # pragma: no cover - exercised when scipy is absent
    _erf = np.vectorize(math.erf, otypes=[float])

_INV_SQRT2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def relu_forward(x):
    """max(0, x), element-wise. x (...) -> y (...), cache"""
    y = np.maximum(x, 0)  # eq:relu
    cache = y
    return y, cache


def relu_backward(dy, cache):
    """The gradient passes where the input was positive and stops elsewhere.

    At exactly x = 0 we take the derivative as 0 (a convention: the function
    has no derivative there).
    """
    y = cache
    dx = dy * (y > 0)  # eq:relu-grad  (the boolean mask multiplies as 0 or 1)
    return dx


def gelu_forward(x):
    """Exact GELU: x * Phi(x), Phi the standard normal CDF (with erf)."""
    phi_cdf = 0.5 * (1.0 + _erf(x * _INV_SQRT2)).astype(x.dtype, copy=False)
    y = x * phi_cdf  # eq:gelu
    cache = (x, phi_cdf)
    return y, cache


def gelu_backward(dy, cache):
    """d/dx [x Phi(x)] = Phi(x) + x phi(x), phi the standard normal density."""
    x, phi_cdf = cache
    phi_pdf = _INV_SQRT_2PI * np.exp(-0.5 * x * x)
    dx = dy * (phi_cdf + x * phi_pdf)  # eq:gelu-grad
    return dx


ACTIVATION_FUNCTIONS = {
    "relu": (relu_forward, relu_backward),
    "gelu": (gelu_forward, gelu_backward),
}
