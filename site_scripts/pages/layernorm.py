"""Generator of the LayerNorm page's fragments (see site_scripts/build.py)."""

import numpy as np

from transformer.layernorm import layer_norm_backward, layer_norm_forward

from .. import sections
from ..examples import H_STEP, SEED, TINY_IDS, default_note, default_run, illustrative, tiny, weighted_sum


def example_md():
    ex = tiny()
    x, g, b = ex.trace["embedding"][0], ex.params["b0.ln1_g"], ex.params["b0.ln1_b"]
    y, (xhat, rstd, _) = layer_norm_forward(x, g, b, ex.cfg.ln_eps)
    mean = x.mean(axis=-1)
    var = ((x - mean[:, None]) ** 2).mean(axis=-1)
    return "\n".join([
        illustrative(f"Input: the embedding output `X` for ids `{TINY_IDS}`; block 0's LN1 parameters as "
                     "initialised (g = 1, b = 0). Rows are positions."),
        sections.array_md("X", x, row_label="position"),
        sections.md_table(["position", "mean μ", "variance σ²", "1/√(σ²+ε)"],
                          [[i, f"{m:.4f}", f"{v:.4f}", f"{r:.4f}"] for i, (m, v, r) in
                           enumerate(zip(mean, var, rstd[:, 0], strict=True))]),
        sections.array_md("x̂ = (X − μ)/√(σ²+ε)", xhat),
        sections.array_md("y = g ⊙ x̂ + b", y),
        f"Each row of `y` has mean {np.abs(y.mean(axis=-1)).max():.1e} (0 up to rounding) and variance "
        f"{y.var(axis=-1).min():.4f} to {y.var(axis=-1).max():.4f} (1 less the ε share).\n",
    ])


def symbols_md():
    ex = default_run()
    x, eps = ex.trace["embedding"], ex.cfg.ln_eps
    g, b = np.ones(ex.cfg.emb_dim), np.zeros(ex.cfg.emb_dim)
    y, (xhat, rstd, _) = layer_norm_forward(x, g, b, eps)
    dx, dg, _ = layer_norm_backward(np.ones_like(y), (xhat, rstd, g))
    rows = [
        (r"X", "x", x.shape, "the embedding output, which block 0's LN1 reads"),
        (r"d", "x.shape[-1]", f"{x.shape[-1]}"),
        (r"\mu, \sigma^2", "mean, var", rstd.shape),
        (r"\epsilon_{\mathrm{LN}}", "eps (cfg.ln_eps)", f"{eps:g}"),
        (r"r", "rstd", rstd.shape),
        (r"\hat{x}", "xhat", xhat.shape),
        (r"\gamma", "g (b{l}.ln1_g, ...)", g.shape),
        (r"\beta", "b (b{l}.ln1_b, ...)", g.shape),
        (r"U", "y", y.shape, "block 0's LN1 output"),
        (r"\delta", "dxhat", dx.shape),
        (r"\partial\ell/\partial \gamma", "dg", dg.shape),
        (r"\partial\ell/\partial \beta", "db", dg.shape),
    ]
    return sections.symbols_md(rows, default_note())


def gradcheck_md():
    ex, rng = tiny(), np.random.default_rng(SEED)
    x, eps = ex.trace["embedding"][0].copy(), ex.cfg.ln_eps
    g = 1.0 + 0.3 * rng.standard_normal(ex.cfg.emb_dim)  # away from 1 and 0 so every term counts
    b = 0.3 * rng.standard_normal(ex.cfg.emb_dim)
    dy = rng.standard_normal(x.shape)
    dx, dg, db = layer_norm_backward(dy, layer_norm_forward(x, g, b, eps)[1])
    rows = sections.gradcheck_rows(weighted_sum(dy, layer_norm_forward, x, g, b, eps),
                                   [("dx", dx, x), ("dg", dg, g), ("db", db, b)], H_STEP)
    return ("The backward formula against central differences of f = Σ y ⊙ dy, for a random upstream "
            f"gradient dy (seed {SEED}) and random g, b, on the tiny example's X.\n\n" + sections.gradcheck_table(rows))


def generate(context):
    return {"symbols": symbols_md(), "example": example_md(), "gradcheck": gradcheck_md()}
