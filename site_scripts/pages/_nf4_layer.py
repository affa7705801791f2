"""The NF4 page's sections on the NF4 linear layer: equal to a dense layer holding the decoded weight, its dx
against central differences, and its peak memory (tracemalloc) beside a dense float32 layer's.

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
from ..examples import H_STEP, SEED, weighted_sum

EQUAL_SHAPE = (200, 48)  # three groups of ROWS rows and a short fourth
EQUAL_ROWS = (1, 7, ROWS, EQUAL_SHAPE[0])  # one row at a time, groups that do not divide the rows, all at once
EQUAL_BAR = 1e-12  # float64: the products are the same, summed in another order
GRAD_SHAPE = (150, 24)
MEMORY_BATCH = 16  # input rows of the memory measurement
WAYS = ("dense float32", "NF4, decoded whole", "NF4, by groups of rows")


def layer_inputs(shape, rng, dtype=np.float64):
    """An NF4 weight (double-quantized, of an N(0, 0.1²) draw), a bias, an input batch and an upstream gradient."""
    q = nf4.quantize(rng.standard_normal(shape) * 0.1)
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


def equality_md():
    cells = [[rows, -(-EQUAL_SHAPE[0] // rows), f"{gy:.1e}", f"{gdx:.1e}",
              "pass" if max(gy, gdx) <= EQUAL_BAR else "**FAIL**"] for rows, gy, gdx in equality_rows()]
    return (f"`nf4_linear_forward` and `nf4_linear_backward` against the dense `linear_forward` and "
            f"`linear_backward` holding `dequantize(q)`, in float64, for a {EQUAL_SHAPE[0]} × {EQUAL_SHAPE[1]} "
            f"weight, a batch of 2 × 5 input rows and a random upstream gradient (seed {SEED}). The gaps are "
            "`relative_gap` (the largest difference over the larger array's largest entry).\n\n"
            + md_table(["\\(n_{\\mathrm{rows}}\\)", "groups", "\\(Y\\)", "\\(\\partial\\ell/\\partial A\\)",
                        f"both ≤ {EQUAL_BAR:g}"], cells)
            + "\nThe grouped products add the same terms in another order, so a gap is rounding, not zero.\n")


def gradcheck_md():
    rng = np.random.default_rng(SEED)
    q, b, x, dy = layer_inputs(GRAD_SHAPE, rng)
    dx = nf4_linear_backward(dy, nf4_linear_forward(x, q, b)[1])
    rows = sections.gradcheck_rows(weighted_sum(dy, nf4_linear_forward, x, q, b), [("dx", dx, x)], H_STEP)
    return (f"The [fake loss](../reference/notation.md#fake-loss) \\(f = \\sum Y \\odot R\\) of `nf4_linear_forward` "
            f"(groups of {ROWS} rows) on a {GRAD_SHAPE[0]} × {GRAD_SHAPE[1]} NF4 weight, an input of shape "
            f"`{x.shape}` and a random \\(R\\) (seed {SEED}). Only \\(\\partial\\ell/\\partial A\\) exists: the weight "
            "and the bias are frozen, and the backward returns dx alone.\n\n" + sections.gradcheck_table(rows))


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
            ("the issue's", (1024, 512)), ("a large model's (d, d)", (4096, 4096))]


def memory_md():
    rows, below, above, per_group = [], [], [], []
    for (where, shape), found in zip(memory_shapes(), measurements(), strict=True):
        dense, grouped = found[0], found[2]
        worst = max(grouped.forward, grouped.backward)
        (below if worst < dense.stored else above).append(f"{sections.shape_text(shape)}")
        per_group.append(worst / (min(ROWS, shape[0]) * shape[1] * 4))
        for m in found:
            total = m.stored + max(m.forward, m.backward)
            rows.append([where, sections.shape_text(shape), m.way, f"{m.stored:,}", f"{m.forward:,}", f"{m.backward:,}",
                         f"{total:,}", f"{total / (dense.stored + max(dense.forward, dense.backward)):.2f}"])
    return (f"Peak bytes measured with tracemalloc on {MEMORY_BATCH} float32 input rows, for three ways of running a "
            "frozen layer: a dense float32 weight; the NF4 weight decoded whole with `dequantize` and then used as a "
            "dense one; and `nf4_linear_forward` / `nf4_linear_backward`. *Stored* is the weight as kept between "
            "steps (the float32 array, or `NF4Weight.nbytes`); the forward and backward columns are the most bytes "
            "allocated at once during the call, output included, above what existed before it; *at peak* adds the "
            "stored bytes to the larger of the two.\n\n"
            + md_table(["weight", "shape", "way", "stored", "forward peak", "backward peak", "at peak",
                        "at peak / dense"], rows)
            + f"\nDecoding whole brings back a float32 copy of the weight, and the temporaries that make it, at every "
              f"call. By groups of {ROWS} rows the largest array is one group's rows, but decoding a group also makes "
              "its scales repeated to its length and its looked-up values: the grouped peak was "
              f"{min(per_group):.1f} to {max(per_group):.1f} times one group's float32 bytes. So it stays below the "
              f"dense weight's own bytes only when the weight has enough groups: below for "
              f"{', '.join(below) or 'no shape measured'}; above for {', '.join(above) or 'no shape measured'}.\n")


def layer_md():
    return ("### Equal to a dense layer holding the decoded weight\n\n" + equality_md()
            + "\n### Peak memory\n\n" + memory_md())
