"""Generator of the NF4 page's fragments: what the scales cost, the code table rebuilt from its equation, the
symbol table, one block quantized by hand, double quantization worked, the bytes of real weight shapes, the
error against a uniform 4-bit code (with its figure), the comparison with bitsandbytes, and the NF4 linear
layer (site_scripts/pages/_nf4_layer.py).

Every number is computed here from transformer/nf4.py; where the page recomputes something by hand (a
quantile, a nearest index, a byte), a row compares it with what the code returns."""

import inspect
from statistics import NormalDist

import numpy as np

from transformer import nf4
from transformer.config import PRESETS
from transformer.model import param_shapes
from transformer.quantized_linear import ROWS

from .. import sections
from ..common import md_table, package_version
from ..examples import SEED, default_note, default_run
from ..figures import new_figure, png
from ._nf4_bnb import compare_double, compare_single, functional
from ._nf4_bnb import devices as bnb_devices
from ._nf4_bnb import tables as bnb_tables
from ._nf4_layer import gradcheck_md, layer_md

DEFAULTS = {k: v.default for k, v in inspect.signature(nf4.quantize).parameters.items() if k != "w"}
BLOCK, BLOCK2 = DEFAULTS["block_size"], DEFAULTS["block_size2"]
EXAMPLE_BLOCK = 8  # the hand-worked block: 8 weights, 4 bytes
LARGE = (4096, 4096)  # a weight of a large model, for the byte table
BNB_SHAPES = (((64, 256), BLOCK), ((37, 129), BLOCK), ((1024, 1024), BLOCK))
FIGURE = "error.png"


def normal_weight(shape, seed=SEED, scale=0.02):
    """A float32 weight drawn from N(0, scale²): the distribution NF4 is built for."""
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def heavy_weight(shape, seed=SEED, scale=0.02):
    """A float32 weight from a Student-t with 4 degrees of freedom: heavier tails than the normal, as trained
    weights have (rare outliers set the absmax of their block)."""
    return (np.random.default_rng(seed).standard_t(4, shape) * scale).astype(np.float32)


def hexes(packed):
    return " ".join(f"`{b:02X}`" for b in packed)


# ---------------------------------------------------------------- what the scales cost

def bits_per_weight(n, **kw):
    return 8 * nf4.payload_bytes(n, **kw) / n


def why_md():
    n = LARGE[0] * LARGE[1]
    single, double = nf4.payload_bytes(n, double=False), nf4.payload_bytes(n)
    rows = [["float32", f"{4 * n:,}", "32"],
            ["NF4, one float32 absmax per block", f"{single:,}", f"{bits_per_weight(n, double=False):.3f}"],
            ["NF4, double-quantized scales", f"{double:,}", f"{bits_per_weight(n):.3f}"]]
    return (f"With \\(n_b\\) = {BLOCK} and \\(n_b^{{(2)}}\\) = {BLOCK2} (the defaults of `quantize`), a float32 "
            f"absmax adds 32/{BLOCK} = {32 / BLOCK:.3f} bits to each weight's 4; double-quantized, the scales "
            f"cost 8/{BLOCK} + 32/({BLOCK}·{BLOCK2}) = {8 / BLOCK + 32 / (BLOCK * BLOCK2):.3f} bits. "
            f"For a {LARGE[0]} × {LARGE[1]} weight, from `payload_bytes`:\n\n"
            + md_table(["stored as", "bytes", "bits per weight"], rows)
            + f"\nDouble quantization saves {single - double:,} bytes of this weight, "
              f"{100 * (single - double) / single:.1f}% of the single-quantized form.\n")


# ---------------------------------------------------------------- the code table

def code_rows():
    """(j, probability or None for the 0, Φ⁻¹ of it, ν_j from the equation, ν_j from nf4_code) for j = 0..15:
    the equation evaluated step by step, beside the function's table."""
    normal, code = NormalDist(), nf4.nf4_code()
    pos_p, neg_p = nf4.float32_linspace(nf4.NF4_OFFSET, 0.5, 9)[:-1], nf4.float32_linspace(nf4.NF4_OFFSET, 0.5, 8)[:-1]
    entries = [(float(p), normal.inv_cdf(float(p))) for p in pos_p] + [(None, 0.0)] + \
              [(float(p), -normal.inv_cdf(float(p))) for p in neg_p]
    largest = max(q for _, q in entries)
    entries.sort(key=lambda e: e[1])
    return [(j, p, q, np.float32(np.float32(q) / np.float32(largest)), code[j]) for j, (p, q) in enumerate(entries)]


DECADES = range(7)


def decade(e):
    """The positive values of ζ in decade e, from its equation, in float64."""
    b = 0.1 + 0.9 * np.arange(2 ** e + 1) / 2 ** e
    return 10.0 ** (e - 6) * (b[:-1] + b[1:]) / 2


def dynamic_rows():
    """(e, count, smallest, largest, spacing) of the positive values of ζ in each decade."""
    return [(e, decade(e).size, decade(e).min(), decade(e).max(), 10.0 ** (e - 6) * 0.9 / 2 ** e) for e in DECADES]


def code_table_md():
    rows, code = code_rows(), nf4.nf4_code()
    same = all(ours == table for *_, ours, table in rows)
    edge = (1 - 1 / (2 * 15) + 1 - 1 / (2 * 16)) / 2
    cells = [[j, "—" if p is None else f"{p:.7f}", f"{q:+.6f}", f"{ours:+.7f}", f"{table:+.7f}",
              "—" if j == len(rows) - 1 else f"{code[j + 1] - code[j]:.4f}"] for j, p, q, ours, table in rows]
    zeta = nf4.dynamic_code()
    dyn = dynamic_rows()
    dyn_cells = [[e, n, f"{lo:.3e}", f"{hi:.3e}", f"{step:.1e}"] for e, n, lo, hi, step in dyn]
    rebuilt = np.sort(np.concatenate([[0.0, 1.0], *[sign * decade(e) for e in DECADES for sign in (1, -1)]]))
    zeta_gap = float(np.abs(rebuilt - zeta).max() / np.abs(zeta).max())
    return (f"\\(p_{{\\mathrm{{edge}}}}\\) = `NF4_OFFSET` = {nf4.NF4_OFFSET}; the midpoint of "
            f"\\(1 - \\frac{{1}}{{30}}\\) and \\(1 - \\frac{{1}}{{32}}\\) is {edge:.7f}. Each row below is "
            "[the NF4 equation](#eq-nf4-code) evaluated step by step: the float32 probability, its normal quantile "
            "(the standard library's `NormalDist().inv_cdf`, in float64), that quantile over the largest one "
            "rounded to float32, and the value `nf4_code()` returns. The last column is the gap to the next value: "
            "narrow near 0, where most weights of a block lie, wide at the ends.\n\n"
            + md_table(["\\(j\\)", "probability", "\\(\\pm\\Phi^{-1}\\)", "\\(\\nu_j\\) by the equation",
                        "`nf4_code()[j]`", "\\(\\nu_{j+1} - \\nu_j\\)"], cells)
            + f"\nThe two columns of \\(\\nu_j\\) are {'the same float32 numbers' if same else '**not the same**'}. "
              f"Index {int(np.argmin(np.abs(code)))} holds the exact 0, the code an odd count is padded with.\n\n"
              f"The dynamic code \\(\\zeta\\) has {zeta.size} values: 0, 1 and, for each decade \\(e\\), the positive "
              "values below with their negatives ([its equation](#eq-nf4-dynamic)).\n\n"
            + md_table(["\\(e\\)", "values", "smallest", "largest", "spacing"], dyn_cells)
            + f"\nRebuilt from the equation in float64, the {rebuilt.size} values differ from `dynamic_code()`'s "
              f"float32 ones by at most {zeta_gap:.1e} of the largest: float32 rounding.\n")


# ---------------------------------------------------------------- symbols

def symbols_md():
    ex = default_run()
    w = ex.params["b0.ff1_w"]
    q, single = nf4.quantize(w), nf4.quantize(w, double=False)
    x = ex.trace["b0.ln2"]
    rows = [
        (r"N_W", "w.size", f"{w.size} (`b0.ff1_w`, {w.shape[0]} × {w.shape[1]})"),
        (r"\theta", "w.reshape(-1)", (w.size,), "`b0.ff1_w` flattened"),
        (r"n_b", "block_size", f"{q.block_size}"),
        (r"n_b^{(2)}", "block_size2", f"{q.block_size2}"),
        (r"N_b", "absmax.size", f"{single.absmax.size}"),
        (r"p_{\mathrm{edge}}", "NF4_OFFSET", f"{nf4.NF4_OFFSET}"),
        (r"\nu", "nf4_code()", nf4.nf4_code().shape),
        (r"\zeta", "dynamic_code()", nf4.dynamic_code().shape),
        (r"\operatorname{code}", "unpack(q.packed, n)", nf4.unpack(q.packed, w.size).shape,
         f"packed two to a byte in `q.packed`, {sections.shape_text(q.packed.shape)}"),
        (r"\operatorname{absmax}", "absmax", single.absmax.shape, "of `quantize(w, double=False)`"),
        (r"\operatorname{offset}", "q.offset", f"{float(q.offset):.6f}"),
        (r"\operatorname{code}^{(8)}", "q.absmax_codes", q.absmax_codes.shape),
        (r"\operatorname{absmax}^{(2)}", "q.absmax2", q.absmax2.shape),
        (r"\widehat{\operatorname{absmax}}", "q.scales()", q.scales().shape),
        (r"\hat{\theta}", "dequantize(q).reshape(-1)", (w.size,)),
        (r"W_{\mathrm{NF4}}", "dequantize(q)", nf4.dequantize(q).shape, "`b0.ff1_w` decoded"),
        (r"A", "x", x.shape, "`b0.ln2`, the input of `ff1`"),
        (r"Y", "y", (*x.shape[:-1], w.shape[1])),
        (r"n_{\mathrm{rows}}", "rows", f"`ROWS` = {ROWS}"),
    ]
    return sections.symbols_md(rows, default_note() + ", quantizing `b0.ff1_w`")


# ---------------------------------------------------------------- one block by hand

def example_rows(w):
    """What the page works out by hand for one block, each beside what the code returns."""
    q = nf4.quantize(w, EXAMPLE_BLOCK, double=False)
    code = nf4.nf4_code()
    absmax = np.abs(w).max()
    scaled = w / absmax
    nearest = np.abs(scaled[:, None] - code[None, :]).argmin(axis=1)  # by brute force, not searchsorted
    codes = nf4.unpack(q.packed, w.size)
    back = nf4.dequantize(q)
    return q, absmax, scaled, nearest, codes, back


def example_md():
    w = normal_weight(EXAMPLE_BLOCK)
    q, absmax, scaled, nearest, codes, back = example_rows(w)
    code = nf4.nf4_code()
    cells = [[i, f"{w[i]:+.6f}", f"{scaled[i]:+.4f}", nearest[i], f"{code[nearest[i]]:+.4f}", codes[i],
              f"{back[i]:+.6f}", f"{back[i] - w[i]:+.1e}"] for i in range(w.size)]
    by_hand = [16 * int(nearest[2 * m]) + int(nearest[2 * m + 1]) for m in range(w.size // 2)]
    bound = absmax * np.diff(code).max() / 2
    agree = (np.array_equal(nearest, codes) and by_hand == q.packed.tolist() and q.absmax[0] == absmax)
    return (f'!!! example "Illustrative: one block of {EXAMPLE_BLOCK} weights drawn from N(0, 0.02²), seed {SEED}"\n'
            f"    `quantize(w, block_size={EXAMPLE_BLOCK}, double=False)`: one block, so one scale. By hand, the "
            "scale, the nearest values (by brute force over all 16) and the bytes; beside them what the code "
            "stored.\n\n"
            f"The block's absmax is \\(\\max_i |\\theta_i|\\) = {absmax:.6f} (`q.absmax` = {q.absmax[0]:.6f}). Each "
            "weight divided by it, the nearest NF4 value, and back:\n\n"
            + md_table(["\\(i\\)", "\\(\\theta_i\\)", "\\(\\theta_i / \\operatorname{absmax}\\)",
                        "nearest \\(j\\), by hand", "\\(\\nu_j\\)", "code stored", "\\(\\hat{\\theta}_i\\)",
                        "\\(\\hat{\\theta}_i - \\theta_i\\)"], cells)
            + "\nTwo codes to a byte, the first in the high nibble: by hand "
              + ", ".join(f"16·{nearest[2 * m]} + {nearest[2 * m + 1]} = {b} = `{b:02X}`" for m, b in enumerate(by_hand))
              + f"; `q.packed` holds {hexes(q.packed)}. The {w.size} weights take {q.packed.nbytes} bytes of codes "
              f"and {q.absmax.nbytes} of scale. The largest error is {np.abs(back - w).max():.1e}, within the "
              f"[bound](#the-error-of-one-weight) absmax · max gap / 2 = {bound:.1e}; the weight that set the absmax "
              f"comes back exactly ({'yes' if back[np.argmax(np.abs(w))] == w[np.argmax(np.abs(w))] else '**no**'}). "
              + ("Every step by hand agrees with the code." if agree else "**The hand computation and the code "
                                                                          "disagree.**") + "\n")


# ---------------------------------------------------------------- double quantization worked

DOUBLE_SHAPE = (256, 128)  # 512 scales: two second-level blocks at the defaults
DOUBLE_SHOWN = 4  # scales shown from each second-level block


def double_md():
    w = normal_weight(DOUBLE_SHAPE)
    q, single = nf4.quantize(w), nf4.quantize(w, double=False)
    s, zeta, decoded = single.absmax, nf4.dynamic_code(), q.scales()
    per = np.repeat(q.absmax2, q.block_size2)[:s.size]
    rows = []
    for k2 in range(q.absmax2.size):
        for k in range(k2 * q.block_size2, min(k2 * q.block_size2 + DOUBLE_SHOWN, s.size)):
            ratio = (s[k] - q.offset) / per[k]
            rows.append([k, k2, f"{s[k]:.6f}", f"{s[k] - q.offset:+.6f}", f"{ratio:+.4f}", q.absmax_codes[k],
                         f"{zeta[q.absmax_codes[k]]:+.4f}", f"{decoded[k]:.6f}", f"{decoded[k] - s[k]:+.1e}"])
    err = np.abs(decoded - s)
    bound = per * np.diff(zeta).max() / 2
    w_gap = np.abs(nf4.dequantize(q) - nf4.dequantize(single)).max()
    second = md_table(["\\(k_2\\)", "scales", "\\(\\operatorname{absmax}^{(2)}_{k_2}\\)"],
                      [[k2, min(q.block_size2, s.size - k2 * q.block_size2), f"{a:.6f}"] for k2, a in enumerate(q.absmax2)])
    return (f"A {DOUBLE_SHAPE[0]} × {DOUBLE_SHAPE[1]} weight from N(0, 0.02²) (seed {SEED}), at the defaults: "
            f"{s.size} first-level scales, so {q.absmax2.size} second-level blocks of {q.block_size2}. "
            f"The offset is their mean, {float(q.offset):.7f} ([its equation](#eq-nf4-offset)); the second-level "
            "scales are each block's largest \\(|\\operatorname{absmax}_k - \\operatorname{offset}|\\):\n\n"
            + second
            + f"\nThe first {DOUBLE_SHOWN} scales of each second-level block, centred, divided by their block's "
              "\\(\\operatorname{absmax}^{(2)}\\), stored as the index of the nearest \\(\\zeta\\), and decoded "
              "([the decoded scales](#eq-nf4-scales)):\n\n"
            + md_table(["\\(k\\)", "\\(k_2\\)", "\\(\\operatorname{absmax}_k\\)", "\\(\\operatorname{absmax}_k - \\operatorname{offset}\\)",
                        "\\(\\div \\operatorname{absmax}^{(2)}\\)", "\\(\\operatorname{code}^{(8)}_k\\)",
                        "\\(\\zeta_{\\operatorname{code}^{(8)}_k}\\)", "\\(\\widehat{\\operatorname{absmax}}_k\\)",
                        "error"], rows)
            + f"\nOver all {s.size} scales the largest error is {err.max():.1e} ({(err / s).max():.2%} of its scale), "
              f"and every error is within half a gap of \\(\\zeta\\) times its \\(\\operatorname{{absmax}}^{{(2)}}\\): "
              f"{'yes' if np.all(err <= bound * (1 + 1e-6)) else '**no**'}. The scales cost {q.absmax_codes.nbytes} + "
              f"{q.absmax2.nbytes} + 4 bytes instead of {s.nbytes}; the weights' codes are the same bytes "
              f"({'yes' if np.array_equal(q.packed, single.packed) else '**no**'}), and the decoded weights move by "
              f"at most {w_gap:.1e}.\n")


# ---------------------------------------------------------------- bytes of real shapes

def weight_shapes():
    """(where, shape) of every distinct 2-D weight shape of the default model and of preset B, then a layer of
    a large model."""
    out = []
    for name in ("default", "B"):
        seen = {}
        for key, shape in param_shapes(PRESETS[name]).items():
            if len(shape) == 2 and not key.endswith("_emb") and shape not in seen.values():
                seen[key.split(".")[-1]] = shape
        out += [(f"{name}: `{k}`", s) for k, s in seen.items()]  # wq stands for wk, wv and wo
    return out + [("a large model's (d, d)", LARGE)]


def payload_rows():
    rows = []
    for where, shape in weight_shapes():
        w = normal_weight(shape)
        n = w.size
        single, double = nf4.quantize(w, double=False), nf4.quantize(w)
        checks = (single.nbytes == nf4.payload_bytes(n, double=False), double.nbytes == nf4.payload_bytes(n))
        rows.append((where, shape, n, w.nbytes, single.nbytes, nf4.payload_bytes(n, double=False), double.nbytes,
                     nf4.payload_bytes(n), all(checks)))
    return rows


def payload_md():
    rows = payload_rows()
    cells = [[where, sections.shape_text(shape), f"{f32:,}", f"{s_real:,} / {s_formula:,}", f"{d_real:,} / {d_formula:,}",
              f"{8 * s_real / n:.3f}", f"{8 * d_real / n:.3f}", f"{f32 / d_real:.2f}",
              "pass" if ok else "**FAIL**"] for where, shape, n, f32, s_real, s_formula, d_real, d_formula, ok in rows]
    return ("One row per distinct weight shape of the default model and of preset B (`wq` stands for `wk`, `wv` "
            "and `wo`), and a layer of a large model. Each weight quantized for real; the bytes are the `nbytes` of the arrays its `NF4Weight` holds "
            "(`NF4Weight.nbytes`: the packed codes, the scales, the offset) beside [the formula](#eq-nf4-payload) "
            "(`payload_bytes`). The row passes when the two are equal.\n\n"
            + md_table(["weight", "shape", "float32 bytes", "NF4 single: arrays / formula",
                        "NF4 double: arrays / formula", "bits per weight, single", "bits per weight, double",
                        "float32 / double", "arrays = formula"], cells)
            + "\nA small weight pays relatively more: its last block is short and a second-level block and the "
              "offset cost the same however few scales they hold.\n")


# ---------------------------------------------------------------- the error, NF4 against uniform

ERROR_SHAPE = (256, 256)
UNIFORM = np.arange(-7, 8, dtype=np.float32) / np.float32(7)  # symmetric 4-bit absmax code: -7..7 over 7


def errors(w):
    """(error / block absmax) of every weight under NF4 and under the uniform code, same blocks, same scales."""
    flat = w.reshape(-1)
    out = {}
    for name, code in (("NF4", nf4.nf4_code()), ("uniform 4-bit", UNIFORM)):
        codes, absmax = nf4.quantize_blocks(flat, code, BLOCK)
        scale = np.repeat(absmax, BLOCK)[:flat.size]
        out[name] = (code[codes] * scale - flat) / scale
    return out


def error_runs():
    return {"normal": errors(normal_weight(ERROR_SHAPE)), "heavy-tailed": errors(heavy_weight(ERROR_SHAPE))}


def figure_png(runs):
    fig, axes = new_figure(1, 2, figsize=(11, 4))
    bins = np.linspace(-0.2, 0.2, 81)
    for ax, (kind, errs) in zip(axes, runs.items()):
        for name, e in errs.items():
            ax.hist(e, bins=bins, histtype="step", lw=1.4, label=f"{name} (RMS {np.sqrt(np.mean(e ** 2)):.4f})")
        ax.set(yscale="log", title=f"{kind} weights, blocks of {BLOCK}",
               xlabel="error of a weight / its block's absmax", ylabel="weights")
        ax.legend(loc="upper right", fontsize=8)
    fig.suptitle(f"Quantization error of NF4 and of a uniform 4-bit absmax code, {ERROR_SHAPE[0]}×{ERROR_SHAPE[1]} "
                 "float32 weights")
    fig.tight_layout()
    return png(fig)


def error_md(runs):
    cells = []
    for kind, errs in runs.items():
        for name, e in errs.items():
            cells.append([kind, name, f"{np.sqrt(np.mean(e ** 2)):.4f}", f"{np.mean(np.abs(e)):.4f}",
                          f"{np.abs(e).max():.4f}", f"{np.mean(e == 0):.1%}"])
    worst = {name: max(np.abs(errs[name]).max() for errs in runs.values()) for name in ("NF4", "uniform 4-bit")}
    ratio = {kind: np.sqrt(np.mean(errs["uniform 4-bit"] ** 2) / np.mean(errs["NF4"] ** 2)) for kind, errs in runs.items()}
    return (f"Both codes quantize the same {ERROR_SHAPE[0]} × {ERROR_SHAPE[1]} weights with the same blocks of "
            f"{BLOCK} and the same absmax (`quantize_blocks` with either table); only the 16 values differ. The "
            "uniform code is the symmetric one of absmax int4, \\(\\{-7, \\ldots, 7\\}/7\\). The normal weights are "
            f"N(0, 0.02²); the heavy-tailed ones a Student-t with 4 degrees of freedom, standing in for a trained "
            f"weight whose rare large entries set its blocks' absmax (seed {SEED} for both). Errors are divided by "
            "the block's absmax, so the two kinds of weight read on one scale.\n\n"
            f"![Histograms of the error over the block's absmax for NF4 and the uniform code](nf4/{FIGURE})\n\n"
            + md_table(["weights", "code", "RMS error / absmax", "mean |error| / absmax", "largest", "exact"], cells)
            + "\nThe uniform code's RMS error over NF4's: "
            + ", ".join(f"{r:.2f} on the {kind} weights" for kind, r in ratio.items())
            + f". NF4's largest error is the larger one, {worst['NF4']:.4f} against {worst['uniform 4-bit']:.4f}: its "
              f"widest gap ({np.diff(nf4.nf4_code()).max():.4f}, between its two lowest values) is wider than the uniform "
              f"code's ({np.diff(UNIFORM).max():.4f}), but few weights lie that far out. The column *exact* counts the "
              f"weights decoded without error: each block's absmax entry (one in {BLOCK}), and NF4's exact 0 only where a "
              "weight is 0.\n")


# ---------------------------------------------------------------- bitsandbytes

def bitsandbytes_md():
    bnb = functional()
    if bnb is None:
        return ("bitsandbytes is not installed on the machine that built this page, so this comparison was not "
                "run (`pip install bitsandbytes` adds it; `tests/unit/test_nf4.py` skips the same comparison without "
                "it).\n")
    rows = []
    for device in bnb_devices():
        rows += [[device, "tables", *cells(c)] for c in bnb_tables(bnb, device)]
        for shape, block in BNB_SHAPES:
            w = normal_weight(shape, seed=shape[0])
            label = f"{sections.shape_text(shape)}, \\(n_b\\) = {block}"
            rows += [[device, label, *cells(c)] for c in (*compare_single(bnb, w, block, device),
                                                           *compare_double(bnb, w, block, device))]
    missing = "" if "cuda" in bnb_devices() else " CUDA: not available on the build machine."
    return (f"bitsandbytes {package_version('bitsandbytes')} with torch {package_version('torch')}: "
            "`quantize_4bit(w, blocksize, quant_type=\"nf4\", compress_statistics=...)` and `dequantize_4bit`, "
            "run at build time on the same float32 weights (N(0, 0.05²), seeded by the shape's first size) as "
            f"`quantize` and `dequantize`. Devices: {', '.join(bnb_devices())}.{missing} Every difference is "
            "counted; a row passes when there is none or when each is the allowed one, checked, not assumed.\n\n"
            + md_table(["device", "input", "compared", "elements", "differ", "why", "result"], rows))


def cells(c):
    return [c.what, f"{c.elements:,}", f"{c.differ:,}", c.reason, "pass" if c.explained else "**FAIL**"]


def generate(context):
    runs = error_runs()
    return {"why": why_md(), "code-table": code_table_md(), "symbols": symbols_md(), "example": example_md(),
            "double": double_md(), "payload": payload_md(), "error": error_md(runs), FIGURE: figure_png(runs),
            "bitsandbytes": bitsandbytes_md(), "layer": layer_md(), "gradcheck": gradcheck_md()}
