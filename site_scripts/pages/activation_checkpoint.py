"""Generator of the Activation checkpointing page: the values its prose shows (docs/training/activation-checkpointing.md
binds them), its tables and its picture. The tiny example compares the gradients with and without checkpointing
with == and counts the block forwards; the picture traces what a training step holds, block by block, with and
without checkpointing; the table is the memory tool's measurements (tools/memory_policies.py, through
site_scripts/memory.py)."""

import tracemalloc
from contextlib import ExitStack
from pathlib import Path
from unittest import mock

import numpy as np

from tools.memory_policies import owned_bytes
from transformer import activation_checkpoint
from transformer import model as model_module
from transformer.activation_checkpoint import checkpointed_block_backward, checkpointed_block_forward
from transformer.block import BLOCK_KEYS, block_forward, block_params
from transformer.model import forward, init_params, loss_and_grads

from .. import depends, gpt2_cost, memory, sections
from ..common import CACHE, cached_json, hash_parts, md_table, mode, numpy_version
from ..examples import SEED, TINY_IDS, TINY_TARGETS, default_note, default_run, tiny
from ..figures import new_figure, png

PICTURED = ("materialized", "checkpointed")  # the memory tool's policies the picture traces
SHOWN_ENTRY = ("b0.wq", (0, 0))  # the gradient entry the example prints from both runs


# ---------------------------------------------------------------- the tiny example: the same bits

def counted_grads(cfg, dtype):
    """The tiny model's loss and gradients under cfg in dtype, and how many times `block_forward` ran for them."""
    params = init_params(cfg, seed=SEED, dtype=dtype)
    ids, targets = np.array([TINY_IDS]), np.array([TINY_TARGETS])
    with mock.patch.object(activation_checkpoint, "block_forward", wraps=block_forward) as replays:
        loss, grads = loss_and_grads(params, ids, targets, cfg)
    return grads, replays.call_count, loss


def bitwise_rows():
    """Per dtype: parameters compared, those that differ in any bit, the largest difference, block forwards
    through activation_checkpoint with checkpointing."""
    cfg = tiny().cfg
    rows = []
    for dtype in (np.float64, np.float32):
        plain = counted_grads(cfg, dtype)[0]
        checked, calls, _ = counted_grads(cfg.with_(checkpoint_blocks=True), dtype)
        differ = [k for k in plain if not np.array_equal(plain[k], checked[k])]
        gap = max(float(np.abs(plain[k].astype(np.float64) - checked[k]).max()) for k in plain)
        rows.append((np.dtype(dtype).name, len(plain), differ, gap, calls))
    return rows


def example():
    cfg = tiny().cfg
    rows = bitwise_rows()
    table = md_table(["dtype", "parameters", "not bitwise equal (`np.array_equal`)", "largest difference",
                      "`block_forward` calls, checkpointed", "per block"],
                     [[name, n, len(differ), sections.gap_text(gap), calls, f"{calls / cfg.num_layers:g}"]
                      for name, n, differ, gap, calls in rows])
    key, at = SHOWN_ENTRY
    plain, _, loss = counted_grads(cfg, np.float64)
    checked, calls, loss_ckpt = counted_grads(cfg.with_(checkpoint_blocks=True), np.float64)
    values = {"sizes": {"n_v": cfg.vocab_size, "t_max": cfg.context_len, "d": cfg.emb_dim, "h": cfg.num_heads,
                        "l": cfg.num_layers, "f": cfg.ff_dim},
              "arrays": rows[0][1], "differ": sum(len(differ) for _, _, differ, _, _ in rows),
              "gap": max(gap for *_, gap, _ in rows), "calls": calls, "per_block": calls // cfg.num_layers,
              "loss": loss, "loss_ckpt": loss_ckpt, "key": key, "at": list(at),
              "entry": float(plain[key][at]), "entry_ckpt": float(checked[key][at])}
    return table, values


# ---------------------------------------------------------------- the picture: what a step holds, call by call

def traced_step(policy, T):
    """One `loss_and_grads` of the memory tool's model under a policy at length T, traced: for each block call
    (forward, then backward) and each stretch between them, (label, bytes held after it, most bytes held during
    it), above what was held when the step started (the parameters are not counted)."""
    cfg = memory.tool.CONFIG.with_(**memory.tool.POLICIES[policy])
    params = init_params(cfg, memory.tool.SEED, np.float32)
    ids, targets = memory.tool.batch(T)
    names = (("checkpointed_block_forward", "checkpointed_block_backward") if cfg.checkpoint_blocks
             else ("block_forward", "block_backward"))
    events, base = [], []

    def mark(label):
        held, peak = tracemalloc.get_traced_memory()
        events.append((label, held - base[0], peak - base[0]))
        tracemalloc.reset_peak()

    def traced(name, order):
        real, done = getattr(model_module, name), []

        def call(*args, **kwargs):
            mark("between")
            out = real(*args, **kwargs)
            mark(f"b{order[len(done)]} {'forward' if 'forward' in name else 'backward'}")
            done.append(1)
            return out
        return mock.patch.object(model_module, name, call)

    layers = list(range(cfg.num_layers))
    # A first step, untraced, does the allocations that happen once per process (imports, caches): the traced step
    # then counts the step alone, the same bytes in every process, so the picture is the same on every build.
    loss_and_grads(params, ids, targets, cfg)
    tracemalloc.start()
    try:
        base.append(tracemalloc.get_traced_memory()[0])
        tracemalloc.reset_peak()
        with ExitStack() as stack:
            stack.enter_context(traced(names[0], layers))
            stack.enter_context(traced(names[1], layers[::-1]))
            loss_and_grads(params, ids, targets, cfg)
        mark("between")
    finally:
        tracemalloc.stop()
    return stages(events)


def stages(events):
    """The traced events with each stretch between two block calls of one pass folded into the call after it (it
    allocates nothing of its own), and the three others named: the embedding; LN_f, the head and the loss; the
    embeddings' backward."""
    out, names, pending = [], iter(("embedding", "LN_f, head, loss", "embedding backward")), 0
    for i, (label, held, peak) in enumerate(events):
        if label != "between":
            out.append((label, held, max(peak, pending)))
            pending = 0
        elif 0 < i < len(events) - 1 and events[i - 1][0].split()[1] == events[i + 1][0].split()[1]:
            pending = peak
        else:
            out.append((next(names), held, peak))
    return out


def step_traces(T):
    """{policy: traced_step(policy, T)} for the pictured policies. tracemalloc's totals move by a few hundred bytes
    from run to run (Python's free lists), which moves a bar's antialiased edge: kept under a key of the code they
    trace, like the timings, so a rebuild with nothing changed draws the same picture."""
    here = Path(__file__)
    key = hash_parts(here.read_text(), depends.units_text(depends.page_units(here)), numpy_version(), T, PICTURED)
    return cached_json(CACHE / f"checkpoint_traces-{mode()}.json", key,
                       lambda: {policy: traced_step(policy, T) for policy in PICTURED})


def memory_png(traces, T):
    """Grouped bars per stage of the step: the most held during it (light) and what is held after it (dark)."""
    labels = [label for label, _, _ in traces[PICTURED[0]]]
    x, width, mib = np.arange(len(labels)), 0.4, memory.MIB
    fig, ax = new_figure(figsize=(11, 4.2))
    for shift, policy, color in ((-width / 2, PICTURED[0], "tab:blue"), (width / 2, PICTURED[1], "tab:orange")):
        _, held, peak = zip(*traces[policy])
        name = "checkpointed" if policy == "checkpointed" else "not checkpointed"
        ax.bar(x + shift, np.array(peak) / mib, width, color=color, alpha=0.35, label=f"most held during it, {name}")
        ax.bar(x + shift, np.array(held) / mib, width, color=color, label=f"held after it, {name}")
    ax.set_xticks(x, labels, rotation=30, ha="right")
    ax.set_xlabel("stage of one training step (loss_and_grads), in order")
    ax.set_ylabel("MiB above the parameters")
    ax.set_title(f"one training step at T = {T}, traced with tracemalloc")
    ax.legend(fontsize="small")
    return png(fig)


def picture():
    T, cfg = memory.lengths()[-1], memory.tool.CONFIG
    traces = step_traces(T)
    plain, ckpt = traces[PICTURED[0]], traces[PICTURED[1]]
    last_forward = f"b{cfg.num_layers - 1} forward"
    held = {name: next(h for label, h, _ in trace if label == last_forward) for name, trace in (("plain", plain),
                                                                                               ("ckpt", ckpt))}
    first_backward = next(i for i, (label, _, _) in enumerate(plain) if label.endswith("backward"))
    values = {"T": T, "batch": memory.tool.BATCH, "held_plain": held["plain"] / memory.MIB,
              "held_ckpt": held["ckpt"] / memory.MIB, "cache": block_internals(T) / memory.MIB,
              "peak_plain": max(p for *_, p in plain) / memory.MIB, "peak_ckpt": max(p for *_, p in ckpt) / memory.MIB,
              "extra": (plain[first_backward][2] - plain[first_backward - 1][1]) / memory.MIB,
              "extra_ckpt": (ckpt[first_backward][2] - ckpt[first_backward - 1][1]) / memory.MIB}
    values["factor"] = values["peak_plain"] / values["peak_ckpt"]
    return memory_png(traces, T), values


# ---------------------------------------------------------------- what it costs: the memory tool's table

def block_internals(T):
    """Bytes of one block's cache at length T in the memory tool's model (block 0; every block's is the same)."""
    cfg = memory.tool.CONFIG
    params = init_params(cfg, SEED, np.float32)
    ids, _ = memory.tool.batch(T)
    _, cache = forward(params, ids, cfg)
    return owned_bytes(cache.block_caches[0], exclude=params.values())


def measured():
    """The memory tool's table for the plain and the checkpointed policy, and the values its prose reads."""
    found, lengths = memory.measurements(), memory.lengths()
    cfg = memory.tool.CONFIG
    L = cfg.num_layers
    rows, shares, times = [], [], []
    for T in lengths:
        plain, ckpt = found["materialized", T], found["checkpointed", T]
        internals = block_internals(T)
        shares.append((plain.retained - ckpt.retained) / (L * internals))
        times.append(ckpt.seconds / plain.seconds)
        rows.append([T, memory.mib(L * internals), memory.mib(plain.retained), memory.mib(ckpt.retained),
                     f"{shares[-1]:.3f}", memory.mib(plain.step_peak), memory.mib(ckpt.step_peak), f"{times[-1]:.2f}"])
    table = md_table(["\\(T\\)", "block internals (MiB)", "retained (MiB)", "retained, checkpointed (MiB)",
                      "share of the internals cut", "step peak (MiB)", "step peak, checkpointed (MiB)",
                      "time, checkpointed / not"], rows)
    hi = lengths[-1]
    values = {"batch": memory.tool.BATCH, "d": cfg.emb_dim, "h": cfg.num_heads, "l": L, "f": cfg.ff_dim,
              "lengths": list(lengths), "all_lengths": list(memory.tool.LENGTHS), "bound": (L - 1) / L,
              "share_lo": min(shares), "share_hi": max(shares), "time_lo": min(times), "time_hi": max(times),
              "steps": memory.STEPS, "hi": hi,
              "peak_factor": found["materialized", hi].step_peak / found["checkpointed", hi].step_peak}
    return table, values


# ---------------------------------------------------------------- the evidence: symbols, gradient check

def default_caches():
    """Block 0 of the default run: (bytes of its cache, bytes a checkpointed block 0 keeps, and the arrays)."""
    ex = default_run()
    cfg, p, x = ex.cfg, block_params(ex.params, 0), ex.trace["embedding"]
    y, replay = checkpointed_block_forward(x, p, cfg)
    _, cache = block_forward(x, p, cfg)
    return owned_bytes(cache, exclude=p.values()), owned_bytes(replay, exclude=p.values()), (cfg, x, y, replay)


def symbols_md():
    cached, kept, (cfg, x, y, replay) = default_caches()
    dx, _ = checkpointed_block_backward(np.ones_like(y), replay)
    rows = [
        (r"X^{(l)}", "replay.x", replay.x.shape, f"block 0's, the one array it keeps ({kept:,} bytes)"),
        (r"X^{(l+1)}", "y", y.shape),
        (r"\operatorname{Block}_l", "checkpointed_block_forward", "function",
         f"block 0; the cache it drops holds {cached:,} bytes"),
        (r"\partial\ell/\partial X^{(l)}", "dx", dx.shape),
        (r"L", "cfg.num_layers", "int", f"{cfg.num_layers}"),
    ]
    return sections.symbols_md(rows, default_note())


def gradcheck():
    cfg = tiny().cfg
    rows, _ = sections.block_layer_check(checkpointed_block_forward, checkpointed_block_backward, BLOCK_KEYS,
                                         np.random.default_rng(SEED), cfg)
    return sections.gradcheck_table(rows), {"shape": (2, cfg.context_len, cfg.emb_dim)}


def generate(context):
    example_table, example_values = example()
    figure, picture_values = picture()
    measured_table, measured_values = measured()
    gradcheck_table, gradcheck_values = gradcheck()
    cached, kept, _ = default_caches()
    values = {"seed": SEED, "ids": TINY_IDS, "targets": TINY_TARGETS, "example": example_values, "gpt2": gpt2_cost.cited(),
              "picture": picture_values, "measured": measured_values, "gradcheck": gradcheck_values,
              "default": {"cached": cached, "kept": kept}}
    return {"values": values, "memory.png": figure, "bitwise": example_table, "measured": measured_table,
            "symbols": symbols_md(), "gradcheck": gradcheck_table}
