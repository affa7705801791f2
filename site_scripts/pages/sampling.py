"""Generator of the Sampling page: the values its prose shows (docs/generation/sampling.md binds them), its tables
and its picture. Every distribution is the tiny model's real next-token logits through the page's equations, set
beside the frequencies of the real `sample_next`."""

import numpy as np

from transformer.generate import generate as generate_text
from transformer.generate import sample_next, sample_rows
from transformer.softmax import softmax_forward

from .. import sections
from ..examples import SEED, TINY_IDS, tiny
from ..figures import new_figure, png

DRAWS = 20_000
SETTINGS = ((1.0, None), (0.5, None), (2.0, None), (1.0, 2), (0.0, None))  # (τ, k_top) of the example
ROWS, ROUNDS, ROWS_TEMPERATURE, ROWS_TOP_K = 4, 25, 0.8, 3  # several rows drawn together
CONTINUED = 8  # tokens `generate` adds to the tiny ids


def probabilities(logits, temperature, top_k):
    """p from the page's equations: the row shifted by its largest entry and divided by τ, top-k, softmax;
    τ = 0 puts all the mass on the argmax."""
    if temperature == 0:
        return np.eye(len(logits))[np.argmax(logits)]
    z = (logits - logits.max()) / temperature
    if top_k:
        z = np.where(z >= np.sort(z)[-top_k], z, -np.inf)
    return softmax_forward(z)[0]


def setting_text(temperature, top_k):
    return f"\\(\\tau\\) = {temperature:g}" + (f", \\(k_{{\\mathrm{{top}}}}\\) = {top_k}" if top_k else "")


def example():
    """The tiny model's last logits, what each setting makes of them, and DRAWS draws of sample_next for each."""
    ex = tiny()
    cfg, logits = ex.cfg, ex.trace["logits"][0, -1]
    rows, found = [], {}
    for temperature, top_k in SETTINGS:
        probs = probabilities(logits, temperature, top_k)
        rng = np.random.default_rng(SEED)
        counts = np.bincount([sample_next(logits, temperature, top_k, rng) for _ in range(DRAWS)],
                             minlength=cfg.vocab_size) / DRAWS
        found[temperature, top_k] = (probs, counts)
        rows.append([setting_text(temperature, top_k), " ".join(f"{p:.3f}" for p in probs),
                     " ".join(f"{c:.3f}" for c in counts), f"{np.abs(probs - counts).max():.3f}"])
    tables = {"logits": sections.array_md("z (logits of the last position)", logits),
              "draws": sections.md_table(["Setting", f"\\(p_j\\), \\(j\\) = 0 … {cfg.vocab_size - 1}", "Frequencies",
                                          "Largest difference"], rows)}
    values = {"sizes": {"n_v": cfg.vocab_size, "t_max": cfg.context_len, "d": cfg.emb_dim, "h": cfg.num_heads,
                        "l": cfg.num_layers, "f": cfg.ff_dim},
              "draws": DRAWS, "bound": 2 / np.sqrt(DRAWS),
              "worst": max(float(np.abs(p - c).max()) for p, c in found.values()),
              "top": {name: {"tau": t, "p": float(found[t, None][0].max())}
                      for name, t in (("low", 0.5), ("mid", 1.0), ("high", 2.0))}, "top_k": SETTINGS[3][1],
              "argmax": int(np.argmax(logits)), "continued": CONTINUED,
              "text": generate_text(ex.params, cfg, TINY_IDS, CONTINUED, temperature=1.0, seed=SEED)}
    return logits, found, tables, values


def rows_together(logits, rows=ROWS, rounds=ROUNDS):
    """Several rows drawn in one pass by sample_rows against each row alone by sample_next: the rounds in which
    every row got the same token both ways."""
    batch = np.stack([logits * (1 + r / 2) for r in range(rows)])  # rows that differ, as requests' would
    together = [np.random.default_rng(SEED + r) for r in range(rows)]
    alone = [np.random.default_rng(SEED + r) for r in range(rows)]
    same = sum(sample_rows(batch, ROWS_TEMPERATURE, ROWS_TOP_K, together)
               == [sample_next(z, ROWS_TEMPERATURE, ROWS_TOP_K, g) for z, g in zip(batch, alone)]
               for _ in range(rounds))
    return {"rows": rows, "rounds": rounds, "same": int(same), "temperature": ROWS_TEMPERATURE, "top_k": ROWS_TOP_K}


def picture_png(found, vocab_size):
    """p for each setting of the example as grouped bars, one group per token."""
    shown = [s for s in SETTINGS if s[0] != 0]
    width = 0.8 / len(shown)
    fig, ax = new_figure(figsize=(9, 3.6))
    for i, (temperature, top_k) in enumerate(shown):
        probs = found[temperature, top_k][0]
        label = f"τ = {temperature:g}" + (f", top-k = {top_k}" if top_k else "")
        ax.bar(np.arange(vocab_size) + (i - (len(shown) - 1) / 2) * width, probs, width, label=label)
    ax.set_xticks(range(vocab_size))
    ax.set_xlabel("token j (vocabulary entry)")
    ax.set_ylabel("probability p_j of drawing it")
    ax.set_title("the tiny model's next-token distribution under each setting")
    ax.legend(fontsize="small")
    return png(fig)


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
    logits, found, tables, values = example()
    values = {"seed": SEED, "ids": TINY_IDS, "example": values, "together": rows_together(logits)}
    return {"values": values, "distributions.png": picture_png(found, len(logits)), **tables,
            "symbols": symbols_md()}
