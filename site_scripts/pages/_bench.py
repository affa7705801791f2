"""The decoding benchmark of tools/bench_decode.py on the KV cache page, drawn and tabulated.

Timings differ from run to run, so the measurements are kept in build/cache/ under a key of the code they run
(the benchmark, and the transformer units it reaches), the numpy version and the cells measured; a page rerun
with nothing changed shows the same numbers. The quick build (SITE_QUICK=1) measures fewer cells.
"""

import io
import json
import os
from dataclasses import asdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import NullLocator  # noqa: E402

from tools import bench_decode as bench  # noqa: E402

from .. import depends, sections  # noqa: E402
from ..common import CACHE, ROOT, cached_json, hash_parts, mode, numpy_version  # noqa: E402
from ..examples import collapsed  # noqa: E402

QUICK = {"contexts": (32, 64), "requests": (1, 4), "rounds": 1}
SOURCE = ROOT / "tools" / "bench_decode.py"


def cells():
    return QUICK if mode() == "quick" else {"contexts": bench.CONTEXTS, "requests": bench.REQUESTS,
                                            "rounds": bench.ROUNDS}


def timed(name, source, compute, *parts):
    """compute()'s JSON result, kept in build/cache/<name>-<mode>.json under a key of `source` (the file that
    times), the transformer units it reaches, the numpy version and `parts`: a timing is measured once per
    change of the code it times, so that a rerun with nothing changed prints the same numbers."""
    key = hash_parts(source.read_text(), depends.units_text(depends.page_units(source)), numpy_version(), *parts)
    return cached_json(CACHE / f"{name}-{mode()}.json", key, compute)


def measurements():
    """Every Measurement of the cells, from the cache while the code it ran is unchanged."""
    chosen = cells()
    stored = timed("bench_decode", SOURCE, lambda: [asdict(m) for m in bench.measure_all(**chosen)],
                   json.dumps(chosen, sort_keys=True))
    return [bench.Measurement(**m) for m in stored]


def figure_svg(results):
    """Left: tokens per second against context, one line per strategy, one request. Right: at the largest
    context, paged one by one against paged batched, per number of requests."""
    plt.rcParams.update({"svg.hashsalt": "bench-decode", "svg.fonttype": "none"})
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8), facecolor="white")
    contexts = sorted({m.context for m in results})
    for strategy in bench.STRATEGIES:
        line = [m for m in results if m.strategy == strategy and m.requests == 1]
        left.plot([m.context for m in line], [m.tokens_per_second for m in line], marker="o", label=strategy)
    left.set(xscale="log", yscale="log", xlabel="context (positions)", ylabel="new tokens per second",
             title="one request")
    left.set_xticks(contexts, [str(c) for c in contexts])
    left.xaxis.set_minor_locator(NullLocator())
    left.legend(fontsize=8)
    top, counts = contexts[-1], sorted({m.requests for m in results})
    for shift, strategy in ((-0.2, "paged one by one"), (0.2, "paged batched")):
        heights = [next(m.tokens_per_second for m in results if (m.strategy, m.context, m.requests) ==
                        (strategy, top, n)) for n in counts]
        right.bar([i + shift for i in range(len(counts))], heights, width=0.4, label=strategy)
    right.set_xticks(range(len(counts)), [f"{n} request{'s' if n > 1 else ''}" for n in counts])
    right.set(ylabel="new tokens per second", title=f"context {top}: one by one or batched")
    right.legend(fontsize=8)
    fig.tight_layout()
    out = io.StringIO()
    fig.savefig(out, format="svg", metadata={"Date": None})
    plt.close(fig)
    svg = out.getvalue()
    svg = svg[svg.index("<svg"):].replace("<svg ", '<svg style="max-width: 100%; height: auto" ', 1)
    return '<div class="bench-figure">\n' + svg.strip() + "\n</div>\n"


def table_md(results):
    rows = [[m.context, m.requests, m.strategy, m.tokens, f"{m.seconds:.3f}", f"{m.tokens_per_second:,.0f}",
             "-" if m.bytes_per_token is None else f"{m.bytes_per_token:,.0f}"] for m in results]
    return sections.md_table(["context", "requests", "strategy", "new tokens", "seconds", "tokens/s",
                              "cache bytes per position"], rows)


def bars_md(results):
    lines = bench.bars(results)
    if not lines:
        chosen = cells()
        return (f"This build measured contexts {list(chosen['contexts'])} and {list(chosen['requests'])} requests "
                "only (the quick build); the issue's bars, at a context of 256 and for 16 requests, are measured "
                "by the full build and by `python -m tools.bench_decode`.\n")
    return ("The bars of the issue, as `bench_decode.bars` reads them off this run:\n\n"
            + "\n".join(f"- {line.removeprefix('bar: ')}" for line in lines) + "\n")


def fragments():
    results = measurements()
    cfg = bench.CONFIG
    machine = (f"Measured on the build machine ({os.cpu_count()} CPU cores, numpy {numpy_version()}) when this "
               "page's code last changed; times depend on the machine and on whatever else it was running, so "
               "read the ratios, not the absolute rates.")
    setup = (f"`tools/bench_decode.py` with its model (\\(d\\) = {cfg.emb_dim}, \\(H\\) = {cfg.num_heads}, \\(L\\) = "
             f"{cfg.num_layers}, \\(F\\) = {cfg.ff_dim}, \\(T_{{\\max}}\\) set to each context), float32, pages of "
             f"{bench.PAGE_SIZE}: every request has a prompt of half the context and adds the other half; each "
             f"cell is the median of {results[0].rounds} round{'s' if results[0].rounds > 1 else ''}, the "
             "strategies alternating within a round. "
             + machine + "\n\n")
    return {"bench": setup + figure_svg(results) + "\n" + bars_md(results),
            "bench-table": collapsed(f"All {len(results)} measurements", table_md(results))}
