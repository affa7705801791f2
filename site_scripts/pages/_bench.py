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


def speeds(results):
    """How many times as many tokens per second one strategy decoded as another, at the largest context measured:
    each cache against recomputing, for one request; batched steps against one by one, for the most requests."""
    top, most = max(m.context for m in results), max(m.requests for m in results)
    return {"top": top, "most": most,
            "contiguous": bench.speedup(results, "contiguous", "recompute", top, 1),
            "paged": bench.speedup(results, "paged one by one", "recompute", top, 1),
            "batched": bench.speedup(results, "paged batched", "paged one by one", top, most)}


def fragments():
    """The benchmark's figure (an inline SVG) and table, and the values the prose reads."""
    results = measurements()
    cfg, chosen = bench.CONFIG, cells()
    values = {"cores": os.cpu_count(), "numpy": numpy_version(), "d": cfg.emb_dim, "h": cfg.num_heads,
              "l": cfg.num_layers, "f": cfg.ff_dim, "page": bench.PAGE_SIZE, "rounds": results[0].rounds,
              "contexts": list(chosen["contexts"]), "requests": list(chosen["requests"]),
              "all_contexts": list(bench.CONTEXTS), "all_requests": list(bench.REQUESTS), "count": len(results),
              "speed": speeds(results)}
    return {"bench_figure": figure_svg(results), "bench_table": table_md(results)}, values
