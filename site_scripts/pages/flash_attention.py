"""Generator of the Flash attention page: the values its prose shows (docs/model/flash-attention.md binds them),
its tables and its pictures: the tiles and one row's running maximum, the online softmax of that row tile by tile,
the backward's row term D, the equality with the materialized path, the gradient check, and the memory and time of
the four memory policies (tools/memory_policies.py, through site_scripts/memory.py).

The example recomputes the recurrence from the page's equations for one row and compares where it ends with
what `flash_core_forward` returns and with the materialized softmax."""

import math

import numpy as np

from transformer.attention import attention_backward, attention_forward, qkv_forward, split_heads
from transformer.block import ATTENTION_KEYS, block_params
from transformer.flash_attention import flash_attention_backward, flash_attention_forward, flash_core_forward, tile_scores
from transformer.gradcheck import relative_gap
from transformer.layernorm import layer_norm_forward

from .. import gpt2_cost, memory, sections
from ..common import md_table
from ..examples import H_STEP, SEED, biases_moved, default_note, default_run, tiny, weighted_sum
from ..figures import new_figure, png
from ..prose import num

EXAMPLE_T, EXAMPLE_TILE = 7, 3  # three tiles, the last one narrower
EQUAL_T, EQUAL_TILES = (1, 7, 8, 9, 64), (1, 3, 8, 64)  # T below, at and above a tile's width
EQUAL_BAR = 1e-12  # flash against materialized, relative, float64: rounding is about 1e-16
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


def rescaling_head(q_scaled, k, v, t):
    """The head whose row t has its maximum raised by the most tiles after the first (the example shows that row):
    (head, its records, its output, how many tiles raised the maximum)."""
    heads = [online_row(q_scaled[0, h, t] @ k[0, h].T, v[0, h], EXAMPLE_TILE) for h in range(q_scaled.shape[1])]
    raises = [sum(r[4] < 1 for r in records[1:]) for records, _ in heads]
    h = int(np.argmax(raises))
    return h, heads[h][0], heads[h][1], raises[h]


def example():
    """One query row of the online softmax, tile by tile, and where it ends against the code and the materialized
    softmax: the tables and their values."""
    cfg, p, x = tiny_inputs(EXAMPLE_T, np.random.default_rng(SEED))
    (q_scaled, k, v), _ = qkv_forward(x, p, cfg.num_heads)
    out, row_max, row_sum = flash_core_forward(q_scaled, k, v, EXAMPLE_TILE)
    trace = {}
    attention_forward(x, p, cfg.num_heads, trace)
    t = EXAMPLE_T - 1  # the last row: it sees every tile
    h, records, o_row, raises = rescaling_head(q_scaled, k, v, t)
    s_row = q_scaled[0, h, t] @ k[0, h].T
    rows = [[f"{t0} to {t1 - 1}", " ".join(sections.fixed(s) for s in s_row[t0:t1]), sections.fixed(tmax),
             sections.fixed(m), sections.fixed(omega), sections.fixed(z), " ".join(sections.fixed(a) for a in acc)]
            for t0, t1, tmax, m, omega, z, acc in records]
    o_mat = trace["attention"][0, h, t] @ v[0, h]
    fixed = lambda a: " ".join(sections.fixed(x) for x in a)  # noqa: E731
    checks = [["\\(S^{\\max}_t\\)", sections.fixed(records[-1][3]), sections.fixed(row_max[0, h, t]),
               sections.fixed(s_row.max()), "the largest score of the row"],
              ["\\(\\mathcal{Z}_t\\)", sections.fixed(records[-1][5]), sections.fixed(row_sum[0, h, t]),
               sections.fixed(np.exp(s_row - row_max[0, h, t]).sum()),
               "\\(\\sum_{t'} e^{S_{tt'} - S^{\\max}_t}\\) over the whole row"],
              ["\\(O_t\\)", fixed(o_row), fixed(out[0, h, t]), fixed(o_mat),
               "the materialized path's \\(\\sum_{t'} \\alpha_{tt'} V_{t'}\\)"]]
    tables = {"online": md_table(["keys \\(t_0\\) to \\(t_1 - 1\\)", "the tile's scores \\(S_{tt'}\\)", "tile maximum",
                                  "\\(S^{\\max}_t\\) after", "\\(\\omega_t\\)", "\\(\\mathcal{Z}_t\\) after",
                                  "\\(\\tilde{O}_t\\) after"], rows),
              "ends": md_table(["", "the recurrence above", "`flash_core_forward`", "computed over the whole row",
                                "which is"], checks)}
    values = {"T": EXAMPLE_T, "tile": EXAMPLE_TILE, "t": t, "head": h, "raises": raises,
              "gap": float(np.abs(out[0, h, t] - o_mat).max())}
    return tables, values


def tile_grid(ax, T, tile, t):
    """Which (query, key) entries each tile computes, computes and masks, or skips; row t framed."""
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Rectangle

    grid = np.zeros((T, T))  # 0: skipped (the tile's rows t < t_0), 1: computed, then masked (-inf), 2: computed
    for t0 in range(0, T, tile):
        t1 = min(t0 + tile, T)
        for row in range(t0, T):
            grid[row, t0:t1] = [2 if col <= row else 1 for col in range(t0, t1)]
    ax.imshow(grid, cmap=ListedColormap(["0.92", "tab:red", "tab:blue"]), vmin=0, vmax=2)
    for t0 in range(tile, T, tile):
        ax.axvline(t0 - 0.5, color="black", lw=2)
    ax.plot([], [], "s", color="tab:blue", label="computed")
    ax.plot([], [], "s", color="tab:red", label="computed, then masked to −∞")
    ax.plot([], [], "s", color="0.8", label="skipped: never computed")
    ax.add_patch(Rectangle((-0.5, t - 0.5), T, 1, fill=False, edgecolor="black", lw=1.5, ls="--"))
    ax.set(title=f"tiles of {tile} keys (T = {T}); the query axis is not tiled", xlabel="key position t'",
           ylabel="query position t", xticks=range(T), yticks=range(T))
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), fontsize="small")


def running_max(ax, s_row, records, t, h, tile):
    """One row's scores, and its running maximum after each tile with the rescale factor it brought."""
    T = len(s_row)
    ax.plot(range(T), s_row, "o", color="tab:blue", label=f"the row's scores S_tt' (row t = {t}, head {h})")
    edges = [r[0] - 0.5 for r in records] + [T - 0.5]
    maxima = [r[3] for r in records]
    ax.step(edges, maxima + maxima[-1:], where="post", color="black", lw=2,
            label="running maximum S^max_t after each tile")
    for (t0, t1, _, m, omega, *_) in records:
        ax.annotate(f"ω = {omega:.3f}", ((t0 + t1 - 1) / 2, m), textcoords="offset points", xytext=(0, -6),
                    ha="center", va="top", fontsize="small")
    for t0 in range(tile, T, tile):
        ax.axvline(t0 - 0.5, color="black", lw=0.8, ls="--")
    ax.set(title="one query row as the tiles pass", xlabel="key position t'", ylabel="score", xticks=range(T))
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), fontsize="small")


def tiles_png():
    """Left: which (query, key) entries of the example's window each tile computes, masks or skips; right: the
    running maximum of the example's row as the tiles pass."""
    cfg, p, x = tiny_inputs(EXAMPLE_T, np.random.default_rng(SEED))
    (q_scaled, k, v), _ = qkv_forward(x, p, cfg.num_heads)
    t = EXAMPLE_T - 1
    h, records, _, _ = rescaling_head(q_scaled, k, v, t)
    fig, (left, right) = new_figure(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [1, 1.3]})
    tile_grid(left, EXAMPLE_T, EXAMPLE_TILE, t)
    running_max(right, q_scaled[0, h, t] @ k[0, h].T, records, t, h, EXAMPLE_TILE)
    return png(fig)


def d_trick():
    """The backward's row term D = rowsum(dO ⊙ O), against the sum over the whole row Σ_t' α dα it replaces, on
    the example's window with the gradient check's upstream gradient: a table for the example's head, and values."""
    rng = np.random.default_rng(SEED)
    cfg, p, x = tiny_inputs(EXAMPLE_T, rng)
    dy = rng.standard_normal(x.shape)  # the gradient check's R
    (q_scaled, k, v), _ = qkv_forward(x, p, cfg.num_heads)
    out, _, _ = flash_core_forward(q_scaled, k, v, EXAMPLE_TILE)
    dout = split_heads(dy @ p["wo"].T, cfg.num_heads)  # through the output projection
    trace = {}
    attention_forward(x, p, cfg.num_heads, trace)
    alpha, dalpha = trace["attention"], dout @ v.transpose(0, 1, 3, 2)
    big_d, row_term = np.sum(dout * out, axis=-1), np.sum(alpha * dalpha, axis=-1)
    t = EXAMPLE_T - 1
    h = rescaling_head(q_scaled, k, v, t)[0]
    rows = [[r, f"{big_d[0, h, r]:.4f}", f"{row_term[0, h, r]:.4f}",
             sections.gap_text(abs(big_d[0, h, r] - row_term[0, h, r]))] for r in range(EXAMPLE_T)]
    table = md_table(["query row \\(t\\)", "\\(D_t = \\sum_i \\partial\\ell/\\partial O_{ti}\\, O_{ti}\\)",
                      "\\(\\sum_{t'} \\alpha_{tt'}\\, \\partial\\ell/\\partial\\alpha_{tt'}\\)", "gap"], rows)
    terms = " + ".join(f"{num(a)} × {num(b)}" for a, b in zip(dout[0, h, t], out[0, h, t], strict=True))
    if abs(dout[0, h, t] @ out[0, h, t] - big_d[0, h, t]) > 1e-12:
        raise RuntimeError("the Flash attention page's D by hand disagrees with the code")
    return table, {"t": t, "head": h, "terms": terms, "value": big_d[0, h, t], "row_len": t + 1,
                   "gap": float(np.abs(big_d - row_term).max()), "shape": list(big_d.shape)}


def tile_shapes():
    """The largest arrays the passes make, read off the code at the default run's T (a tile's scores with the
    default tile, and with a tile as wide as the window), and what each path keeps in place of the other's."""
    ex = default_run()
    cfg, p, x = ex.cfg, block_params(ex.params, 0), ex.trace["b0.ln1"]
    (q_scaled, k, _), _ = qkv_forward(x, p, cfg.num_heads)
    T = x.shape[1]
    _, flash = flash_attention_forward(x, p, cfg.num_heads, cfg.flash_tile)
    _, materialized = attention_forward(x, p, cfg.num_heads)
    return {"T": T, "tile": cfg.flash_tile, "scores": tile_scores(q_scaled, k, 0, min(cfg.flash_tile, T)).shape,
            "qkv": q_scaled.shape, "wide": T, "wide_scores": tile_scores(q_scaled, k, 0, T).shape,
            "att_bytes": materialized.att.nbytes, "rows_bytes": flash.row_max.nbytes + flash.row_sum.nbytes}


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
    return md_table(["\\(T\\)", "\\(n_{\\mathrm{tile}}\\)", "output", "\\(\\partial\\ell/\\partial U_1\\)",
                     "parameter gradients", f"all ≤ {EQUAL_BAR:g}"], cells)


# ---------------------------------------------------------------- gradient check

def gradcheck():
    rng = np.random.default_rng(SEED)
    cfg, p, x = tiny_inputs(EXAMPLE_T, rng)
    dy = rng.standard_normal(x.shape)
    dx, grads = flash_attention_backward(dy, flash_attention_forward(x, p, cfg.num_heads, EXAMPLE_TILE)[1])
    checks = [("dx", dx, x)] + [(f"d{k}", grads[k], p[k]) for k in ATTENTION_KEYS]
    rows = sections.gradcheck_rows(weighted_sum(dy, flash_attention_forward, x, p, cfg.num_heads, EXAMPLE_TILE),
                                   checks, H_STEP)
    return sections.gradcheck_table(rows), {"tile": EXAMPLE_TILE, "shape": x.shape}


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


def compare_rows(found, lengths):
    """T | flash's step time over the materialized one's | slower? | its step peak over the materialized one's |
    smaller?, one row per length measured."""
    rows = []
    for T in lengths:
        flash, mat = found["flash", T], found["materialized", T]
        time, peak = flash.seconds / mat.seconds, flash.step_peak / mat.step_peak
        rows.append([T, f"{time:.2f}", "slower" if time > 1 else "not slower", f"{peak:.2f}",
                     "smaller" if peak < 1 else "not smaller"])
    return rows


def memory_part():
    """The memory and time of the four policies: two tables, and their values."""
    found, lengths = memory.measurements(), memory.lengths()
    cfg, tool = memory.tool.CONFIG, memory.tool
    hi = lengths[-1]
    rows = [[T, policy, memory.mib(m.attention_peak), memory.mib(m.step_peak), memory.mib(m.retained),
             f"{m.seconds * 1000:.1f}"] for T in lengths for policy in tool.POLICIES for m in [found[policy, T]]]
    tables = {"memory": md_table(["\\(T\\)", "policy", "attention peak (MiB)", "step peak (MiB)", "retained (MiB)",
                                  "time per step (ms)"], rows),
              "compare": md_table(["\\(T\\)", "flash's step time over the materialized one's", "flash is",
                                   "flash's step peak over the materialized one's", "flash's is"],
                                  compare_rows(found, lengths))}
    values = {"batch": tool.BATCH, "d": cfg.emb_dim, "H": cfg.num_heads, "L": cfg.num_layers, "F": cfg.ff_dim,
              "tile": cfg.flash_tile, "lengths": list(lengths), "all_lengths": list(tool.LENGTHS), "lo": lengths[-2],
              "hi": hi, "steps": memory.STEPS,
              "growth_materialized": growth(found, "materialized", "attention_peak", lengths),
              "growth_flash": growth(found, "flash", "attention_peak", lengths),
              "ratio": found["materialized", hi].attention_peak / found["flash", hi].attention_peak}
    return tables, values


def generate(context):
    found, lengths = memory.measurements(), memory.lengths()
    cfg = tiny().cfg
    example_tables, example_values = example()
    d_table, d_values = d_trick()
    memory_tables, memory_values = memory_part()
    gradcheck_table, gradcheck_values = gradcheck()
    values = {"seed": SEED, "sizes": {"n_v": cfg.vocab_size, "t_max": cfg.context_len, "d": cfg.emb_dim,
                                      "h": cfg.num_heads, "l": cfg.num_layers, "f": cfg.ff_dim},
              "example": example_values, "d": d_values, "shapes": tile_shapes(), "bar": EQUAL_BAR,
              "memory": memory_values, "gradcheck": gradcheck_values, "gpt2": gpt2_cost.cited()}
    return {"values": values, "tiles.png": tiles_png(), **example_tables, "d_trick": d_table,
            "equality": equality_md(), **memory_tables, FIGURE: figure_png(found, lengths), "symbols": symbols_md(),
            "gradcheck": gradcheck_table}
