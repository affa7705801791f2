"""Generator of the Flash attention page's fragments: the symbol table, the online softmax of one query row
tile by tile, the equality with the materialized path, the gradient check, and the memory and time of the four
memory policies (tools/memory_policies.py, through site_scripts/memory.py) with their figure.

The example recomputes the recurrence from the page's equations for one row and compares where it ends with
what `flash_core_forward` returns and with the materialized softmax."""

import math

import numpy as np

from transformer.attention import attention_backward, attention_forward, qkv_forward, split_heads
from transformer.block import ATTENTION_KEYS, block_params
from transformer.flash_attention import flash_attention_backward, flash_attention_forward, flash_core_forward, tile_scores
from transformer.gradcheck import relative_gap
from transformer.layernorm import layer_norm_forward

from .. import memory, sections
from ..cache_inventory import ATTENTION, inventory_md
from ..common import md_table, mode
from ..examples import H_STEP, SEED, biases_moved, default_note, default_run, illustrative, tiny, weighted_sum
from ..figures import new_figure, png

EXAMPLE_T, EXAMPLE_TILE = 7, 3  # three tiles, the last one narrower
EQUAL_T, EQUAL_TILES = (1, 7, 8, 9, 64), (1, 3, 8, 64)  # T below, at and above a tile's width
EQUAL_BAR = 1e-12  # the bar for flash against materialized, relative, float64
FIGURE = "memory.png"


def tiny_inputs(T, rng):
    """Block 0 of the tiny model (biases moved off zero) and a LayerNorm-ed random input of T positions: the
    tiny model's context is shorter than T, and attention itself does not care."""
    ex = tiny()
    p = biases_moved(block_params(ex.params, 0), rng)
    x, _ = layer_norm_forward(rng.standard_normal((2, T, ex.cfg.emb_dim)), p["ln1_g"], p["ln1_b"], ex.cfg.ln_eps)
    return ex.cfg, p, x


# ---------------------------------------------------------------- the online softmax, one row

def online_row(s_row, v, tile):
    """The page's recurrence for one query row: its scores over keys 0..t and the values. Returns one record per
    tile (t0, t1, the tile's maximum, S^max, omega, Z, O-tilde after it) and the final output."""
    m, z, acc, records = -np.inf, 0.0, np.zeros(v.shape[1]), []
    for t0 in range(0, len(s_row), tile):
        t1 = min(t0 + tile, len(s_row))
        new = max(m, s_row[t0:t1].max())
        a = np.exp(s_row[t0:t1] - new)
        omega = math.exp(m - new)
        z, acc, m = omega * z + a.sum(), omega * acc + a @ v[t0:t1], new
        records.append((t0, t1, s_row[t0:t1].max(), m, omega, z, acc.copy()))
    return records, acc / z


def example_md():
    cfg, p, x = tiny_inputs(EXAMPLE_T, np.random.default_rng(SEED))
    (q_scaled, k, v), _ = qkv_forward(x, p, cfg.num_heads)
    out, row_max, row_sum = flash_core_forward(q_scaled, k, v, EXAMPLE_TILE)
    trace = {}
    attention_forward(x, p, cfg.num_heads, trace)
    alpha = trace["attention"]
    # The row shown: the last one (it sees every tile), in the head whose maximum grows most often.
    t = EXAMPLE_T - 1
    heads = [online_row(q_scaled[0, h, t] @ k[0, h].T, v[0, h], EXAMPLE_TILE) for h in range(cfg.num_heads)]
    raises = [sum(r[4] < 1 for r in records[1:]) for records, _ in heads]
    h = int(np.argmax(raises))
    records, o_row = heads[h]
    if raises[h] == 0:
        raise RuntimeError("no tile raises the maximum of the rows shown: the example would show no rescaling")
    rows = [[f"{t0} to {t1 - 1}", " ".join(sections.fixed(s) for s in q_scaled[0, h, t] @ k[0, h, t0:t1].T),
             sections.fixed(tmax), sections.fixed(m), sections.fixed(omega), sections.fixed(z),
             " ".join(sections.fixed(a) for a in acc)] for t0, t1, tmax, m, omega, z, acc in records]
    o_mat = alpha[0, h, t] @ v[0, h]
    checks = [["\\(S^{\\max}_t\\)", sections.fixed(records[-1][3]), sections.fixed(row_max[0, h, t]),
               sections.fixed((q_scaled[0, h, t] @ k[0, h].T).max()), "the largest score of the row"],
              ["\\(\\mathcal{Z}_t\\)", sections.fixed(records[-1][5]), sections.fixed(row_sum[0, h, t]),
               sections.fixed(np.exp(q_scaled[0, h, t] @ k[0, h].T - row_max[0, h, t]).sum()),
               "\\(\\sum_{t'} e^{S_{tt'} - S^{\\max}_t}\\) over the whole row"],
              ["\\(O_t\\)", " ".join(sections.fixed(a) for a in o_row), " ".join(sections.fixed(a) for a in out[0, h, t]),
               " ".join(sections.fixed(a) for a in o_mat), "the materialized path's \\(\\sum_{t'} \\alpha_{tt'} V_{t'}\\)"]]
    gap = float(np.abs(out[0, h, t] - o_mat).max())
    return "\n".join([
        illustrative(f"Block 0's attention parameters on a random LayerNorm-ed input of \\(T\\) = {EXAMPLE_T} "
                     f"positions (longer than the tiny model's context, which attention alone does not need), "
                     f"tiles of \\(n_{{\\mathrm{{tile}}}}\\) = {EXAMPLE_TILE} keys, seed {SEED}."),
        f"Query row \\(t\\) = {t} of head {h}, window 0: the last row, which sees every tile. Each line is one tile, "
        "with the row's running quantities after it ([the recurrence](#eq-flash-max)); "
        f"{raises[h]} of its tiles after the first {'raises' if raises[h] == 1 else 'raise'} the maximum, and \\(\\omega_t < 1\\) then shrinks what "
        "was summed before.\n",
        md_table(["keys \\(t_0\\) to \\(t_1 - 1\\)", "the tile's scores \\(S_{tt'}\\)", "tile maximum",
                  "\\(S^{\\max}_t\\) after", "\\(\\omega_t\\)", "\\(\\mathcal{Z}_t\\) after", "\\(\\tilde{O}_t\\) after"],
                 rows),
        "\nWhere the recurrence ends, against the code and against one softmax over the whole row:\n",
        md_table(["", "the recurrence above", "`flash_core_forward`", "computed over the whole row", "which is"],
                 checks),
        f"\nThe largest gap between flash's \\(O_t\\) and the materialized one is {sections.gap_text(gap)}.\n",
    ])


# ---------------------------------------------------------------- flash against materialized

def equality_rows():
    """(T, tile, relative gap of the output, of dx, of the parameter gradients together) in float64. The
    parameters' gap is the largest difference over the largest entry of any of their gradients: the key bias's
    gradient is zero in exact arithmetic (and at T = 1 the query and key weights' too), so a gap relative to it
    alone would compare rounding with rounding."""
    out = []
    for T in EQUAL_T:
        cfg, p, x = tiny_inputs(T, np.random.default_rng(SEED))
        dy = np.random.default_rng(SEED + 1).standard_normal(x.shape)
        y_m, cache_m = attention_forward(x, p, cfg.num_heads)
        dx_m, g_m = attention_backward(dy, cache_m)
        scale = max(np.abs(g_m[k]).max() for k in ATTENTION_KEYS)
        for tile in EQUAL_TILES:
            y_f, cache_f = flash_attention_forward(x, p, cfg.num_heads, tile)
            dx_f, g_f = flash_attention_backward(dy, cache_f)
            params_gap = max(np.abs(g_f[k] - g_m[k]).max() for k in ATTENTION_KEYS) / scale
            out.append((T, tile, relative_gap(y_f, y_m), relative_gap(dx_f, dx_m), float(params_gap)))
    return out


def equality_md():
    rows = equality_rows()
    cells = [[T, tile, f"{y:.1e}", f"{dx:.1e}", f"{g:.1e}", "pass" if max(y, dx, g) <= EQUAL_BAR else "**FAIL**"]
             for T, tile, y, dx, g in rows]
    return (f"`flash_attention_forward` and `flash_attention_backward` against `attention_forward` and "
            f"`attention_backward`, in float64, on the tiny model's block 0 (biases moved off zero) with a batch of "
            f"2 random windows and a random upstream gradient (seed {SEED}); every \\(T\\) with every tile width, "
            "including tiles wider than the window and windows that are not a multiple of the tile. The output's "
            "and the input gradient's gaps are `relative_gap` (the largest difference over the larger of the two "
            "arrays' largest entries); the parameters' is their largest difference over the largest entry of any "
            "parameter gradient, because the key bias's gradient is zero in exact arithmetic (and, at \\(T\\) = 1, "
            "where a row's one weight is 1 whatever its score, the query and key weights' too).\n\n"
            + md_table(["\\(T\\)", "\\(n_{\\mathrm{tile}}\\)", "output", "\\(\\partial\\ell/\\partial U_1\\)",
                        "parameter gradients", f"all ≤ {EQUAL_BAR:g}"], cells)
            + "\nThe two paths add in different orders (a tile's sum joins a rescaled partial sum), so the gaps are "
              "rounding, not zero.\n")


# ---------------------------------------------------------------- gradient check

def gradcheck_md():
    rng = np.random.default_rng(SEED)
    cfg, p, x = tiny_inputs(EXAMPLE_T, rng)
    dy = rng.standard_normal(x.shape)
    dx, grads = flash_attention_backward(dy, flash_attention_forward(x, p, cfg.num_heads, EXAMPLE_TILE)[1])
    checks = [("dx", dx, x)] + [(f"d{k}", grads[k], p[k]) for k in ATTENTION_KEYS]
    rows = sections.gradcheck_rows(weighted_sum(dy, flash_attention_forward, x, p, cfg.num_heads, EXAMPLE_TILE),
                                   checks, H_STEP)
    return (f"The [fake loss](../reference/notation.md#fake-loss) \\(f = \\sum \\operatorname{{Attn}}(U_1) \\odot R\\) "
            f"of `flash_attention_forward` with tiles of {EXAMPLE_TILE} on the tiny model's block 0 (biases moved "
            f"off zero), a random input of shape `{x.shape}` and a random \\(R\\) (seed {SEED}). As on the Attention "
            "page, the key bias's gradient is zero in exact arithmetic and passes on the absolute floor.\n\n"
            + sections.gradcheck_table(rows))


# ---------------------------------------------------------------- symbols

def symbols_md():
    ex = default_run()
    cfg, p, x = ex.cfg, block_params(ex.params, 0), ex.trace["b0.ln1"]
    y, cache = flash_attention_forward(x, p, cfg.num_heads, cfg.flash_tile)
    T, tile = x.shape[1], cfg.flash_tile
    last = (T - 1) // tile * tile  # the last tile's t_0
    first_scores, last_scores = tile_scores(cache.q_scaled, cache.k, 0, tile), tile_scores(cache.q_scaled, cache.k, last, T)
    heads = cache.o_cache.x
    dheads = np.ones_like(heads)  # any upstream gradient: D's shape is what is recorded
    big_d = np.sum(split_heads(dheads, cfg.num_heads) * split_heads(heads, cfg.num_heads), axis=-1)
    rows = [
        (r"n_{\mathrm{tile}}", "tile", "int", f"`flash_tile` = {tile}"),
        (r"t_0, t_1", "start, stop", "int", f"{T // tile + (T % tile > 0)} tiles over \\(T\\) = {T}"),
        (r"Q^{(h)}/\sqrt{d_h}", "q_scaled", cache.q_scaled.shape),
        (r"Q^{(h)}, K^{(h)}, V^{(h)}", "k, v", cache.k.shape, "the keys and values (the queries are kept scaled)"),
        (r"S^{(h)}", "s = tile_scores(...)", first_scores.shape,
         f"one tile's scores, against the rows \\(t \\ge t_0\\): the first tile's; the last tile's are "
         f"{sections.shape_text(last_scores.shape)}"),
        (r"\tilde{\alpha}", "p", first_scores.shape, "the first tile's"),
        (r"\omega_t", "rescale", first_scores.shape[:3], "the first tile's rows"),
        (r"S^{\max}", "row_max", cache.row_max.shape),
        (r"\mathcal{Z}", "row_sum", cache.row_sum.shape),
        (r"\tilde{O}", "out (before the division)", cache.q_scaled.shape),
        (r"O^{(h)}", "heads (out after the division)", split_heads(heads, cfg.num_heads).shape),
        (r"O", "merge_heads(heads)", heads.shape),
        (r"D", "big_d", big_d.shape),
        (r"\operatorname{Attn}(U_1)", "y", y.shape),
    ]
    return sections.symbols_md(rows, default_note() + f" (block 0, tiles of {tile})")


# ---------------------------------------------------------------- memory and time

def figure_png(found, lengths):
    """Left: one attention layer (checkpointing does not change it, so two paths); right: a whole step, four
    policies. Dashed: T and T² through each path's first point, for the eye."""
    from matplotlib.ticker import LogLocator

    fig, axes = new_figure(1, 2, figsize=(11, 4.2))
    panels = ((axes[0], "attention_peak", ("materialized", "flash"), "One attention layer, forward and backward"),
              (axes[1], "step_peak", tuple(memory.tool.POLICIES), "One whole training step"))
    for ax, field, policies, title in panels:
        for policy in policies:
            ax.plot(lengths, [getattr(found[policy, T], field) / memory.MIB for T in lengths], marker="o",
                    label=policy)
        if field == "attention_peak":
            for policy, power, style, name in (("materialized", 2, "k--", "∝ T²"), ("flash", 1, "k:", "∝ T")):
                start = getattr(found[policy, lengths[0]], field) / memory.MIB
                ax.plot(lengths, [start * (T / lengths[0]) ** power for T in lengths], style, lw=0.8, label=name)
        ax.set(xscale="log", yscale="log", title=title, xlabel="sequence length T (positions)",
               ylabel="peak memory above the parameters (MiB)")
        ax.set_xticks(lengths, [str(T) for T in lengths])
        ax.minorticks_off()
        ax.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
        ax.yaxis.set_major_formatter(lambda v, _: f"{v:g}")
        ax.legend()
    fig.suptitle("Peak memory of the memory policies, float32, measured with tracemalloc")
    fig.tight_layout()
    return png(fig)


def growth(found, policy, field, lengths):
    """The exponent a of T^a between the two longest lengths measured (the shorter ones are dominated by the
    layers that are linear in T on both paths)."""
    lo, hi = lengths[-2], lengths[-1]
    return math.log(getattr(found[policy, hi], field) / getattr(found[policy, lo], field)) / math.log(hi / lo)


def speed_text(ratios, lengths):
    """Slower, faster or both, as the measured ratios say; no claim the times do not show."""
    slow = [T for r, T in zip(ratios, lengths) if r > 1]
    if len(slow) == len(lengths):
        return f"slower at every length measured, by up to {max(ratios):.2f} times"
    if not slow:
        return "not slower at any length measured on this machine"
    return f"slower at \\(T\\) = {', '.join(map(str, slow))}, not at the other lengths"


def memory_md():
    found, lengths = memory.measurements(), memory.lengths()
    cfg, tool = memory.tool.CONFIG, memory.tool
    hi = lengths[-1]
    rows = [[T, policy, memory.mib(m.attention_peak), memory.mib(m.step_peak), memory.mib(m.retained),
             f"{m.seconds * 1000:.1f}"] for T in lengths for policy in tool.POLICIES for m in [found[policy, T]]]
    ratio = found["materialized", hi].attention_peak / found["flash", hi].attention_peak
    slower = [found["flash", T].seconds / found["materialized", T].seconds for T in lengths]
    smaller = [T for T in lengths if found["flash", T].step_peak < found["materialized", T].step_peak]
    banner = (f'!!! warning "Quick run"\n    This build measured {len(lengths)} lengths (SITE_QUICK=1); '
              f"`scripts/site` measures {', '.join(map(str, tool.LENGTHS))}.\n\n") if mode() == "quick" else ""
    return (banner + f"`tools/memory_policies.py` on \\(B\\) = {tool.BATCH} windows of a "
            f"model with \\(d\\) = {cfg.emb_dim}, \\(H\\) = {cfg.num_heads}, \\(L\\) = {cfg.num_layers}, "
            f"\\(F\\) = {cfg.ff_dim}, float32, tiles of {cfg.flash_tile}. A peak is the most bytes numpy held at once "
            "(tracemalloc) above what the parameters and AdamW's moments already hold; *retained* is what the "
            "forward's cache keeps for the backward. The bytes are the same on every run.\n\n"
            f"![Peak memory against T, log-log, for the four policies](flash_attention/{FIGURE})\n\n"
            f"Between \\(T\\) = {lengths[-2]} and {hi}, one materialized attention layer's peak grows as "
            f"\\(T^{{{growth(found, 'materialized', 'attention_peak', lengths):.2f}}}\\) and flash's as "
            f"\\(T^{{{growth(found, 'flash', 'attention_peak', lengths):.2f}}}\\): the `(T, T)` weights against "
            f"arrays of `(T, d_h)` and one tile. At \\(T\\) = {hi} flash's is {ratio:.1f} times smaller. "
            "Over a whole step the other layers, linear in \\(T\\) on both paths, dilute the difference.\n\n"
            + md_table(["\\(T\\)", "policy", "attention peak (MiB)", "step peak (MiB)", "retained (MiB)",
                        "time per step (ms)"], rows)
            + f"\nThe times are the median of {memory.STEPS} steps on the machine that built this page, without "
              "tracemalloc, and change with the machine and its load; the bytes do not. Flash's step time over the "
              "materialized one's: " + ", ".join(f"{r:.2f} at \\(T\\) = {T}" for r, T in zip(slower, lengths))
            + f" ({speed_text(slower, lengths)}). In NumPy its tiles are a Python loop of small matmuls where the "
              "materialized path makes one large one; a GPU kernel also saves reads of slow memory, which NumPy "
              "cannot. Flash's step peak is the smaller one at "
              + (f"every length measured, from \\(T\\) = {smaller[0]}" if smaller == list(lengths)
                 else f"\\(T\\) = {', '.join(map(str, smaller)) or 'no length measured'}")
              + ": it is worth turning on when a step's memory, not its time, is what limits the window or the "
                "batch.\n")


def generate(context):
    found, lengths = memory.measurements(), memory.lengths()
    inventory = inventory_md("flash_attention", context["repo_url"], runs=("materialized", "flash"), caches=ATTENTION)
    return {"symbols": symbols_md(), "example": example_md(), "equality": equality_md(),
            "gradcheck": gradcheck_md(), "memory": memory_md(), FIGURE: figure_png(found, lengths),
            "cache-inventory": inventory}
