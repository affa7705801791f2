"""The inputs the pages' examples share: the tiny illustrative model, and the
default configuration with the training batch size.

Illustrative numbers come from the real `init_params`; nothing here is learned.
"""

import numpy as np

from transformer.config import PRESETS
from transformer.model import forward, init_params

SEED = 0
TINY_IDS = [2, 0, 2]
TINY_TARGETS = [0, 2, 1]
H_STEP = 1e-5


def tiny():
    """(cfg, params, ids (1, T)) of the tiny preset."""
    cfg = PRESETS["tiny"]
    return cfg, init_params(cfg, seed=SEED), np.array([TINY_IDS])


def tiny_sizes(cfg):
    return (f"V = {cfg.vocab_size}, T_max = {cfg.context_len}, d = {cfg.emb_dim}, H = {cfg.num_heads}, "
            f"L = {cfg.num_layers}, F = {cfg.ff_dim}")


def illustrative(text):
    """The admonition that labels a tiny example as illustrative."""
    cfg = PRESETS["tiny"]
    return (f'!!! example "Illustrative: the tiny model built by the real `init_params` (seed {SEED}), '
            f'not learned values"\n    Sizes: {tiny_sizes(cfg)}. {text}\n')


def tiny_trace(cfg=None, params=None, ids=None):
    """Every intermediate of the tiny model's forward on TINY_IDS."""
    if cfg is None:
        cfg, params, ids = tiny()
    trace = {}
    forward(params, ids, cfg, trace)
    return trace


def default_run():
    """(cfg, B, T, trace) at the default config, on B = 2 sequences of T = context_len / 2 tokens
    (sizes chosen to differ from each other and from d, so that a recorded shape names its axes)."""
    cfg = PRESETS["default"]
    B, T = 2, cfg.context_len // 2
    ids = np.random.default_rng(SEED).integers(0, cfg.vocab_size, (B, T))
    trace = {}
    forward(init_params(cfg, seed=SEED), ids, cfg, trace)
    return cfg, B, T, trace


def default_note(batch=True):
    cfg = PRESETS["default"]
    text = (f"the default config (V = {cfg.vocab_size}, T_max = {cfg.context_len}, d = {cfg.emb_dim}, "
            f"H = {cfg.num_heads}, L = {cfg.num_layers}, F = {cfg.ff_dim})")
    return text + (f" with a batch of B = 2 sequences of T = {cfg.context_len // 2} tokens" if batch else "")
