"""Generator of the Transformer Block page's fragments."""

import numpy as np

from transformer.attention import attention_forward
from transformer.block import BLOCK_KEYS, block_backward, block_forward, block_params

from .. import sections
from ..examples import H_STEP, SEED, TINY_IDS, biases_moved, default_note, default_run, illustrative, tiny, weighted_sum


def example_md():
    ex = tiny()
    cfg, x, p = ex.cfg, ex.trace["embedding"], block_params(ex.params, 0)
    y, cache = block_forward(x, p, cfg)
    m = x + attention_forward(ex.trace["b0.ln1"], p, cfg.num_heads)[0]  # M (`h` in block_forward, not returned)
    dy = np.ones_like(y)
    dx, _ = block_backward(dy, cache)
    return "\n".join([
        illustrative(f"Block 0 of the tiny model ({cfg.activation}) on ids `{TINY_IDS}`."),
        sections.array_md("X (block input)", x[0], row_label="position"),
        sections.array_md("LN1(X)", ex.trace["b0.ln1"][0], row_label="position"),
        sections.array_md("M = X + Attn(LN1(X))", m[0], row_label="position"),
        sections.array_md("LN2(M)", ex.trace["b0.ln2"][0], row_label="position"),
        sections.array_md("Y = M + FFN(LN2(M))", y[0], row_label="position"),
        f"At initialisation this block changes the stream by ‖Y − X‖ / ‖X‖ = "
        f"{np.linalg.norm(y - x) / np.linalg.norm(x):.2f} of its size.\n",
        "Backward with dY = 1 everywhere: the residual connections hand dY straight to the input, and the two "
        "branches add their own gradients on top.\n",
        sections.array_md("dX", dx[0], row_label="position"),
        f"dX − dY ranges from {(dx - dy).min():.4f} to {(dx - dy).max():.4f}: the branches' share.\n",
    ])


def symbols_md():
    ex = default_run()
    p, x = block_params(ex.params, 0), ex.trace["embedding"]
    y, cache = block_forward(x, p, ex.cfg)
    dx, grads = block_backward(np.ones_like(y), cache)
    rows = [
        (r"X", "x", x.shape),
        (r"M", "h", y.shape),
        (r"U_2", "u", y.shape),
        (r"W_1", "ff1_w", p["ff1_w"].shape),
        (r"b_1", "ff1_b", p["ff1_b"].shape),
        (r"W_2", "ff2_w", p["ff2_w"].shape),
        (r"b_2", "ff2_b", p["ff2_b"].shape),
        (r"\phi", "act_forward", "—"),
        (r"X^{(l+1)}", "y", y.shape),
        (r"\partial\ell/\partial X", "dx", dx.shape),
    ]
    return sections.symbols_md(rows, default_note() + f"; {len(grads)} parameter gradients per block")


def gradcheck_md():
    rows_all, ex, rng = [], tiny(), np.random.default_rng(SEED)
    for activation in ("relu", "gelu"):
        cfg = ex.cfg.with_(activation=activation)
        p = biases_moved(block_params(ex.params, 0), rng)
        x = rng.standard_normal((2, cfg.context_len, cfg.emb_dim))
        dy = rng.standard_normal(x.shape)
        dx, grads = block_backward(dy, block_forward(x, p, cfg)[1])
        checks = [(f"{activation}: dx", dx, x)] + [(f"{activation}: d{k}", grads[k], p[k]) for k in BLOCK_KEYS]
        rows_all += sections.gradcheck_rows(weighted_sum(dy, block_forward, x, p, cfg), checks, H_STEP)
    return (f"f = Σ Y ⊙ dY through a whole block (tiny sizes, 1-D parameters moved off their initial values, random "
            f"X and dY, seed {SEED}), once with ReLU and once with GELU.\n\n" + sections.gradcheck_table(rows_all))


def generate(context):
    return {"symbols": symbols_md(), "example": example_md(), "gradcheck": gradcheck_md()}
