"""Generator of the LayerNorm page's fragments (see site_scripts/build.py)."""

import numpy as np

from transformer.config import PRESETS
from transformer.crosscheck import run_crosscheck
from transformer.embedding import embedding_forward
from transformer.gradcheck import numerical_grad, relative_gap
from transformer.layernorm import layer_norm_backward, layer_norm_forward
from transformer.model import init_params
from transformer.train import TrainConfig

from .. import sections

PAGE = "layernorm"
SEED = 0
TINY_IDS = [2, 0, 2]
H_STEP = 1e-5


def tiny_input():
    """X = the embedding output of the tiny model for TINY_IDS, and block 0's LN1 parameters."""
    cfg = PRESETS["tiny"]
    params = init_params(cfg, seed=SEED)
    x, _ = embedding_forward(np.array([TINY_IDS]), params["tok_emb"], params["pos_emb"])
    return cfg, params, x[0]


def example_md():
    cfg, params, x = tiny_input()
    g, b = params["b0.ln1_g"], params["b0.ln1_b"]
    y, (xhat, rstd, _) = layer_norm_forward(x, g, b, cfg.ln_eps)
    mean = x.mean(axis=-1)
    var = ((x - mean[:, None]) ** 2).mean(axis=-1)
    sizes = f"V = {cfg.vocab_size}, T_max = {cfg.context_len}, d = {cfg.emb_dim}"
    return "\n".join([
        f'!!! example "Illustrative: a tiny model from the real `init_params` (seed {SEED}), not learned values"\n'
        f"    Sizes: {sizes}. Input: the embedding output `X` for ids `{TINY_IDS}`; block 0's LN1 "
        f"parameters as initialised (g = 1, b = 0).\n",
        sections.array_md("X", x),
        sections.md_table(["row", "mean μ", "variance σ²", "1/√(σ²+ε)"],
                          [[i, f"{m:.4f}", f"{v:.4f}", f"{r:.4f}"] for i, (m, v, r) in
                           enumerate(zip(mean, var, rstd[:, 0]))]),
        sections.array_md("x̂ = (X − μ)/√(σ²+ε)", xhat),
        sections.array_md("y = g ⊙ x̂ + b", y),
        f"Each row of `y` has mean {np.abs(y.mean(axis=-1)).max():.1e} (0 up to rounding) and variance "
        f"{y.var(axis=-1).min():.4f} to {y.var(axis=-1).max():.4f} (1 less the ε share).\n",
    ])


def shapes_md():
    cfg = PRESETS["default"]
    B, T, d = TrainConfig().batch_size, cfg.context_len, cfg.emb_dim
    x = np.zeros((B, T, d))
    g, b = np.ones(d), np.zeros(d)
    y, (xhat, rstd, _) = layer_norm_forward(x, g, b, cfg.ln_eps)
    dx, dg, db = layer_norm_backward(np.ones_like(y), (xhat, rstd, g))
    rows = [["x, y, dx", "(B, T, d)", x.shape], ["g, b, dg, db", "(d,)", g.shape],
            ["x̂ (cached)", "(B, T, d)", xhat.shape], ["1/σ (cached)", "(B, T, 1)", rstd.shape]]
    if not (y.shape == dx.shape == x.shape and dg.shape == db.shape == g.shape):
        raise RuntimeError("layer_norm shapes changed: update the shape table's rows")
    return (sections.md_table(["Tensor", "Symbolic", f"Default config (B = {B}, T = {T}, d = {d})"],
                              [[n, s, f"`{tuple(v)}`"] for n, s, v in rows])
            + "\nRecorded by running `layer_norm_forward` and `layer_norm_backward` on arrays of these sizes; "
              "B is the training batch size and T the default context length.\n")


def gradcheck_md():
    cfg, params, x = tiny_input()
    rng = np.random.default_rng(SEED)
    g = 1.0 + 0.3 * rng.standard_normal(cfg.emb_dim)  # away from 1 and 0 so every term counts
    b = 0.3 * rng.standard_normal(cfg.emb_dim)
    dy = rng.standard_normal(x.shape)
    x = x.copy()

    def f():
        return float(np.sum(layer_norm_forward(x, g, b, cfg.ln_eps)[0] * dy))

    _, cache = layer_norm_forward(x, g, b, cfg.ln_eps)
    grads = dict(zip(["dx", "dg", "db"], layer_norm_backward(dy, cache)))
    rows = []
    for name, wrt in [("dx", x), ("dg", g), ("db", b)]:
        numeric = numerical_grad(f, wrt, H_STEP)
        gap = np.abs(grads[name] - numeric).max()
        rows.append([f"`{name}`", f"{gap:.2e}", f"{relative_gap(grads[name], numeric):.2e}", "float64", f"{H_STEP:g}"])
    return ("The backward formula against central differences of f = Σ y ⊙ dy, for a random upstream "
            f"gradient dy (seed {SEED}) and random g, b, on the tiny example's X.\n\n"
            + sections.md_table(["Gradient", "Largest gap", "Relative gap", "dtype", "Step h"], rows))


def is_layernorm_row(row):
    t = row["tensor"]
    if row["check"] == "intermediate":
        return t.endswith((".ln1", ".ln2")) or t == "lnf"
    if row["check"] == "gradient":
        return "ln" in t
    return False


def devices_md():
    report = run_crosscheck()
    rows = [[r["device"], r["dtype"], r["check"], f"`{r['tensor']}`", f"{r['max_abs']:.2e}", f"{r['max_rel']:.2e}",
             f"{r['tol_rel']:g}", "pass" if r["passed"] else "**FAIL**"]
            for r in report["rows"] if is_layernorm_row(r)]
    missing = [f"- **{d['device']}**: {d['reason']}" for d in report["devices"] if d["status"] != "checked"]
    return (sections.md_table(["Device", "dtype", "Check", "Tensor", "Max abs gap", "Max rel gap", "Tolerance",
                               "Result"], rows)
            + ("\nNot checked on the build machine:\n\n" + "\n".join(missing) + "\n" if missing else "")
            + "\nFrom `python -m transformer crosscheck` (torch's `F.layer_norm` and autograd), run at build time.\n")


def generate(context):
    repo = context["repo_url"]
    return {
        "equations": sections.equations_md(PAGE, repo),
        "example": example_md(),
        "shapes": shapes_md(),
        "implementation": sections.implementation_md(layer_norm_forward, repo) + "\n"
                          + sections.implementation_md(layer_norm_backward, repo),
        "connection": sections.connection_md(PAGE, repo),
        "gradcheck": gradcheck_md(),
        "devices": devices_md(),
        "used": sections.used_md([layer_norm_forward, layer_norm_backward]),
        "status": sections.status_md(PAGE),
        "provenance": sections.provenance_md(PAGE, {"init_params": SEED, "gradient check": SEED}),
    }
