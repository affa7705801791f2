"""The KV cache page's paged parts: two requests decoded together over one pool of pages (its picture of the pool
and the page tables, when each page was leased), bytes held per position, and the paged symbols; and the default
config's sizes, which the KV cache and Serving pages show.

Everything is read off a real run: `prefill` of each prompt, then batched `decode_batch` steps, over one
`PagePool`. Nothing here types a page number or a byte count.
"""

import sys
from dataclasses import dataclass

import numpy as np

from transformer.config import PRESETS
from transformer.generate import decode_batch, decode_block, decode_step, prefill
from transformer.kv_cache import KVCache, PagedCache, PagePool
from transformer.model import forward, init_params

from .. import sections
from ..examples import SEED
from ..figures import new_figure, png

PAGE_SIZE = 4  # small, so that the default context of 32 positions spans several pages
PROMPTS = (6, 2)  # prompt lengths of requests A and B: they start at different positions
STEPS = 7  # batched decoding steps after the two prefills
NAMES = "AB"
COLORS = {"A": "tab:blue", "B": "tab:orange"}


def sizes(cfg):
    """A config's sizes, for the prose to show in the Notation page's symbols."""
    return {"n_v": cfg.vocab_size, "t_max": cfg.context_len, "d": cfg.emb_dim, "h": cfg.num_heads,
            "l": cfg.num_layers, "f": cfg.ff_dim}


@dataclass
class TwoRequests:
    """The run: its config, parameters and pool, each request's ids and cache, the page tables after each
    phase (prefill, then every batched step), and every request's logits (from its prefill, then from each
    batched step) with the largest gap of each request's to a full forward over its own ids."""
    cfg: object
    params: dict
    pool: PagePool
    ids: list  # per request, every id fed
    caches: list
    tables: list  # (phase label, [page table of A, of B]) after each phase
    logits: list  # per request, (steps, n_V)
    gaps: list  # per request, the largest gap of its logits to a full forward over its own ids


def two_requests(steps=STEPS):
    cfg = PRESETS["default"]
    params = init_params(cfg, seed=SEED)
    rng = np.random.default_rng(SEED)
    ids = [rng.integers(0, cfg.vocab_size, n + steps).tolist() for n in PROMPTS]
    pool = PagePool(cfg, 2 * cfg.context_len // PAGE_SIZE, PAGE_SIZE, np.float64)
    caches = [PagedCache(pool, cfg.context_len) for _ in PROMPTS]
    logits = [[prefill(params, own[:n], cache, cfg)] for own, n, cache in zip(ids, PROMPTS, caches)]
    tables = [("prefill", [list(c.pages) for c in caches])]
    for step in range(steps - 1):
        rows = decode_batch(params, [own[n + step] for own, n in zip(ids, PROMPTS)], caches, cfg)
        for mine, row in zip(logits, rows):
            mine.append(row)
        tables.append((f"step {step + 1}", [list(c.pages) for c in caches]))
    logits = [np.array(mine) for mine in logits]
    gaps = []
    for own, n, mine in zip(ids, PROMPTS, logits):
        full = forward(params, np.array(own[:n + steps - 1]), cfg)[0][n - 1:]  # rows of the positions decoded
        gaps.append(float(np.abs(mine - full).max()))
    return TwoRequests(cfg, params, pool, ids, caches, tables, logits, gaps)


def alone_gap(run):
    """Largest gap between the batched steps' logits and each request decoded alone, one `decode_step` at a time
    into a contiguous cache: the batched step's attention against the single-request one."""
    worst = 0.0
    for own, n, mine in zip(run.ids, PROMPTS, run.logits):
        cache = KVCache(run.cfg, np.float64)
        prefill(run.params, own[:n], cache, run.cfg)
        alone = [decode_step(run.params, token, cache, run.cfg) for token in own[n:n + len(mine) - 1]]
        worst = max(worst, float(np.abs(mine[1:] - np.array(alone)).max()))
    return worst


def leased_at(run):
    """physical page -> (request, logical page, the phase that leased it), in leasing order."""
    out = {}
    for label, tables in run.tables:
        for name, table in zip(NAMES, tables):
            for logical, page in enumerate(table):
                out.setdefault(page, (name, logical, label))
    return out


def contiguous_gap(run):
    """Largest gap between what the pages hold (gathered in logical order) and a contiguous cache filled with the
    same ids: the page table must put every position back where it belongs."""
    worst = 0.0
    for own, cache in zip(run.ids, run.caches):
        plain = KVCache(run.cfg, np.float64)
        prefill(run.params, own[:cache.length], plain, run.cfg)
        for layer in range(run.cfg.num_layers):
            for paged, flat in zip(cache.read(layer, cache.length), plain.read(layer, cache.length)):
                worst = max(worst, float(np.abs(paged - flat).max()))
    return worst


def positions_held(cache, logical):
    """The first and last position of a request that its logical page holds."""
    return logical * PAGE_SIZE, min((logical + 1) * PAGE_SIZE, cache.length) - 1


def layout(run):
    """Where the picture draws each box: per request, its page-table entries (logical page, physical page, first
    and last position); and per physical page of the pool (the blank one last), its owner or None."""
    tables = {name: [(logical, page, *positions_held(cache, logical)) for logical, page in enumerate(cache.pages)]
              for name, cache in zip(NAMES, run.caches)}
    owners = {page: (name, logical) for page, (name, logical, _) in leased_at(run).items()}
    pool = [owners.get(page) for page in range(run.pool.num_pages + 1)]
    return tables, pool


def pages_png(run):
    """The pool of pages as a row of boxes (who holds each, which positions), and above it each request's page
    table, one box per logical page with an arrow to the physical page that holds it."""
    from matplotlib.patches import Rectangle

    tables, pool = layout(run)
    fig, ax = new_figure(figsize=(12, 4.4))
    for page, owner in enumerate(pool):
        blank = page == run.pool.blank
        face = COLORS[owner[0]] if owner else "0.85" if blank else "white"
        ax.add_patch(Rectangle((page, 0), 0.9, 1, facecolor=face, edgecolor="black", alpha=0.6 if owner else 1,
                               hatch="//" if blank else None))
        label = "blank" if blank else "free" if owner is None else "{}\nt {}–{}".format(
            owner[0], *positions_held(run.caches[NAMES.index(owner[0])], owner[1]))
        ax.text(page + 0.45, 0.5, label, ha="center", va="center", fontsize=8,
                bbox={"facecolor": "white", "edgecolor": "none", "pad": 1} if blank else None)
    x0, y = 0.0, 2.2
    for name in NAMES:
        ax.text(x0, y + 1.15, f"request {name}: π = {[page for _, page, _, _ in tables[name]]}", fontsize=9)
        for logical, page, first, last in tables[name]:
            x = x0 + 1.5 * logical
            ax.add_patch(Rectangle((x, y), 1.3, 1, facecolor=COLORS[name], alpha=0.6, edgecolor="black"))
            ax.text(x + 0.65, y + 0.5, f"π[{logical}] = {page}\nt {first}–{last}", ha="center", va="center",
                    fontsize=8)
            ax.annotate("", xy=(page + 0.45, 1.0), xytext=(x + 0.65, y),
                        arrowprops={"arrowstyle": "->", "color": COLORS[name], "alpha": 0.8})
        x0 += 1.5 * len(tables[name]) + 1.5
    ax.set_xlim(-0.3, len(pool) + 0.2)
    ax.set_ylim(-0.2, 3.8)
    ax.set_yticks([0.5, 2.7], ["pool", "page tables"])
    ax.set_xticks([page + 0.45 for page in range(len(pool))], [str(page) for page in range(len(pool))])
    ax.set_xlabel("physical page of the pool (its number)")
    ax.set_ylabel("page tables and the pool")
    ax.set_title("two requests' positions in one pool of pages, after their last batched step")
    return png(fig)


def pages():
    """The two-request run: its picture, the lease table, and the values the prose reads."""
    run = two_requests()
    rows = [[page, f"{name}, logical page {logical}", f"{logical * PAGE_SIZE}-{(logical + 1) * PAGE_SIZE - 1}", when]
            for page, (name, logical, when) in leased_at(run).items()]
    table = sections.md_table(["physical page", "holds", "positions", "leased at"], rows)
    values = {"pages": run.pool.num_pages, "size": PAGE_SIZE, "prompt_a": PROMPTS[0], "prompt_b": PROMPTS[1],
              "steps": STEPS - 1, "length_a": run.caches[0].length, "length_b": run.caches[1].length,
              "table_a": run.caches[0].pages, "table_b": run.caches[1].pages, "free": len(run.pool.free),
              "blank": run.pool.blank, "contiguous_gap": contiguous_gap(run), "forward_gap": max(run.gaps),
              "alone_gap": alone_gap(run), "sizes": sizes(run.cfg)}
    return pages_png(run), table, values


def lengths(T, S):
    """Lengths at which to weigh a request's cache: one position, a full page, one past it, half, all."""
    return sorted({1, S, S + 1, T // 2 + 1, T})


def held_bytes():
    """Bytes a request's cache holds by positions filled, contiguous and paged: the table, and its values."""
    cfg, S = PRESETS["default"], PAGE_SIZE
    pool = PagePool(cfg, cfg.context_len // S, S, np.float64)
    contiguous = KVCache(cfg, np.float64).nbytes
    rows = []
    for n in lengths(cfg.context_len, S):
        paged = PagedCache(pool, cfg.context_len)
        paged.reserve(n)
        rows.append([n, f"{contiguous:,}", f"{contiguous / n:,.0f}", len(paged.pages), f"{paged.nbytes:,}",
                     f"{paged.nbytes / n:,.0f}"])
        paged.release()
    table = sections.md_table(["positions filled", "contiguous: bytes", "per position", "pages leased",
                               "paged: bytes", "per position"], rows)
    return table, {"per_position": contiguous // cfg.context_len, "size": S, "blank": pool.keys[0][0].nbytes,
                   "sizes": sizes(cfg)}


def profiled(call, profile):
    """Run call() with `profile` as the interpreter's profile function (sys.setprofile), then restore it."""
    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(previous)


def locals_at_return(call, *functions):
    """The local variables of each of `functions` as it returns during `call()` (its last return), one dict
    per function, in order."""
    seen = [{} for _ in functions]
    codes = [f.__code__ for f in functions]

    def profile(frame, event, arg):
        if event == "return" and frame.f_code in codes:
            seen[codes.index(frame.f_code)].update(frame.f_locals)
    profiled(call, profile)
    return seen


def symbol_rows():
    """The paged symbols, recorded on a batched step of the two requests (after their prefills)."""
    run = two_requests(steps=2)
    tokens = [own[n + 1] for own, n in zip(run.ids, PROMPTS)]
    inside, block = locals_at_return(lambda: decode_batch(run.params, tokens, run.caches, run.cfg),
                                     decode_batch, decode_block)
    keys = block["keys"]  # what the step attended over, in its last block
    pool, table = run.pool, run.caches[0].pages
    return [
        (r"S_{\mathrm{page}}", "pool.page_size", "int", f"{pool.page_size}"),
        (r"N_{\mathrm{page}}", "pool.num_pages", "int", f"{pool.num_pages}"),
        (r"\pi", "cache.pages", (len(table),), f"request A's, `{table}`"),
        (r"K_{\mathrm{pool}}, V_{\mathrm{pool}}", "pool.keys[l], pool.values[l]", pool.keys[0].shape,
         f"the blank page is page {pool.blank}"),
        (r"t_w", "positions[w]", inside["positions"].shape,
         f"`positions` holds every request's: {inside['positions'].tolist()}"),
        (r"\mathcal{M}", "own", inside["own"].shape,
         f"\\(B\\) = {len(tokens)} requests; the keys it masks, all requests' gathered side by side and padded "
         f"to the longest, have shape {sections.shape_text(keys.shape)}"),
    ]
