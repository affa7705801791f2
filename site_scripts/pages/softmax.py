"""Generator of the Softmax & Cross-Entropy page's fragments."""

import numpy as np

from transformer.softmax import cross_entropy_backward, cross_entropy_forward, softmax_backward, softmax_forward

from .. import sections
from ..examples import H_STEP, SEED, TINY_IDS, TINY_TARGETS, default_note, default_run, illustrative, tiny


def example_md():
    ex = tiny()
    cfg, z = ex.cfg, ex.trace["logits"][0]
    p, _ = softmax_forward(z.copy())
    targets = np.array(TINY_TARGETS)
    loss, cache = cross_entropy_forward(z, targets)
    dz = cross_entropy_backward(1.0, cache)
    per_position = -np.log(p[np.arange(len(targets)), targets])
    return "\n".join([
        illustrative(f"The tiny model's logits for ids `{TINY_IDS}`, with targets `{TINY_TARGETS}`."),
        sections.array_md("logits z", z, row_label="position"),
        sections.array_md("p = softmax(z)", p, row_label="position"),
        sections.md_table(["position", "target", "p[target]", "−log p[target]"],
                          [[t, y, f"{p[t, y]:.4f}", f"{per_position[t]:.4f}"] for t, y in enumerate(targets)]),
        f"The loss is their mean, **{loss:.4f}**; a uniform guess over V = {cfg.vocab_size} tokens would give "
        f"log V = {np.log(cfg.vocab_size):.4f}. "
        + ("The untrained model does worse than uniform: its Xavier-initialised head already spreads the logits "
           f"(standard deviation {z.std():.2f} here), so it is confident at random, and confidence in the wrong "
           "token costs more than no opinion at all.\n" if loss > np.log(cfg.vocab_size) else
           "The untrained model is close to that uniform guess.\n"),
        sections.array_md("dz = (p − onehot(y)) / N", dz, row_label="position"),
        f"Each row of `dz` sums to {np.abs(dz.sum(axis=-1)).max():.1e} (0 up to rounding): the probabilities sum to "
        "1 and the one-hot target takes 1 away.\n",
    ])


def symbols_md():
    z = default_run().trace["logits"]
    targets = np.zeros(z.shape[:-1], dtype=np.int64)
    p, _ = softmax_forward(z.copy())
    _, cache = cross_entropy_forward(z, targets)
    dz = cross_entropy_backward(1.0, cache)
    rows = [
        (r"Z", "logits", z.shape),
        (r"P", "p, probs", p.shape),
        (r"y", "targets", targets.shape),
        (r"N", "n = t.size", f"{targets.size}"),
        (r"\mathcal{L}", "loss", "a float"),
        (r"\partial\ell/\partial Z", "dlogits", dz.shape, "with \\(\\ell = \\mathcal{L}\\)"),
    ]
    return sections.symbols_md(rows, default_note())


def gradcheck_md():
    rng = np.random.default_rng(SEED)
    z = rng.standard_normal((2, 3, 5))
    dp = rng.standard_normal(z.shape)
    analytic = softmax_backward(dp, softmax_forward(z.copy())[1])
    rows = sections.gradcheck_rows(lambda: float(np.sum(softmax_forward(z.copy())[0] * dp)),
                                   [("softmax: dz", analytic, z)], H_STEP)
    targets = rng.integers(0, 5, (2, 3))
    analytic = cross_entropy_backward(1.0, cross_entropy_forward(z, targets)[1])
    rows += sections.gradcheck_rows(lambda: cross_entropy_forward(z, targets)[0],
                                    [("cross-entropy: dlogits", analytic, z)], H_STEP)
    return (f"Softmax: f = Σ p ⊙ dp for random z (2 × 3 × 5) and dp; cross-entropy: f = the loss itself, random "
            f"targets (seed {SEED}).\n\n" + sections.gradcheck_table(rows))


def generate(context):
    return {"symbols": symbols_md(), "example": example_md(), "gradcheck": gradcheck_md()}
