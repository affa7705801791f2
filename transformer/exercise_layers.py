"""The exercises on the model's layers: a forward and its backward each, graded by the common checks
(exercise_checks.pair_checks) and the properties the unit tests state for that layer.

The inputs have the tiny model's sizes (B = 2 sequences of T = 3 positions, width d = 4, two heads), so that a
reader who prints them can follow every number.
"""

import numpy as np

from .config import PRESETS
from .errors import MaskedRowError
from .model import init_params
from .exercise_checks import Check, Failed, Pair, pair_checks, same
from .exercise_grade import Exercise

B, T, D, HEADS = 2, 3, 4, 2
TINY = PRESETS["tiny"]


def rows(rng, dtype, *shape):
    return rng.standard_normal(shape).astype(dtype)


def away_from_zero(x):
    return x + np.sign(x) * x.dtype.type(0.1)


def attention_params(rng, dtype):
    """The attention's parameters, biases included, drawn at the scale `init_params` draws weights."""
    p = {}
    for name in ("q", "k", "v", "o"):
        p[f"w{name}"] = rows(rng, dtype, D, D) * dtype(0.5)
        p[f"b{name}"] = rows(rng, dtype, D) * dtype(0.1)
    return p


def torch_attention(x, p, num_heads):
    import torch

    def heads(t):
        return t.reshape(B, T, num_heads, D // num_heads).transpose(1, 2)
    q, k, v = (heads(x @ p[f"w{n}"] + p[f"b{n}"]) for n in "qkv")
    scores = q @ k.transpose(-1, -2) / (D // num_heads) ** 0.5
    scores = scores.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v
    return out.transpose(1, 2).reshape(B, T, D) @ p["wo"] + p["bo"]


def later_positions_ignored(reader, _ref):
    """Causal: changing the input at the last position leaves every earlier output as it was."""
    x, p = rows(np.random.default_rng(6), np.float64, B, T, D), attention_params(np.random.default_rng(7), np.float64)
    y, _ = reader.attention_forward(x, p, HEADS)
    x2 = x.copy()
    x2[:, -1] += 1.0
    y2, _ = reader.attention_forward(x2, p, HEADS)
    if not np.array_equal(y[:, :-1], y2[:, :-1]):
        raise Failed("changing the last position's input changed the outputs of earlier positions: a position "
                     "must attend only to itself and the positions before it")


def nan_passes(forward, backward):
    """A NaN input gives a NaN output and a NaN gradient, not a number that hides it."""
    def check(reader, _ref):
        x = np.array([-1.5, np.nan, 2.0])
        y, cache = getattr(reader, forward)(x)
        dx = getattr(reader, backward)(np.ones_like(x), cache)
        if not (np.isnan(y[1]) and np.isnan(dx[1])):
            raise Failed(f"a NaN input gave output {y[1]} and gradient {dx[1]}: a NaN must pass through both, so "
                         "that a diverged model shows, instead of being stopped like a negative input")
    return check


def infinite_limits(forward, backward):
    """At -inf the output is 0 with slope 0, at +inf the output is +inf with slope 1: the limits, not NaN."""
    def check(reader, _ref):
        x = np.array([-np.inf, 0.5, np.inf])
        with np.errstate(all="ignore"):
            y, cache = getattr(reader, forward)(x)
            dx = getattr(reader, backward)(np.ones_like(x), cache)
        if not (y[0] == 0 and y[2] == np.inf and dx[0] == 0 and dx[2] == 1):
            raise Failed(f"at -inf and +inf the output is {y[0]} and {y[2]}, the slope {dx[0]} and {dx[2]}: expected "
                         "the limits 0 and inf, with slopes 0 and 1 (-inf * 0 is NaN in floating point)")
    return check


def rows_of_dx_sum_to_zero(reader, _ref):
    """Shifting a whole row of x leaves LayerNorm's output as it is, so each row of dx sums to 0."""
    x = rows(np.random.default_rng(8), np.float64, B, T, D)
    y, cache = reader.layer_norm_forward(x, np.linspace(0.5, 1.5, D), np.zeros(D), 1e-5)
    dx = reader.layer_norm_backward(rows(np.random.default_rng(9), np.float64, B, T, D), cache)[0]
    worst = float(np.abs(dx.sum(axis=-1)).max())
    if worst > 1e-12:
        raise Failed(f"a row of dx sums to {worst:.2e}, not 0 (adding one number to a whole row of x leaves y as it "
                     "is, so the gradient along that direction must vanish)")


def softmax_rows(reader, _ref):
    """Each row of p sums to 1, and scores of 1000 (which exp alone overflows) give finite probabilities."""
    for scale in (1.0, 1000.0):
        with np.errstate(over="ignore", invalid="ignore"):
            p, _ = reader.softmax_forward(scale * rows(np.random.default_rng(10), np.float64, B, T, 5))
        if not np.isfinite(p).all():
            raise Failed(f"scores of size {scale:g} gave probabilities that are not finite: exp overflows unless "
                         "each row's largest score is subtracted first")
        if np.abs(p.sum(axis=-1) - 1).max() > 1e-12:
            raise Failed("a row of probabilities does not sum to 1")


def masked_row_refused(reader, _ref):
    """A row of -inf scores has no softmax: it is refused with MaskedRowError, not turned into NaN."""
    x = np.zeros((2, 3))
    x[1] = -np.inf
    try:
        with np.errstate(invalid="ignore"):
            reader.softmax_forward(x)
    except MaskedRowError:
        return
    raise Failed("a row whose every score is -inf was not refused (MaskedRowError)")


def small_int_ids(reader, ref):
    """Ids of a small integer type index a large table without wrapping around."""
    rng = np.random.default_rng(11)
    tok, pos = rows(rng, np.float64, 300, 128), rows(rng, np.float64, 3, 128)
    ids = np.array([[299, 0, 257]], dtype=np.int16)
    dx = rows(rng, np.float64, 1, 3, 128)
    mine = reader.embedding_backward(dx, reader.embedding_forward(ids, tok, pos)[1])
    theirs = ref.embedding_backward(dx, ref.embedding_forward(ids, tok, pos)[1])
    same("the token table's gradient for int16 ids into a table of 300 rows of 128", mine[0], theirs[0])


def pairs():
    """The forward and backward pairs of the layers, with their inputs (and torch's version of each forward)."""
    ln = Pair("layer_norm_forward", "layer_norm_backward",
              lambda rng, dt: (rows(rng, dt, B, T, D), 1 + 0.3 * rows(rng, dt, D), 0.3 * rows(rng, dt, D)),
              wrt=(0, 1, 2), extra={"eps": 1e-5},
              torch=lambda x, g, b: __import__("torch").nn.functional.layer_norm(x, (D,), g, b, 1e-5))
    linear = Pair("linear_forward", "linear_backward",
                  lambda rng, dt: (rows(rng, dt, B, T, D), rows(rng, dt, D, 6), rows(rng, dt, 6)), wrt=(0, 1, 2),
                  torch=lambda x, w, b: x @ w + b)
    # ReLU has a kink at 0, where central differences average the two slopes: inputs are kept away from it.
    relu = Pair("relu_forward", "relu_backward", lambda rng, dt: (away_from_zero(rows(rng, dt, B, T, D)),),
                wrt=(0,), torch=lambda x: x.relu())
    gelu = Pair("gelu_forward", "gelu_backward", lambda rng, dt: (rows(rng, dt, B, T, D),), wrt=(0,),
                torch=lambda x: __import__("torch").nn.functional.gelu(x))
    gelu_tanh = Pair("gelu_tanh_forward", "gelu_tanh_backward", lambda rng, dt: (rows(rng, dt, B, T, D),), wrt=(0,),
                     torch=lambda x: __import__("torch").nn.functional.gelu(x, approximate="tanh"))
    softmax = Pair("softmax_forward", "softmax_backward", lambda rng, dt: (rows(rng, dt, B, T, 5),), wrt=(0,),
                   torch=lambda x: x.softmax(-1))
    xent = Pair("cross_entropy_forward", "cross_entropy_backward",
                lambda rng, dt: (rows(rng, dt, B, T, 5), rng.integers(0, 5, (B, T))), wrt=(0,),
                torch=lambda z, t: __import__("torch").nn.functional.cross_entropy(z.reshape(-1, 5), t.reshape(-1)))
    keys = tuple(attention_params(np.random.default_rng(0), np.float64))
    attention = Pair("attention_forward", "attention_backward",
                     lambda rng, dt: (rows(rng, dt, B, T, D), attention_params(rng, dt)),
                     wrt=(0, *((1, k) for k in keys)), grads=lambda out: (out[0], *(out[1][k] for k in keys)),
                     extra={"num_heads": HEADS}, torch=lambda x, p: torch_attention(x, p, HEADS))
    block = block_pair()
    embed = Pair("embedding_forward", "embedding_backward",
                 lambda rng, dt: (np.array([[2, 0, 2], [1, 2, 2]]), rows(rng, dt, 5, D), rows(rng, dt, 4, D)),
                 wrt=(1, 2), torch=lambda ids, tok, pos: tok[ids] + pos[:T])
    return dict(ln=ln, linear=linear, relu=relu, gelu=gelu, gelu_tanh=gelu_tanh, softmax=softmax, xent=xent,
                attention=attention, block=block, embed=embed)


def exercises():
    p = pairs()
    ln, linear, relu, gelu, gelu_tanh = p["ln"], p["linear"], p["relu"], p["gelu"], p["gelu_tanh"]
    softmax, xent, attention, block, embed = p["softmax"], p["xent"], p["attention"], p["block"], p["embed"]
    return [
        Exercise("linear", "the affine layer, y = x W + b", "model/linear.md",
                 (("linear", "linear_forward"), ("linear", "linear_backward")), pair_checks(linear)),
        Exercise("relu", "ReLU and its backward", "model/linear.md",
                 (("activations", "relu_forward"), ("activations", "relu_backward")),
                 [*pair_checks(relu), Check("NaN passes through", nan_passes("relu_forward", "relu_backward"),
                                            "backward")]),
        Exercise("gelu", "GELU, exact and with tanh, and their backwards", "model/linear.md",
                 (("activations", "gelu_forward"), ("activations", "gelu_backward"),
                  ("activations", "gelu_tanh_forward"), ("activations", "gelu_tanh_backward")),
                 [*pair_checks(gelu), *pair_checks(gelu_tanh),
                  Check("infinities go to the limits (gelu)", infinite_limits("gelu_forward", "gelu_backward"),
                        "forward"),
                  Check("infinities go to the limits (gelu_tanh)",
                        infinite_limits("gelu_tanh_forward", "gelu_tanh_backward"), "forward")]),
        Exercise("layernorm", "LayerNorm and its backward", "model/layernorm.md",
                 (("layernorm", "layer_norm_forward"), ("layernorm", "layer_norm_backward")),
                 [*pair_checks(ln), Check("each row of dx sums to zero", rows_of_dx_sum_to_zero, "backward")]),
        Exercise("softmax", "softmax and the cross-entropy loss, and their backwards", "model/softmax.md",
                 (("softmax", "softmax_forward"), ("softmax", "softmax_backward"),
                  ("softmax", "cross_entropy_forward"), ("softmax", "cross_entropy_backward")),
                 [*pair_checks(softmax), *pair_checks(xent),
                  Check("rows sum to one, without overflow", softmax_rows, "forward"),
                  Check("a fully masked row is refused", masked_row_refused, "forward")]),
        Exercise("attention", "causal multi-head self-attention and its backward", "model/attention.md",
                 (("attention", "attention_forward"), ("attention", "attention_backward")),
                 [*pair_checks(attention), Check("causal: later positions are not seen", later_positions_ignored,
                                                 "forward")]),
        Exercise("block", "the transformer block's backward", "model/block.md", (("block", "block_backward"),),
                 pair_checks(block)),
        Exercise("embedding", "token and position embeddings, and the scatter of their gradient",
                 "model/embeddings.md",
                 (("embedding", "embedding_forward"), ("embedding", "embedding_backward")),
                 [*pair_checks(embed), Check("ids of a small integer type", small_int_ids, "backward")]),
    ]


def block_pair():
    """block_forward (the project's) and the reader's block_backward, with the tiny model's first block."""
    from .block import BLOCK_KEYS, block_params

    def make(rng, dtype):
        params = init_params(TINY, seed=int(rng.integers(100)), dtype=dtype)
        p = {k: v.copy() for k, v in block_params(params, 0).items()}
        for v in p.values():
            if v.ndim == 1:  # gains and biases moved off 1 and 0, so that every term of the backward shows
                v += (0.2 * rng.standard_normal(v.shape)).astype(dtype)
        return rows(rng, dtype, B, T, TINY.emb_dim), p

    def torch(x, p):
        from .torch_mirror import torch_block

        return torch_block(x, p, TINY, {})

    return Pair("block_forward", "block_backward", make, wrt=(0, *((1, k) for k in BLOCK_KEYS)),
                grads=lambda out: (out[0], *(out[1][k] for k in BLOCK_KEYS)), extra={"cfg": TINY}, torch=torch)
