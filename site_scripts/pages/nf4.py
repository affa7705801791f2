"""Generator of the NF4 page (docs/finetuning/nf4.md): its values and tables. What the scales cost, the code
table rebuilt from its equation, one block quantized by hand, double quantization worked, the bytes of real
weight shapes, the symbol table; the levels and the error against a uniform code with their pictures
(site_scripts/pages/_nf4_levels.py), the comparison with bitsandbytes (_nf4_bnb.py) and the NF4 linear layer
(_nf4_layer.py).

Every number is computed here from transformer/nf4.py; where the page recomputes something by hand (a
quantile, a nearest index, a byte), the generator compares it with what the code returns and stops on a
disagreement."""

import inspect
from statistics import NormalDist

import numpy as np

from transformer import nf4
from transformer.config import PRESETS
from transformer.model import param_shapes
from transformer.quantized_linear import ROWS

from .. import sections
from ..common import md_table
from ..examples import SEED, default_note, default_run
from . import _nf4_bnb, _nf4_layer, _nf4_levels
from ._nf4_levels import SIGMA, normal_weight

DEFAULTS = {k: v.default for k, v in inspect.signature(nf4.quantize).parameters.items() if k != "w"}
BLOCK, BLOCK2 = DEFAULTS["block_size"], DEFAULTS["block_size2"]
EXAMPLE_BLOCK = 8  # the hand-worked block: 8 weights, 4 bytes
LARGE = (4096, 4096)  # a weight of a large model, for the byte table


def hexes(packed):
    return " ".join(f"`{b:02X}`" for b in packed)


# ---------------------------------------------------------------- what the scales cost

def bits_per_weight(n, **kw):
    return 8 * nf4.payload_bytes(n, **kw) / n


def why():
    n = LARGE[0] * LARGE[1]
    single, double = nf4.payload_bytes(n, double=False), nf4.payload_bytes(n)
    rows = [["float32", f"{4 * n:,}", "32"],
            ["NF4, one float32 absmax per block", f"{single:,}", f"{bits_per_weight(n, double=False):.3f}"],
            ["NF4, double-quantized scales", f"{double:,}", f"{bits_per_weight(n):.3f}"]]
    return md_table(["stored as", "bytes", "bits per weight"], rows), {
        "block": BLOCK, "block2": BLOCK2, "single_bits": 32 / BLOCK, "double_bits": 8 / BLOCK + 32 / (BLOCK * BLOCK2),
        "large": list(LARGE), "saved": single - double, "saved_share": (single - double) / single}


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


def code_table():
    """(tables of ν and of ζ's decades, values)."""
    rows, code = code_rows(), nf4.nf4_code()
    cells = [[j, "—" if p is None else f"{p:.7f}", f"{q:+.6f}", f"{ours:+.7f}", f"{table:+.7f}",
              "—" if j == len(rows) - 1 else f"{code[j + 1] - code[j]:.4f}"] for j, p, q, ours, table in rows]
    zeta = nf4.dynamic_code()
    dyn_cells = [[e, n, f"{lo:.3e}", f"{hi:.3e}", f"{step:.1e}"] for e, n, lo, hi, step in dynamic_rows()]
    rebuilt = np.sort(np.concatenate([[0.0, 1.0], *[sign * decade(e) for e in DECADES for sign in (1, -1)]]))
    tables = {"code_table": md_table(["\\(j\\)", "probability", "\\(\\pm\\Phi^{-1}\\)", "\\(\\nu_j\\) by the equation",
                                      "`nf4_code()[j]`", "\\(\\nu_{j+1} - \\nu_j\\)"], cells),
              "dynamic": md_table(["\\(e\\)", "values", "smallest", "largest", "spacing"], dyn_cells)}
    return tables, {"p_edge": nf4.NF4_OFFSET, "midpoint": (1 - 1 / (2 * 15) + 1 - 1 / (2 * 16)) / 2,
                    "equal": sum(bool(ours == table) for *_, ours, table in rows), "n": len(rows),
                    "zero": int(np.argmin(np.abs(code))), "zeta": zeta.size, "rebuilt": rebuilt.size,
                    "zeta_gap": float(np.abs(rebuilt - zeta).max() / np.abs(zeta).max())}


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

def example():
    """(table, values) of one block quantized by hand beside what the code stores; an error if they disagree."""
    w = normal_weight(EXAMPLE_BLOCK)
    q, code = nf4.quantize(w, EXAMPLE_BLOCK, double=False), nf4.nf4_code()
    absmax = np.abs(w).max()
    scaled = w / absmax
    nearest = np.abs(scaled[:, None] - code[None, :]).argmin(axis=1)  # by brute force, not searchsorted
    codes, back = nf4.unpack(q.packed, w.size), nf4.dequantize(q)
    by_hand = [16 * int(nearest[2 * m]) + int(nearest[2 * m + 1]) for m in range(w.size // 2)]
    if not (np.array_equal(nearest, codes) and by_hand == q.packed.tolist() and q.absmax[0] == absmax):
        raise RuntimeError("the NF4 page's block by hand disagrees with what quantize stored")
    cells = [[i, f"{w[i]:+.6f}", f"{scaled[i]:+.4f}", nearest[i], f"{code[nearest[i]]:+.4f}", codes[i],
              f"{back[i]:+.6f}", f"{back[i] - w[i]:+.1e}"] for i in range(w.size)]
    theta, hat = "\\(\\theta_i\\)", "\\(\\hat{\\theta}_i\\)"
    table = md_table(["\\(i\\)", theta, "\\(\\theta_i / \\operatorname{absmax}\\)", "nearest \\(j\\), by hand",
                      "\\(\\nu_j\\)", "code stored", hat, "\\(\\hat{\\theta}_i - \\theta_i\\)"], cells)
    top = int(np.argmax(np.abs(w)))
    return table, {
        "n": EXAMPLE_BLOCK, "sigma": SIGMA, "seed": SEED, "absmax": float(absmax), "stored": float(q.absmax[0]),
        "bytes_by_hand": [f"16·{nearest[2 * m]} + {nearest[2 * m + 1]} = {b} = `{b:02X}`"
                          for m, b in enumerate(by_hand)],
        "packed": hexes(q.packed), "code_bytes": q.packed.nbytes, "scale_bytes": q.absmax.nbytes,
        "error": float(np.abs(back - w).max()), "bound": float(absmax * np.diff(code).max() / 2),
        "top_error": float(abs(back[top] - w[top]))}


# ---------------------------------------------------------------- double quantization worked

DOUBLE_SHAPE = (256, 128)  # 512 scales: two second-level blocks at the defaults
DOUBLE_SHOWN = 4  # scales shown from each second-level block


def double():
    """(the two tables, values) of double quantization on one weight."""
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
    second = md_table(["\\(k_2\\)", "scales", "\\(\\operatorname{absmax}^{(2)}_{k_2}\\)"],
                      [[k2, min(q.block_size2, s.size - k2 * q.block_size2), f"{a:.6f}"] for k2, a in enumerate(q.absmax2)])
    scales = md_table(["\\(k\\)", "\\(k_2\\)", "\\(\\operatorname{absmax}_k\\)",
                       "\\(\\operatorname{absmax}_k - \\operatorname{offset}\\)", "\\(\\div \\operatorname{absmax}^{(2)}\\)",
                       "\\(\\operatorname{code}^{(8)}_k\\)", "\\(\\zeta_{\\operatorname{code}^{(8)}_k}\\)",
                       "\\(\\widehat{\\operatorname{absmax}}_k\\)", "error"], rows)
    return {"double_second": second, "double": scales}, {
        "shape": list(DOUBLE_SHAPE), "sigma": SIGMA, "seed": SEED, "scales": s.size, "blocks2": q.absmax2.size,
        "block2": q.block_size2, "offset": float(q.offset), "shown": DOUBLE_SHOWN, "error": float(err.max()),
        "error_share": float((err / s).max()), "worst_of_bound": float((err / bound).max()),
        "codes8_bytes": q.absmax_codes.nbytes, "absmax2_bytes": q.absmax2.nbytes, "single_bytes": s.nbytes,
        "codes_differ": int(np.count_nonzero(q.packed != single.packed)),
        "weight_gap": float(np.abs(nf4.dequantize(q) - nf4.dequantize(single)).max())}


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
        single, double_ = nf4.quantize(w, double=False), nf4.quantize(w)
        checks = (single.nbytes == nf4.payload_bytes(n, double=False), double_.nbytes == nf4.payload_bytes(n))
        rows.append((where, shape, n, w.nbytes, single.nbytes, nf4.payload_bytes(n, double=False), double_.nbytes,
                     nf4.payload_bytes(n), all(checks)))
    return rows


def payload():
    rows = payload_rows()
    cells = [[where, sections.shape_text(shape), f"{f32:,}", f"{s_real:,} / {s_formula:,}", f"{d_real:,} / {d_formula:,}",
              f"{8 * s_real / n:.3f}", f"{8 * d_real / n:.3f}", f"{f32 / d_real:.2f}",
              "pass" if ok else "**FAIL**"] for where, shape, n, f32, s_real, s_formula, d_real, d_formula, ok in rows]
    table = md_table(["weight", "shape", "float32 bytes", "NF4 single: arrays / formula",
                      "NF4 double: arrays / formula", "bits per weight, single", "bits per weight, double",
                      "float32 / double", "arrays = formula"], cells)
    return table, {"rows": len(rows), "passed": sum(ok for *_, ok in rows)}


def generate(context):
    why_table, why_values = why()
    code_tables, code_values = code_table()
    example_table, example_values = example()
    double_tables, double_values = double()
    payload_table, payload_values = payload()
    levels_png, shares_table, levels_values = _nf4_levels.levels()
    runs = _nf4_levels.error_runs()
    error_table, error_values = _nf4_levels.error_table(runs)
    bnb_table, bnb_values = _nf4_bnb.comparison(normal_weight)
    layer_tables, layer_values = _nf4_layer.layer()
    gradcheck_table, gradcheck_values = _nf4_layer.gradcheck()
    values = {"why": why_values, "code": code_values, "example": example_values, "double": double_values,
              "payload": payload_values, "levels": levels_values, "error": error_values, "bnb": bnb_values,
              "layer": layer_values, "gc": gradcheck_values}
    return {"values": values, "why": why_table, **code_tables, "block": example_table, **double_tables,
            "payload": payload_table, "levels.png": levels_png, "shares": shares_table, "error": error_table,
            "error.png": _nf4_levels.error_png(runs), "bitsandbytes": bnb_table, **layer_tables,
            "symbols": symbols_md(), "gradcheck": gradcheck_table}
