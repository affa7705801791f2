"""The cache inventory: each cache the model's forward returns and its backward reads, what it holds, where
it is built and read, its shapes and its bytes, for the memory policies of tools/memory_policies.py. Every
entry comes from running the real forward and backward (site_scripts/cache_walk.py); the Full Model page
shows it (site_scripts/pages/_model_cache.py).
"""

from functools import lru_cache

import numpy as np

from transformer.config import PRESETS, ModelConfig

from . import sections
from .cache_walk import inventory
from .common import md_table
from .examples import SEED, default_run

RUNS = ("materialized", "flash", "checkpointed")  # policies of tools/memory_policies.py
LONG_T = 1024  # the long run: the default config with context_len = LONG_T, one sequence that long
# Sizes unlike each other, so that a shape recorded with them reads back as symbols (d = H d_h, BT = B T).
SYMBOLIC = ModelConfig(vocab_size=17, context_len=13, emb_dim=14, num_heads=2, num_layers=1, ff_dim=11)
SYMBOLIC_BT = (3, 5)
SYMBOLS = {3: "B", 5: "T", 15: "BT", 17: "n_V", 13: r"T_{\max}", 14: "d", 2: "H", 7: "d_h", 11: "F", 42: "3d",
           1: "1"}


def long_config():
    return PRESETS["default"].with_(context_len=LONG_T)


@lru_cache(maxsize=None)
def runs_of(policy):
    """(default run, long run, symbolic run) of one policy, each (caches, owned bytes of the whole cache)."""
    ex = default_run()
    dtype = ex.params["tok_emb"].dtype
    long_ids = np.random.default_rng(SEED).integers(0, ex.cfg.vocab_size, (1, LONG_T))
    symbolic_ids = np.random.default_rng(SEED).integers(0, SYMBOLIC.vocab_size, SYMBOLIC_BT)
    return (inventory(policy, ex.cfg, ex.ids, dtype), inventory(policy, long_config(), long_ids, dtype),
            inventory(policy, SYMBOLIC, symbolic_ids, dtype))


def symbolic(shape):
    return r"\((" + ", ".join(SYMBOLS[n] for n in shape) + ("," if len(shape) == 1 else "") + r")\)"


def size_text(n):
    """Bytes, exactly, with a KiB or MiB reading beside them."""
    if n >= 1 << 20:
        return f"{n:,} ({n / (1 << 20):.2f} MiB)"
    return f"{n:,} ({n / 1024:.1f} KiB)" if n >= 1024 else f"{n:,}"


def holds_text(f, sym):
    """One field of a cache, with its shape in symbols and at the default run, and how its bytes count."""
    if f.inner:
        many = f", a list of {f.items} caches, one per block" if f.items else ", a cache"
        return f"`{f.name}`{many} (row `{f.inner}`)"
    if f.shape is None:
        return f"`{f.name}` = {f.text}"
    text = f"`{f.name}` {symbolic(sym.shape)} {sections.shape_text(f.shape)}"
    if f.parameter:
        return text + ", a parameter (not counted)"
    if f.shared_with:
        return text + f", the buffer of `{f.shared_with.split('.')[-1]}` (counted there)"
    if f.base_shape is not None:
        return text + f", a view: keeps its whole {symbolic(sym.base_shape)} buffer alive"
    return text


def place_link(page, place, repo_url):
    """file:line, linked to the line in the function's listing on the site, else to the source."""
    text = f"`{place.path.removeprefix('transformer/')}:{place.line}`"
    if sections.function_page(place.path, place.function) is None:
        return f"[{text}]({sections.source_url(repo_url, place.path, place.line)})"
    return f"[{text}]({sections.function_link(page, place.path, place.function, place.line)})"


def unbatched(policy):
    """The bytes of the long run that have no batch axis, so do not grow with B."""
    (long, _), (sym, _) = runs_of(policy)[1:]
    return sum(f.charged for c, c_sym in zip(long, sym, strict=True) for f, fs in zip(c.fields, c_sym.fields, strict=True)
               if f.charged and not {"B", "BT"} & {SYMBOLS[n] for n in fs.base_shape or fs.shape})


def policy_text(policy):
    from tools.memory_policies import POLICIES

    fields = ", ".join(f"{k}={v!r}" for k, v in POLICIES[policy].items())
    return f"`ModelConfig({fields})`" if fields else "the default `ModelConfig`"


def comparison_table(runs):
    """The runs' totals side by side, each against the first run's at T = LONG_T."""
    totals = [(policy, short, long) for policy in runs for (_, short), (_, long) in [runs_of(policy)[:2]]]
    first = totals[0][2]
    rows = [[policy, size_text(short), size_text(long), f"{long / first:.3f}"] for policy, short, long in totals]
    return md_table(["Policy", "Bytes, default run", f"Bytes, \\(T\\) = {LONG_T}",
                     f"Of the {runs[0]} run's, at \\(T\\) = {LONG_T}"], rows)
