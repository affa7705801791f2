"""Generator of the Sampling page's fragments."""

import numpy as np

from transformer.generate import generate as generate_text
from transformer.generate import sample_next, sample_rows
from transformer.softmax import softmax_forward

from .. import sections
from ..examples import SEED, TINY_IDS, illustrative, tiny

DRAWS = 20_000


def example_md():
    ex = tiny()
    cfg, params, logits = ex.cfg, ex.params, ex.trace["logits"][0, -1]
    rows = []
    settings = [(1.0, None), (0.5, None), (2.0, None), (1.0, 2), (0.0, None)]
    for temperature, top_k in settings:
        if temperature == 0:
            probs = np.eye(cfg.vocab_size)[np.argmax(logits)]
        else:
            z = (logits - logits.max()) / temperature
            if top_k:
                z = np.where(z >= np.sort(z)[-top_k], z, -np.inf)
            probs, _ = softmax_forward(z)
        rng = np.random.default_rng(SEED)
        counts = np.bincount([sample_next(logits, temperature, top_k, rng) for _ in range(DRAWS)],
                             minlength=cfg.vocab_size) / DRAWS
        rows.append([f"\\(\\tau\\) = {temperature:g}" + (f", \\(k_{{\\mathrm{{top}}}}\\) = {top_k}" if top_k else ""),
                     " ".join(f"{p:.3f}" for p in probs), " ".join(f"{c:.3f}" for c in counts),
                     f"{np.abs(probs - counts).max():.3f}"])
    return "\n".join([
        illustrative(f"The tiny model's logits for the token after ids `{TINY_IDS}`."),
        sections.array_md("z (logits of the last position)", logits),
        f"The probabilities each setting gives, and the frequencies of {DRAWS} draws by `sample_next` "
        f"(seed {SEED}); with {DRAWS} draws a frequency lies within about ±{2 / np.sqrt(DRAWS):.3f} of its "
        "probability:\n",
        sections.md_table(["Setting", f"\\(p_j\\), \\(j\\) = 0 … {cfg.vocab_size - 1}", "Frequencies",
                           "Largest difference"], rows),
        "Lower temperatures sharpen the distribution, higher ones flatten it; top-k removes all but the "
        "\\(k_{\\mathrm{top}}\\) most likely tokens; \\(\\tau\\) = 0 always takes the argmax.\n",
        rows_together_md(logits),
        f"`generate(params, cfg, {TINY_IDS}, 8, temperature=1.0, seed={SEED})` continues the ids with "
        f"`{generate_text(params, cfg, TINY_IDS, 8, temperature=1.0, seed=SEED)}` (the window slides once the text "
        f"is longer than \\(T_{{\\max}}\\) = {cfg.context_len}).\n",
    ])


def rows_together_md(logits, rows=4, rounds=25):
    """Several rows drawn in one pass by sample_rows against each row alone by sample_next."""
    batch = np.stack([logits * (1 + r / 2) for r in range(rows)])  # rows that differ, as requests' would
    together = [np.random.default_rng(SEED + r) for r in range(rows)]
    alone = [np.random.default_rng(SEED + r) for r in range(rows)]
    same = sum(sample_rows(batch, 0.8, 3, together) == [sample_next(z, 0.8, 3, g) for z, g in zip(batch, alone)]
               for _ in range(rounds))
    if same != rounds:
        raise RuntimeError(f"sample_rows drew other tokens than sample_next in {rounds - same} of {rounds} rounds")
    return (f"`sample_next` is `sample_rows` for one row. The scheduler that decodes several requests together "
            f"draws their tokens with one call of `sample_rows` per setting of temperature and top-k, each row "
            f"with its own request's generator; every step before the draw works row by row, so each row gets the token it would get alone. Here "
            f"{rows} rows drawn together {rounds} times (\\(\\tau\\) = 0.8, \\(k_{{\\mathrm{{top}}}}\\) = 3) gave, in "
            f"all {rounds} rounds, exactly the tokens `sample_next` drew from each row alone with a generator of "
            "the same seed.\n")


def symbols_md():
    ex = tiny()
    logits = ex.trace["logits"][0, -1]
    rows = [
        (r"z", "logits", logits.shape, "the next position's"),
        (r"j", "token = sample_next(...)", "index", "the drawn token"),
        (r"\tau", "temperature", "float, ≥ 0"),
        (r"k_{\mathrm{top}}", "top_k", "int in [1, n_V], or None for all"),
        (r"p", "probs", softmax_forward(logits)[0].shape, "what the token is drawn from"),
    ]
    return sections.symbols_md(rows, "the tiny model's last position")


def generate(context):
    return {"symbols": symbols_md(), "example": example_md()}
