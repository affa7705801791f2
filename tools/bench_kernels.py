"""Benchmark: the layout choices of the training step's kernels, each against the plain way, on the arrays of
one shard of `tools/bench_step.py`'s configs (one core, BLAS on one thread, as `transformer/parallel.py` runs a
shard).

Each row times the code as the package has it (`ours`) and the plain alternative its comment names, in
alternation, and gives the median of each, their ratio and whether both give the same bits (else the largest
gap). The comments in the code point here:

- the softmax over scores seen through a transposed view (`attention_forward`) against scores stored row by row;
- the causal mask stored column by column, like those scores, against a row-major mask;
- the token table's gradient adding one entry per index (`embedding_backward`) against one row per index;
- the global norm computing g / s once per gradient (`global_norm`) against computing it twice;
- a bias's gradient, the sum of the rows of dY, as the product 1ᵀ dY (`linear_backward`, `layer_norm_backward`)
  against dY.sum(axis=0);
- LayerNorm's row means from einsum's row sums (`layer_norm_forward`, `layer_norm_backward`) against x.mean.

    python -m tools.bench_kernels [--repeats 300] [--configs A B]
    python -m tools.bench_kernels --step [--rounds 7] [--configs A B]

`--step` measures what each trick is worth to a whole step: the first shard's loss and gradients
(`loss_and_grads`, the work one core does in a training step of tools/bench_step.py's config) as the package
computes it and with the trick undone (its lines replaced by the plain way, in every function that uses it, by
swapping the functions' code in this process), in alternating rounds; the ratio is plain / ours, with its range
over the rounds, and the losses of both.
"""

import argparse
import contextlib
import importlib
import inspect
import math
import statistics
import time
from pathlib import Path

import numpy as np


from tools.bench_step import BATCH
from tools.mutant_catalogue import edit
from tools.mutants import apply_edit
from transformer.attention import causal_mask
from transformer.config import PRESETS
from transformer.embedding import embedding_backward
from transformer.memory import keep_freed_memory
from transformer.model import init_params, loss_and_grads
from transformer.optim import global_norm
from transformer.softmax import softmax_forward

SHARDS = 2  # the batch of bench_step's config is cut in two on 2 cores: one shard's arrays


def shard_arrays(name, seed=0):
    """The arrays one shard of config `name` works on: queries and keys (B, H, T, dh), the ids (B, T), the
    embedding gradient (B, T, d) and a gradient for every parameter, float32."""
    cfg = PRESETS[name]
    B, T, d, H = BATCH[name] // SHARDS, cfg.context_len, cfg.emb_dim, cfg.num_heads
    rng = np.random.default_rng(seed)
    q, k = (rng.standard_normal((B, H, T, d // H), dtype=np.float32) for _ in range(2))
    ids = rng.integers(0, cfg.vocab_size, (B, T))
    dx = rng.standard_normal((B, T, d), dtype=np.float32)
    grads = {n: rng.standard_normal(p.shape, dtype=np.float32) for n, p in init_params(cfg, 0, np.float32).items()}
    return cfg, q, k, ids, dx, grads


def token_grad_by_rows(dx, ids, vocab_size):
    """The token table's gradient with one row index per position: the plain np.add.at."""
    d = dx.shape[-1]
    out = np.zeros((vocab_size, d), dtype=dx.dtype)
    np.add.at(out, ids.reshape(-1), dx.reshape(-1, d))
    return out


def global_norm_scaling_twice(grads):
    """`global_norm` as it was written before: each term computes g / s twice, once per factor."""
    largest = max(float(np.max(np.abs(g))) for g in grads.values())
    s = math.ldexp(1.0, math.frexp(largest)[1] - 1)
    return s * math.sqrt(sum(float(np.vdot(g / s, g / s)) for g in grads.values()))


def comparisons(name):
    """[(what, ours, plain)] for config `name`: two functions of no argument that compute the same thing."""
    cfg, q, k, ids, dx, grads = shard_arrays(name)
    T, d = cfg.context_len, cfg.emb_dim
    rows = dx.reshape(-1, d)  # (B*T, d): the gradient of a layer's output, one row per position
    mask = causal_mask(T, np.dtype(np.float32), column_major=True)  # as attention_forward adds it
    row_major_mask = causal_mask(T, np.dtype(np.float32))
    by_columns = (k @ q.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2) + mask  # as attention_forward makes them
    by_rows = np.ascontiguousarray(by_columns)  # the same scores, stored row by row
    mine, theirs = by_columns.copy(order="K"), by_columns.copy(order="K")  # adding the mask again changes nothing
    return [
        ("softmax of the scores", lambda: softmax_forward(by_columns.copy(order="K"))[0],
         lambda: softmax_forward(by_rows.copy())[0]),
        ("causal mask added to the scores", lambda: np.add(mine, mask, out=mine),  # in place, as the code does
         lambda: np.add(theirs, row_major_mask, out=theirs)),
        ("token table's gradient", lambda: embedding_backward(dx, (ids, (cfg.vocab_size, cfg.emb_dim),
                                                                    (T, cfg.emb_dim)))[0],
         lambda: token_grad_by_rows(dx, ids, cfg.vocab_size)),
        ("global norm", lambda: global_norm(grads), lambda: global_norm_scaling_twice(grads)),
        ("a bias's gradient, 1ᵀ dY", lambda: np.ones(len(rows), dtype=rows.dtype) @ rows,
         lambda: rows.sum(axis=0)),
        ("LayerNorm's row means", lambda: np.einsum("...i->...", dx)[..., None] / d,
         lambda: dx.mean(axis=-1, keepdims=True)),
    ]



ATT, LN = "transformer/attention.py:attention_forward", "transformer/layernorm.py:layer_norm_{}ward"
# Each layout trick as the edits that undo it (tools/mutant_catalogue.py's edit: the text as the package has it,
# then the plain way).
TRICKS = (
    ("scores seen through a transposed view, the mask column by column", (
        edit(ATT, "(k @ q_scaled.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)", "q_scaled @ k.transpose(0, 1, 3, 2)"),
        edit(ATT, "column_major=True", "column_major=False"))),
    ("LayerNorm's row means by einsum", (
        edit(LN.format("for"), 'np.einsum("...i->...", x)[..., None] / d', "x.mean(axis=-1, keepdims=True)"),
        edit(LN.format("for"), 'np.einsum("...i,...i->...", xhat, xhat)[..., None] / d',
             "(xhat * xhat).mean(axis=-1, keepdims=True)"),
        edit(LN.format("back"), 'np.einsum("...i->...", dxhat)[..., None] / d', "dxhat.mean(axis=-1, keepdims=True)"),
        edit(LN.format("back"), 'np.einsum("...i,...i->...", dxhat, xhat)[..., None] / d',
             "(dxhat * xhat).mean(axis=-1, keepdims=True)"))),
    ("a bias's gradient as 1ᵀ dY", (
        edit("transformer/linear.py:linear_backward", "np.ones(len(dy2), dtype=dy2.dtype) @ dy2", "dy2.sum(axis=0)"),
        edit(LN.format("back"), "np.ones(len(dy2), dtype=dy2.dtype) @ dy2", "dy2.sum(axis=0)"))),
    ("the token table's gradient entry by entry", (
        edit("transformer/embedding.py:embedding_backward", "np.add.at(dtok_emb.reshape(-1), entries, dx.reshape(-1))",
             "np.add.at(dtok_emb, ids.reshape(-1), dx.reshape(-1, d))"),)),
)


@contextlib.contextmanager
def undone(edits):
    """The package with `edits` applied (tools/mutants.py's apply_edit, to the text of each function they name):
    each edited function's code is swapped in place, so every caller, whatever name it imported the function
    under, runs the plain way; restored on leaving."""
    sources = {}
    for e in edits:
        fn = getattr(importlib.import_module(Path(e.path).with_suffix("").as_posix().replace("/", ".")), e.function)
        sources[fn] = apply_edit(sources.get(fn) or inspect.getsource(fn), e)[0]
    saved = {fn: fn.__code__ for fn in sources}
    try:
        for fn, text in sources.items():
            namespace = {}
            exec(compile(text, f"<{fn.__name__}, trick undone>", "exec"), fn.__globals__, namespace)
            fn.__code__ = namespace[fn.__name__].__code__
        yield
    finally:
        for fn, code in saved.items():
            fn.__code__ = code


def step_rows(name, rounds, calls=5):
    """One line per trick: the median seconds of one shard's loss and gradients with it and without it (each round
    the median of `calls` calls, the two alternating), plain / ours with its range over the rounds, both losses."""
    cfg, _, _, ids, _, _ = shard_arrays(name)
    params = init_params(cfg, seed=0, dtype=np.float32)
    targets = np.roll(ids, -1, axis=1)

    def shard():
        return loss_and_grads(params, ids, targets, cfg)[0]

    lines = []
    for what, edits in TRICKS:
        ours, plain, ratios = [], [], []
        for r in range(rounds):
            for variant in ((False, True) if r % 2 == 0 else (True, False)):  # alternate which goes first
                with undone(edits) if variant else contextlib.nullcontext():
                    (plain if variant else ours).append(median_seconds(shard, calls))
            ratios.append(plain[-1] / ours[-1])
        with undone(edits):
            plain_loss = shard()
        lines.append(f"  {what:<62} ours {statistics.median(ours) * 1e3:7.1f} ms   plain "
                     f"{statistics.median(plain) * 1e3:7.1f} ms   plain/ours {statistics.median(ratios):5.3f} "
                     f"({min(ratios):.3f} to {max(ratios):.3f})   losses {shard():.6f} / {plain_loss:.6f}")
    return lines


def one_blas_thread():
    """BLAS on one thread for the block, as in a shard (threadpoolctl, of the `bench` extra); without
    threadpoolctl, BLAS keeps its threads and a line says so."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        print("threadpoolctl is not installed (pip install -e '.[bench]'): BLAS keeps its own threads")
        return contextlib.nullcontext()
    return threadpool_limits(1)


def median_seconds(f, repeats):
    """The median time of `repeats` calls of f, after one untimed call."""
    f()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def gap_text(a, b):
    """"same bits", or the largest gap between two results (arrays or floats)."""
    a, b = np.asarray(a), np.asarray(b)
    if np.array_equal(a, b):
        return "same bits"
    return f"largest gap {float(np.max(np.abs(a - b))):.1e}"


def rows(name, repeats):
    """One line per comparison: medians (us) of ours and the plain way, their ratio, whether they agree."""
    lines = []
    for what, ours, plain in comparisons(name):
        times = {"ours": [], "plain": []}
        for _ in range(3):  # alternate, so that a slow moment of the machine falls on both
            times["ours"].append(median_seconds(ours, repeats))
            times["plain"].append(median_seconds(plain, repeats))
        a, b = (statistics.median(times[w]) for w in ("ours", "plain"))
        lines.append(f"  {what:<34} ours {a * 1e6:8.1f} us   plain {b * 1e6:8.1f} us   "
                     f"{b / a:4.1f}x faster   {gap_text(ours(), plain())}")
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=300, help="timed calls per median")
    parser.add_argument("--configs", nargs="+", default=["A", "B"], choices=sorted(BATCH))
    parser.add_argument("--step", action="store_true", help="each trick's worth to one shard's whole step")
    parser.add_argument("--rounds", type=int, default=7, help="with --step: alternating rounds per trick")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.rounds < 1:
        parser.error("--repeats and --rounds must be at least 1")
    keep_freed_memory()
    with one_blas_thread():
        for name in args.configs:
            cfg = PRESETS[name]
            print(f"config {name}, one shard of {BATCH[name] // SHARDS} windows (T={cfg.context_len}, "
                  f"d={cfg.emb_dim}, H={cfg.num_heads}), float32, one thread"
                  + (": loss and gradients of the shard, with each trick and without" if args.step else ":"))
            for line in (step_rows(name, args.rounds) if args.step else rows(name, args.repeats)):
                print(line, flush=True)


if __name__ == "__main__":
    main()
