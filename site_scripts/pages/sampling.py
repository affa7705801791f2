"""Generator of the Sampling page's fragments."""

import numpy as np

from transformer.generate import generate as generate_text
from transformer.generate import sample_next
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
        rows.append([f"τ = {temperature:g}" + (f", top-k {top_k}" if top_k else ""),
                     " ".join(f"{p:.3f}" for p in probs), " ".join(f"{c:.3f}" for c in counts),
                     f"{np.abs(probs - counts).max():.3f}"])
    return "\n".join([
        illustrative(f"The tiny model's logits for the token after ids `{TINY_IDS}`."),
        sections.array_md("logits (last position)", logits),
        f"The probabilities each setting gives, and the frequencies of {DRAWS} draws by `sample_next` "
        f"(seed {SEED}); with {DRAWS} draws a frequency lies within about ±{2 / np.sqrt(DRAWS):.3f} of its "
        "probability:\n",
        sections.md_table(["Setting", "P(token 0 .. V−1)", "Frequencies", "Largest difference"], rows),
        "Lower temperatures sharpen the distribution, higher ones flatten it; top-k removes all but the k "
        "most likely tokens; τ = 0 always takes the argmax.\n",
        f"`generate(params, cfg, {TINY_IDS}, 8, temperature=1.0, seed={SEED})` continues the ids with "
        f"`{generate_text(params, cfg, TINY_IDS, 8, temperature=1.0, seed=SEED)}` (the window slides once the text "
        f"is longer than T_max = {cfg.context_len}).\n",
    ])


def generate(context):
    return {"example": example_md()}
