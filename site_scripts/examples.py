"""The inputs the pages' examples share (the tiny illustrative model, the default configuration with a
small batch), and the few pieces of page text several generators repeat.

Illustrative numbers come from the real `init_params`; nothing here is learned.
"""

from dataclasses import dataclass

import numpy as np

from transformer.config import PRESETS, ModelConfig
from transformer.model import forward, init_params

SEED = 0
TINY_IDS = [2, 0, 2]
TINY_TARGETS = [0, 2, 1]
H_STEP = 1e-5
MOVE = 0.1  # biases_moved: how far every 1-D parameter moves, in standard normal units


@dataclass(frozen=True)
class Example:
    """A model as `init_params` builds it (seed SEED) and one forward pass of it."""
    cfg: ModelConfig
    params: dict
    ids: np.ndarray  # (B, T)
    trace: dict  # every intermediate of the forward pass, by `forward`'s names (embedding, b0.ln1, ...)


def example(cfg, ids):
    params = init_params(cfg, seed=SEED)
    trace = {}
    forward(params, ids, cfg, trace)
    return Example(cfg, params, ids, trace)


def tiny():
    """The tiny preset on one sequence, TINY_IDS."""
    return example(PRESETS["tiny"], np.array([TINY_IDS]))


def default_run():
    """The default config on B = 2 sequences of T = context_len / 2 tokens (sizes chosen to differ from
    each other and from d, so that a recorded shape names its axes)."""
    cfg = PRESETS["default"]
    return example(cfg, np.random.default_rng(SEED).integers(0, cfg.vocab_size, (2, cfg.context_len // 2)))


def sizes(cfg):
    """The sizes of a config in the Notation page's symbols, typeset."""
    return (f"\\(n_V\\) = {cfg.vocab_size}, \\(T_{{\\max}}\\) = {cfg.context_len}, \\(d\\) = {cfg.emb_dim}, "
            f"\\(H\\) = {cfg.num_heads}, \\(L\\) = {cfg.num_layers}, \\(F\\) = {cfg.ff_dim}")


def default_note(batch=True):
    """Where a symbol table's recorded shapes come from: default_run (or the default config alone)."""
    cfg = PRESETS["default"]
    text = f"the default config ({sizes(cfg)})"
    return text + (f" with a batch of \\(B\\) = 2 windows of \\(T\\) = {cfg.context_len // 2} tokens" if batch else "")


def biases_moved(params, rng):
    """A copy of the parameters with every 1-D one (biases, gains) moved by 0.1 × N(0, 1), so that their
    gradient terms count in a check (at initialisation they are exactly 0 or 1)."""
    return {k: v + MOVE * rng.standard_normal(v.shape) if v.ndim == 1 else v.copy() for k, v in params.items()}


def weighted_sum(dy, layer_forward, *args):
    """f = Σ layer_forward(*args)[0] ⊙ dy, as a function of no arguments for `numerical_grad` (which moves
    the arrays in args in place). Its gradient with respect to the output is dy, so the backward called
    with dy gives exactly its gradients."""
    return lambda: float(np.sum(layer_forward(*args)[0] * dy))


def collapsed(title, text):
    """Markdown text inside a note that opens on a click (pymdownx.details), for a table too long to show open."""
    return f'??? note "{title}"\n\n' + "\n".join("    " + line for line in text.splitlines()) + "\n"
