"""Generator of the LayerNorm page's fragments (see site_scripts/build.py)."""

import numpy as np

from transformer.embedding import embedding_forward
from transformer.layernorm import layer_norm_backward, layer_norm_forward

from .. import sections
from ..examples import (
    H_STEP,
    SEED,
    TINY_IDS,
    default_note,
    default_run,
    illustrative,
    tiny,
)

PAGE = "layernorm"


def tiny_input():
    """X = the embedding output of the tiny model for TINY_IDS (one sequence)."""
    cfg, params, ids = tiny()
    x, _ = embedding_forward(ids, params["tok_emb"], params["pos_emb"])
    return cfg, params, x[0]


def example_md():
    cfg, params, x = tiny_input()
    g, b = params["b0.ln1_g"], params["b0.ln1_b"]
    y, (xhat, rstd, _) = layer_norm_forward(x, g, b, cfg.ln_eps)
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


def recorded():
    """The shapes at the default config, recorded by running forward and backward."""
    cfg, B, T, trace = default_run()
    x = trace["embedding"]
    g, b = np.ones(cfg.emb_dim), np.zeros(cfg.emb_dim)
    y, (xhat, rstd, _) = layer_norm_forward(x, g, b, cfg.ln_eps)
    dx, dg, db = layer_norm_backward(np.ones_like(y), (xhat, rstd, g))
    return {"x": x.shape, "y": y.shape, "xhat": xhat.shape, "rstd": rstd.shape, "g": g.shape, "b": b.shape,
            "dx": dx.shape, "dg": dg.shape, "db": db.shape, "eps": cfg.ln_eps}


def symbols_md():
    s = recorded()
    rows = [
        (r"x", "the input: one row of width d per position", "x", "(B, T, d)", s["x"]),
        (r"d", "the width of a row", "x.shape[-1]", "scalar", f"{s['x'][-1]}"),
        (r"\mu, \sigma^2", "each row's mean and population variance", "mean, var", "(B, T, 1)", s["rstd"]),
        (r"\epsilon", "keeps the division finite for a constant row", "eps (cfg.ln_eps)", "scalar", f"{s['eps']:g}"),
        (r"1/\sqrt{\sigma^2+\epsilon}", "the reciprocal spread, cached for the backward", "rstd", "(B, T, 1)",
         s["rstd"]),
        (r"\hat{x}", "the normalised rows", "xhat", "(B, T, d)", s["xhat"]),
        (r"g, b", "learned gain and shift", "g, b (b{l}.ln1_g, ...)", "(d,)", s["g"]),
        (r"y", "the output", "y", "(B, T, d)", s["y"]),
        (r"\delta", "the upstream gradient times the gain", "dxhat", "(B, T, d)", s["dx"]),
        (r"\partial\ell/\partial g, \partial\ell/\partial b", "the parameter gradients", "dg, db", "(d,)", s["dg"]),
    ]
    return sections.symbols_md(rows, default_note() + "; x is the embedding output")


def gradcheck_md():
    cfg, params, x = tiny_input()
    rng = np.random.default_rng(SEED)
    g = 1.0 + 0.3 * rng.standard_normal(cfg.emb_dim)  # away from 1 and 0 so every term counts
    b = 0.3 * rng.standard_normal(cfg.emb_dim)
    dy = rng.standard_normal(x.shape)
    x = x.copy()

    def loss():
        return float(np.sum(layer_norm_forward(x, g, b, cfg.ln_eps)[0] * dy))

    dx, dg, db = layer_norm_backward(dy, layer_norm_forward(x, g, b, cfg.ln_eps)[1])
    rows = sections.gradcheck_rows(loss, [("dx", dx, x), ("dg", dg, g), ("db", db, b)], H_STEP)
    return ("The backward formula against central differences of f = Σ y ⊙ dy, for a random upstream "
            f"gradient dy (seed {SEED}) and random g, b, on the tiny example's X.\n\n" + sections.gradcheck_table(rows))



def generate(context):
    return {
        "symbols": symbols_md(),
        "example": example_md(),
        "gradcheck": gradcheck_md(),
    }
