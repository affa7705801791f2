"""The NF4 page's numbers on the NF4 linear layer: the tiny example's layer forward and backward group by group,
equal to a dense layer holding the decoded weight, its dx against central differences, and its peak memory
(tracemalloc) beside a dense float32 layer's. Values and tables only; the words are in docs/finetuning/nf4.md.

The peaks move by a few hundred bytes from one process to the next (Python's and numpy's small allocations
depend on what ran before), so they are measured once per change of the code they measure and kept in
build/cache/, as the memory policies are (site_scripts/memory.py): a forced rerun prints the same bytes."""

import gc
import tracemalloc
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from transformer import nf4
from transformer.config import PRESETS
from transformer.linear import linear_backward, linear_forward
from transformer.model import param_shapes
from transformer.quantized_linear import ROWS, nf4_linear_backward, nf4_linear_forward

from .. import depends, sections
from ..common import CACHE, cached_json, hash_parts, md_table, numpy_version
from ..examples import H_STEP, SEED, TINY_IDS, TINY_TARGETS, tiny, weighted_sum
from ..prose import num
from ..tiny_backward import tiny_backward

EQUAL_SHAPE = (200, 48)  # three groups of ROWS rows and a short fourth
EQUAL_ROWS = (1, 7, ROWS, EQUAL_SHAPE[0])  # one row at a time, groups that do not divide the rows, all at once
EQUAL_BAR = 1e-12  # float64: the products are the same, summed in another order
GRAD_SHAPE = (150, 24)
MEMORY_BATCH = 16  # input rows of the memory measurement
WAYS = ("dense float32", "NF4, decoded whole", "NF4, by groups of rows")
EXAMPLE_ROWS = 2  # the tiny example decodes its 4 input rows 2 at a time: two groups
SPREAD = 0.1  # layer_inputs: the spread of the weights drawn for the equality and gradient checks


# ---------------------------------------------------------------- the tiny example's layer, group by group

def by_group(q, rows):
    """(start, stop) of each group of input rows the layer decodes at once."""
    return [(start, min(start + rows, q.shape[0])) for start in range(0, q.shape[0], rows)]


def tiny_layer():
    """(tables, values): block 0's ff1 of the tiny model stored in NF4, run forward and back EXAMPLE_ROWS input
    rows at a time; its upstream gradient is the float model's real ∂ℓ/∂G (tiny_backward's b0.dpre)."""
    ex = tiny()
    w, b, x = ex.params["b0.ff1_w"], ex.params["b0.ff1_b"], ex.trace["b0.ln2"][0]
    q = nf4.quantize(w)
    decoded = nf4.dequantize(q).astype(np.float64)
    y, cache = nf4_linear_forward(x, q, b, EXAMPLE_ROWS)
    dy = tiny_backward().steps["b0.dpre"][0]
    dx = nf4_linear_backward(dy, cache)
    groups = by_group(q, EXAMPLE_ROWS)
    tables = {"layer_x": sections.array_md("A", x, row_label="position"),
              "layer_w": sections.array_md("W_NF4 (input row i \\ output column)", decoded),
              "layer_y": sections.array_md("Y", y, row_label="position"),
              "layer_dy": sections.array_md("∂ℓ/∂Y", dy, row_label="position"),
              "layer_dx": sections.array_md("∂ℓ/∂A", dx, row_label="position")}
    for g, (start, stop) in enumerate(groups):
        group = dy @ decoded[start:stop].T  # columns start..stop-1 of ∂ℓ/∂A
        tables[f"layer_group{g}"] = sections.array_md(f"∂ℓ/∂Y W_NF4[{start}:{stop}]ᵀ", group, row_label="position")
    t, i = (int(n) for n in np.unravel_index(np.abs(dx).argmax(), dx.shape))
    value = dy[t] @ decoded[i]
    if abs(value - dx[t, i]) > 1e-12 * max(1.0, abs(value)):
        raise RuntimeError("the NF4 page's ∂ℓ/∂A by hand disagrees with nf4_linear_backward")
    return tables, {
        "ids": TINY_IDS, "targets": TINY_TARGETS, "shape": list(w.shape), "size": w.size, "block": q.block_size,
        "blocks": len(q.scales()), "rows": EXAMPLE_ROWS, "groups": len(groups),
        "bias_max": float(np.abs(b).max()), "y_gap": float(np.abs(y - (x @ decoded + b)).max()),
        "dy_zeros": int(np.count_nonzero(dy == 0)), "dy_entries": dy.size,
        "t": t, "i": i, "terms": " + ".join(f"{num(a)} × {num(c)}" for a, c in zip(dy[t], decoded[i], strict=True)),
        "value": float(value), "returned": float(dx[t, i]), "dx_gap": float(np.abs(dx - dy @ decoded.T).max()),
        "float_gap": float(np.abs(dx - dy @ w.T).max()), "dx_max": float(np.abs(dy @ w.T).max())}


def layer_inputs(shape, rng, dtype=np.float64):
    """An NF4 weight (double-quantized, of an N(0, 0.1²) draw), a bias, an input batch and an upstream gradient."""
    q = nf4.quantize(rng.standard_normal(shape) * SPREAD)
    b = rng.standard_normal(shape[1]).astype(dtype)
    x = rng.standard_normal((2, 5, shape[0])).astype(dtype)
    dy = rng.standard_normal((2, 5, shape[1])).astype(dtype)
    return q, b, x, dy


def equality_rows():
    """(rows, relative gap of y, of dx) of the NF4 layer against the dense layer holding dequantize(q), float64."""
    from transformer.gradcheck import relative_gap

    q, b, x, dy = layer_inputs(EQUAL_SHAPE, np.random.default_rng(SEED))
    w = nf4.dequantize(q).astype(np.float64)
    y_dense, cache = linear_forward(x, w, b)
    dx_dense = linear_backward(dy, cache)[0]
    out = []
    for rows in EQUAL_ROWS:
        y, nf4_cache = nf4_linear_forward(x, q, b, rows)
        out.append((rows, relative_gap(y, y_dense), relative_gap(nf4_linear_backward(dy, nf4_cache), dx_dense)))
    return out


def equality():
    """(table, values) of the NF4 layer against the dense one, for several group sizes."""
    cells = [[rows, -(-EQUAL_SHAPE[0] // rows), f"{gy:.1e}", f"{gdx:.1e}",
              "pass" if max(gy, gdx) <= EQUAL_BAR else "**FAIL**"] for rows, gy, gdx in equality_rows()]
    table = md_table(["\\(n_{\\mathrm{rows}}\\)", "groups", "\\(Y\\)", "\\(\\partial\\ell/\\partial A\\)",
                      f"both ≤ {EQUAL_BAR:g}"], cells)
    return table, {"shape": list(EQUAL_SHAPE), "seed": SEED, "spread": SPREAD, "bar": EQUAL_BAR}


def gradcheck():
    rng = np.random.default_rng(SEED)
    q, b, x, dy = layer_inputs(GRAD_SHAPE, rng)
    dx = nf4_linear_backward(dy, nf4_linear_forward(x, q, b)[1])
    rows = sections.gradcheck_rows(weighted_sum(dy, nf4_linear_forward, x, q, b), [("dx", dx, x)], H_STEP)
    return sections.gradcheck_table(rows), {"rows": ROWS, "shape": list(GRAD_SHAPE), "x_shape": x.shape, "seed": SEED}


# ---------------------------------------------------------------- memory

@dataclass(frozen=True)
class Memory:
    way: str
    stored: int  # bytes of the weight as kept between steps
    forward: int  # most bytes allocated at once during the forward, above what existed before it
    backward: int  # the same for the backward (dx)


def peak(f):
    """The most bytes numpy and Python allocated at once while f ran, above what was allocated before. The
    garbage collector is run first and held off meanwhile, so that a collection of earlier garbage cannot land
    inside the measurement (it made the bytes differ between builds)."""
    gc.collect()
    gc.disable()
    tracemalloc.start()
    try:
        f()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        gc.enable()


def dense_dx(dy, w):
    return dy @ w.T  # the dense layer's dx; a frozen weight needs no dW


def measure(shape):
    """The three ways of running a frozen linear layer on MEMORY_BATCH float32 rows."""
    rng = np.random.default_rng(SEED)
    w = (rng.standard_normal(shape) * 0.02).astype(np.float32)
    q, b = nf4.quantize(w), np.zeros(shape[1], np.float32)
    x = rng.standard_normal((MEMORY_BATCH, shape[0])).astype(np.float32)
    dy = rng.standard_normal((MEMORY_BATCH, shape[1])).astype(np.float32)
    cache = nf4_linear_forward(x, q, b)[1]
    return [Memory(WAYS[0], w.nbytes, peak(lambda: linear_forward(x, w, b)), peak(lambda: dense_dx(dy, w))),
            Memory(WAYS[1], q.nbytes, peak(lambda: linear_forward(x, nf4.dequantize(q), b)),
                   peak(lambda: dense_dx(dy, nf4.dequantize(q)))),
            Memory(WAYS[2], q.nbytes, peak(lambda: nf4_linear_forward(x, q, b)),
                   peak(lambda: nf4_linear_backward(dy, cache)))]


def measurements():
    """measure() of every shape of memory_shapes(), from build/cache/ while the code it measures is unchanged."""
    here = Path(__file__)
    key = hash_parts(here.read_text(), depends.units_text(depends.page_units(here)), numpy_version(),
                     memory_shapes(), MEMORY_BATCH)
    value = cached_json(CACHE / "nf4_layer_memory.json", key,
                        lambda: [[asdict(m) for m in measure(shape)] for _, shape in memory_shapes()])
    return [[Memory(**m) for m in found] for found in value]


def memory_shapes():
    default, b = param_shapes(PRESETS["default"]), param_shapes(PRESETS["B"])
    return [("default: `ff1_w`", default["b0.ff1_w"]), ("B: `ff1_w`", b["b0.ff1_w"]), ("B: `ff2_w`", b["b0.ff2_w"]),
            ("a tall weight, twice as many inputs as outputs", (1024, 512)), ("a large model's (d, d)", (4096, 4096))]


def memory():
    """(table, values) of the three ways of running a frozen layer, at each shape."""
    rows, below, above, per_group = [], [], [], []
    for (where, shape), found in zip(memory_shapes(), measurements(), strict=True):
        dense, grouped = found[0], found[2]
        worst = max(grouped.forward, grouped.backward)
        (below if worst < dense.stored else above).append(shape)
        per_group.append(worst / (min(ROWS, shape[0]) * shape[1] * 4))
        for m in found:
            total = m.stored + max(m.forward, m.backward)
            rows.append([where, sections.shape_text(shape), m.way, f"{m.stored:,}", f"{m.forward:,}", f"{m.backward:,}",
                         f"{total:,}", f"{total / (dense.stored + max(dense.forward, dense.backward)):.2f}"])
    table = md_table(["weight", "shape", "way", "stored", "forward peak", "backward peak", "at peak",
                      "at peak / dense"], rows)
    return table, {"batch": MEMORY_BATCH, "rows": ROWS, "per_group_lo": min(per_group), "per_group_hi": max(per_group),
                   "below": [f"{r} × {c}" for r, c in below], "above": [f"{r} × {c}" for r, c in above]}


def layer():
    """(tables, values) of the tiny example's layer, the equality check and the memory."""
    tiny_tables, tiny_values = tiny_layer()
    equality_table, equality_values = equality()
    memory_table, memory_values = memory()
    return {**tiny_tables, "equality": equality_table, "memory": memory_table}, {
        "tiny": tiny_values, "equality": equality_values, "memory": memory_values}
