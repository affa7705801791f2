"""Linear (affine) layer: y = x W + b, weights stored (in, out)."""


def linear_forward(x, w, b):
    """(..., in), (in, out), (out,) -> y (..., out), cache"""
    # One 2-D matmul over all rows (every position of every sequence) is
    # faster in numpy than a stacked (B, T, in) @ (in, out) product.
    y = x.reshape(-1, x.shape[-1]) @ w  # eq:linear
    y += b  # eq:linear
    cache = (x, w)
    return y.reshape(*x.shape[:-1], w.shape[1]), cache


def linear_backward(dy, cache):
    """dy (..., out) -> dx (..., in), dw (in, out), db (out,)"""
    x, w = cache
    # Flatten the leading dimensions: every row (every position of every
    # sequence) adds its outer product x_row^T dy_row into dw in one matmul.
    x2 = x.reshape(-1, x.shape[-1])
    dy2 = dy.reshape(-1, dy.shape[-1])
    dx = (dy2 @ w.T).reshape(x.shape)  # eq:linear-grad
    dw = x2.T @ dy2  # eq:linear-grad
    db = dy2.sum(axis=0)  # eq:linear-grad
    return dx, dw, db
