"""The KV cache page's paged fragments: two requests decoded together over one pool of pages, the diagram of
which logical page sits in which physical page, bytes held per token, and the paged symbols.

Everything is read off a real run: `prefill` of each prompt, then batched `decode_batch` steps, over one
`PagePool`. Nothing here types a page number or a byte count.
"""

import sys
from dataclasses import dataclass

import numpy as np

from transformer.config import PRESETS
from transformer.generate import decode_batch, decode_block, prefill
from transformer.kv_cache import KVCache, PagedCache, PagePool
from transformer.model import forward, init_params

from .. import sections
from ..examples import SEED, default_note

PAGE_SIZE = 4  # small, so that the default context of 32 positions spans several pages
PROMPTS = (6, 2)  # prompt lengths of requests A and B: they start at different positions
STEPS = 7  # batched decoding steps after the two prefills
NAMES = "AB"


@dataclass
class TwoRequests:
    """The run: its config, parameters and pool, each request's ids and cache, the page tables after each
    phase (prefill, then every batched step), and every request's logits beside a full forward's."""
    cfg: object
    params: dict
    pool: PagePool
    ids: list  # per request, every id fed
    caches: list
    tables: list  # (phase label, [page table of A, of B]) after each phase
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
    gaps = []
    for own, n, mine in zip(ids, PROMPTS, logits):
        full = forward(params, np.array(own[:n + steps - 1]), cfg)[0][n - 1:]  # rows of the positions decoded
        gaps.append(float(np.abs(np.array(mine) - full).max()))
    return TwoRequests(cfg, params, pool, ids, caches, tables, gaps)


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


def diagram_md(run):
    """A mermaid flowchart: each request's logical pages, each pointing at the physical page that holds it."""
    S, lines = PAGE_SIZE, ["```mermaid", "flowchart LR"]
    for name, cache in zip(NAMES, run.caches):
        lines.append(f'  subgraph {name}["request {name}: {cache.length} positions"]')
        for logical in range(len(cache.pages)):
            last = min((logical + 1) * S, cache.length) - 1
            lines.append(f'    {name}{logical}["logical page {logical}<br/>positions {logical * S}-{last}"]')
        lines.append("  end")
    lines.append('  subgraph pool["pool: physical pages"]')
    for page in sorted(leased_at(run)):
        lines.append(f'    P{page}["page {page}"]')
    lines.append("  end")
    for name, cache in zip(NAMES, run.caches):
        lines += [f"  {name}{logical} --> P{page}" for logical, page in enumerate(cache.pages)]
    return "\n".join(lines + ["```", ""])


def pages_md():
    run = two_requests()
    leases = leased_at(run)
    rows = [[page, f"{name}, logical page {logical}", f"{logical * PAGE_SIZE}-{(logical + 1) * PAGE_SIZE - 1}", when]
            for page, (name, logical, when) in leases.items()]
    free = len(run.pool.free)
    a, b = (c.pages for c in run.caches)
    return (f"Two requests over one pool of {run.pool.num_pages} pages of \\(S_{{\\mathrm{{page}}}}\\) = {PAGE_SIZE} "
            f"positions, at {default_note(batch=False)}: request A's prompt has {PROMPTS[0]} ids, B's {PROMPTS[1]}; "
            f"each is prefilled, then both are decoded together for {STEPS - 1} batched steps. The diagram is the "
            "page tables at the end of that run:\n\n" + diagram_md(run)
            + f"\nA's table is `{a}` and B's `{b}`: a request's pages are not adjacent in the pool; each is whichever "
              "page was free when the request first needed it. When each was leased:\n\n"
            + sections.md_table(["physical page", "holds", "positions", "leased at"], rows)
            + f"\n{free} pages are still free. Read back through the page tables, the keys and values of every block "
              f"differ from those of a contiguous cache filled with the same ids by at most "
              f"{sections.gap_text(contiguous_gap(run))}, and each request's logits at every step differ from a "
              f"full `forward` over its own ids by at most {sections.gap_text(max(run.gaps))} (float64): the "
              "batched step attends to each request's own positions only.\n")


def lengths(T, S):
    """Lengths at which to weigh a request's cache: one position, a full page, one past it, half, all."""
    return sorted({1, S, S + 1, T // 2 + 1, T})


def bytes_md():
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
    per_position = contiguous // cfg.context_len
    return (f"Bytes a request's cache holds, at {default_note(batch=False)} in float64, by how many positions it "
            f"has filled. One position costs {per_position:,} bytes (keys and values, {cfg.num_layers} blocks, "
            f"\\(d\\) = {cfg.emb_dim} numbers each); the contiguous cache holds \\(T_{{\\max}}\\) = "
            f"{cfg.context_len} of them from the start, the paged one whole pages of {S} as it fills them:\n\n"
            + sections.md_table(["positions filled", "contiguous: bytes", "per position", "pages leased",
                                 "paged: bytes", "per position"], rows)
            + f"\nThe pool itself is allocated once, for all requests, plus one blank page ({pool.keys[0][0].nbytes:,} "
              "bytes per block for keys, as many for values) that pads the shorter page tables in a batched step. "
              "So paging does not make a cache cheaper to fill: it lets one pool be sized for the positions "
              "requests really use, where contiguous caches reserve \\(T_{\\max}\\) positions per request.\n")


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
