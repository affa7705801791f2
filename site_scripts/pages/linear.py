"""Generator of the Linear / ReLU / GELU / Initialisation page's fragments."""

import numpy as np

from transformer.activations import gelu_backward, gelu_forward, relu_backward, relu_forward
from transformer.linear import linear_backward, linear_forward

from .. import sections
from ..examples import H_STEP, SEED, TINY_IDS, default_note, default_run, illustrative, tiny, weighted_sum


def example_md():
    ex = tiny()
    u, params = ex.trace["b0.ln2"][0], ex.params
    z, _ = linear_forward(u, params["b0.ff1_w"], params["b0.ff1_b"])
    r, _ = relu_forward(z)
    g, _ = gelu_forward(z)
    return "\n".join([
        illustrative(f"U: block 0's LN2 output for ids `{TINY_IDS}`, fed to the first feed-forward layer "
                     "`b0.ff1_w` (biases are zero at initialisation)."),
        sections.array_md("U", u, row_label="position"),
        sections.array_md("b0.ff1_w", params["b0.ff1_w"], row_label="input unit"),
        sections.array_md("Z = U W + b", z, row_label="position"),
        sections.array_md("ReLU(Z)", r, row_label="position"),
        sections.array_md("GELU(Z)", g, row_label="position"),
        f"ReLU zeroes {int((r == 0).sum())} of {r.size} entries; GELU keeps a small negative output for "
        f"negative inputs (smallest {g.min():.4f}) and is close to the identity for large positive ones.\n",
    ])


def xavier_md():
    rows = []
    for name, w in default_run().params.items():
        if w.ndim == 2 and not name.startswith("b1."):
            a = np.sqrt(6.0 / sum(w.shape))
            rows.append([f"`{name}`", sections.shape_text(w.shape), f"{a:.4f}", f"{np.abs(w).max():.4f}",
                         f"{w.std():.4f}", f"{a / np.sqrt(3):.4f}"])
    return (sections.md_table(["Matrix", "Shape", "Limit a", "Largest |W|", "Std of W", "a/√3 (std of U(−a, a))"],
                              rows)
            + f"\nAt {default_note(batch=False)}, seed {SEED}; block 1's matrices have the same shapes and limits as "
              "block 0's. Every largest |W| lies below its limit, and each standard deviation is close to a/√3.\n")


def symbols_md():
    ex = default_run()
    p, u = ex.params, ex.trace["b0.ln2"]
    z, cache = linear_forward(u, p["b0.ff1_w"], p["b0.ff1_b"])
    _, dw, _ = linear_backward(np.ones_like(z), cache)
    rows = [
        (r"A", "x", u.shape, "block 0's LN2 output"),
        (r"W", "w", p["b0.ff1_w"].shape, "`b0.ff1_w`"),
        (r"b", "b", p["b0.ff1_b"].shape),
        (r"Y", "y", z.shape),
        (r"\partial\ell/\partial W", "dw", dw.shape, "every row's outer product, summed"),
        (r"\Phi, \varphi", "phi_cdf, phi_pdf", z.shape),
        (r"a", "limit", "see the table below"),
    ]
    return sections.symbols_md(rows, default_note())


def gradcheck_md():
    rng = np.random.default_rng(SEED)
    x, w, b = rng.standard_normal((2, 3, 4)), rng.standard_normal((4, 5)), rng.standard_normal(5)
    dy = rng.standard_normal((2, 3, 5))
    dx, dw, db = linear_backward(dy, linear_forward(x, w, b)[1])
    rows = sections.gradcheck_rows(weighted_sum(dy, linear_forward, x, w, b),
                                   [("linear: dx", dx, x), ("linear: dw", dw, w), ("linear: db", db, b)], H_STEP)
    # Keep activation inputs away from ReLU's corner at 0, where central differences straddle the kink.
    z = rng.standard_normal((3, 6))
    z[np.abs(z) < 0.1] += 0.3
    dz = rng.standard_normal(z.shape)
    for name, fwd, bwd in [("relu", relu_forward, relu_backward), ("gelu", gelu_forward, gelu_backward)]:
        rows += sections.gradcheck_rows(weighted_sum(dz, fwd, z), [(f"{name}: dx", bwd(dz, fwd(z)[1]), z)], H_STEP)
    return (f"f = Σ Y ⊙ dY for random inputs and dY (seed {SEED}). The ReLU inputs are kept at least 0.1 "
            "away from 0: there the function has a corner and central differences with step h see an average "
            "of both slopes.\n\n" + sections.gradcheck_table(rows))


def generate(context):
    return {"symbols": symbols_md(), "example": example_md(), "xavier": xavier_md(), "gradcheck": gradcheck_md()}
