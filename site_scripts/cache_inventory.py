"""The cache inventory: each cache the model's forward returns and its backward reads, what it holds, where
it is built and read, its shapes and its bytes, for the memory policies of tools/memory_policies.py. Every
entry comes from running the real forward and backward (site_scripts/cache_walk.py).

A page generator calls `inventory_md(page, repo_url)`; `runs` picks the policies and `caches` the rows (by
the start of their path, e.g. "block_caches[l].attn_cache" for attention's caches alone).
"""

from functools import lru_cache

import numpy as np

from transformer.config import PRESETS, ModelConfig

from . import sections
from .cache_walk import inventory
from .common import md_table
from .examples import SEED, default_note, default_run

RUNS = ("materialized", "flash", "checkpointed")  # policies of tools/memory_policies.py
ATTENTION = ("block_caches[l].attn_cache",)  # `caches` for attention's rows alone (its cache and those inside)
BLOCKS = ("block_caches[l]",)  # `caches` for the blocks' rows
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


def chosen(caches, prefixes):
    return [c for c in caches if picked(c, prefixes)]


def picked(c, prefixes):
    return prefixes is None or c.path.startswith(tuple(prefixes))


def run_table(page, policy, repo_url, prefixes=None):
    """One policy's inventory: a row per cache, with its bytes at the default run and at T = LONG_T."""
    (short, short_total), (long, long_total), (sym, _) = runs_of(policy)
    rows = []
    for c, c_long, c_sym in zip(short, long, sym, strict=True):
        if not picked(c, prefixes):
            continue
        holds = "; ".join(holds_text(f, fs) for f, fs in zip(c.fields, c_sym.fields, strict=True))
        times = f" × {c.count}" if c.count > 1 else ""
        rows.append([f"`{c.path}`{times}", holds, f"`{c.built.function}`, {place_link(page, c.built, repo_url)}",
                     f"`{c.read.function}`, {place_link(page, c.read, repo_url)}", size_text(c.charged),
                     size_text(c_long.charged)])
    if prefixes is None:
        rows.append(["**All of it**", "", "", "", f"**{size_text(short_total)}**", f"**{size_text(long_total)}**"])
    return md_table(["Passed as", "Holds", "Built at", "Read at", "Bytes, default run", f"Bytes, \\(T\\) = {LONG_T}"],
                    rows)


def scaling_text(policy, prefixes=None):
    """How the long run's bytes grow with B: only arrays with a batch axis do."""
    (long, _), (sym, _) = runs_of(policy)[1:]
    fixed, names = 0, []
    for c, c_sym in zip(long, sym, strict=True):
        if picked(c, prefixes):
            for f, fs in zip(c.fields, c_sym.fields, strict=True):
                shape = fs.base_shape or fs.shape
                if f.charged and not {"B", "BT"} & {SYMBOLS[n] for n in shape}:
                    fixed += f.charged
                    names.append(f"`{c.path}.{f.name}`")
    if not fixed:
        return f"For \\(B\\) sequences of \\(T\\) = {LONG_T} instead of one, multiply all of these bytes by \\(B\\)."
    return (f"For \\(B\\) sequences of \\(T\\) = {LONG_T} instead of one, multiply all but {size_text(fixed)} of "
            f"these bytes by \\(B\\): {', '.join(names)} {'has' if len(names) == 1 else 'have'} no batch axis.")


def policy_text(policy):
    from tools.memory_policies import POLICIES

    fields = ", ".join(f"{k}={v!r}" for k, v in POLICIES[policy].items())
    return f"`ModelConfig({fields})`" if fields else "the default `ModelConfig`"


def comparison_table(runs, prefixes=None):
    """The runs' totals side by side, each against the first run's at T = LONG_T."""
    totals = []
    for policy in runs:
        short, long = (sum(c.charged for c in chosen(caches, prefixes)) for caches, _ in runs_of(policy)[:2])
        totals.append((policy, short, long))
    first = totals[0][2]
    rows = [[policy, size_text(short), size_text(long), f"{long / first:.3f}"] for policy, short, long in totals]
    return md_table(["Policy", "Bytes, default run", f"Bytes, \\(T\\) = {LONG_T}",
                     f"Of the {runs[0]} run's, at \\(T\\) = {LONG_T}"], rows)


def inventory_md(page, repo_url, runs=RUNS, caches=None):
    """The inventory of each policy in `runs`, limited to the caches whose path starts with one of `caches`
    (None: all of them), then the totals side by side."""
    ex, long = default_run(), long_config()
    whole = ("Together the rows make up `owned_bytes` of `forward`'s whole cache, what `tools/memory_policies.py` "
             "reports as retained" if caches is None else "These rows are part of `forward`'s cache, whose other "
             f"rows and totals the [Full Model]({sections.page_link(page, 'model', 'cache-inventory')}) page shows")
    out = [f"The default run is {default_note()}, in {ex.params['tok_emb'].dtype}; the long run is the same "
           f"config with \\(T_{{\\max}}\\) = {long.context_len} and one sequence of \\(T\\) = {LONG_T} tokens. "
           "Shapes are written in symbols (read back from a run with sizes unlike each other) and as recorded in "
           "the default run. A buffer is counted once, at the first field that holds it (a view keeps, and counts, "
           "the whole array it looks into); the parameters are left out, since the caches only refer to them. "
           f"A block's row adds up its {ex.cfg.num_layers} blocks. {whole}; the build stops if the rows of the "
           "whole cache do not add up to it, or if a built-at line does not make its cache.\n"]
    for policy in runs:
        out.append(f"**{policy.capitalize()}**, {policy_text(policy)}:\n\n" + run_table(page, policy, repo_url, caches)
                   + "\n" + scaling_text(policy, caches) + "\n")
    if len(runs) > 1:
        out.append("The totals side by side:\n\n" + comparison_table(runs, caches))
    return "\n".join(out)
