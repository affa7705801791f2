"""The QLoRA page's memory section: the bytes of weights, gradients and AdamW state of full fine-tuning, LoRA
and QLoRA, read from the real arrays and set beside their formula (with their picture); and the peak memory
(tracemalloc) and time of one float32 training step of each. The quick build (SITE_QUICK=1) times the larger
config not at all. Values, tables and the picture only: the words are in docs/finetuning/qlora.md.

The steps' peaks and times are measured once per change of the code they run and kept in build/cache/, as
site_scripts/memory.py keeps the memory policies': a forced rerun of the page prints the same times."""

import statistics
import time
from pathlib import Path

import numpy as np

from transformer.config import PRESETS, ModelConfig
from transformer.finetune import adapter_loss_and_grads, quantize_base, weight_bytes
from transformer.lora import init_adapters
from transformer.model import init_params, loss_and_grads, param_count, param_shapes
from transformer.optim import AdamWConfig, adamw_init, adamw_update, clip_grads
from tools.memory_policies import traced_peak

from .. import depends
from ..common import CACHE, cached_json, hash_parts, md_table, mode, numpy_version
from ..examples import SEED
from ..figures import new_figure, png
from ._qlora_bytes import BLOCK, BLOCK2, LORA, METHODS, Bytes, formula

LARGER = ModelConfig(vocab_size=65, context_len=64, emb_dim=512, num_heads=8, num_layers=8, ff_dim=2048)
CONFIGS = {"default": PRESETS["default"], "A": PRESETS["A"], "B": PRESETS["B"], "d = 512, L = 8": LARGER}
BATCH, T = 4, 32  # the timed step's windows
STEPS = 3  # timed steps (the median is shown)
MIB = 1 << 20


def batch(cfg, B=BATCH, length=T, seed=SEED):
    rng = np.random.default_rng(seed)
    return rng.integers(0, cfg.vocab_size, (B, length)), rng.integers(0, cfg.vocab_size, (B, length))


def setup(cfg, method):
    """(trainable arrays, their AdamW state, the frozen base or None, the step's loss and gradients)."""
    params = init_params(cfg, SEED, np.float32)
    if method == "full":
        return params, adamw_init(params), None, lambda ids, y: loss_and_grads(params, ids, y, cfg)
    base = quantize_base(params) if method == "QLoRA" else params
    adapters = init_adapters(param_shapes(cfg), LORA, seed=SEED, dtype=np.float32)
    return adapters, adamw_init(adapters), base, \
        lambda ids, y: adapter_loss_and_grads(base, adapters, ids, y, cfg, LORA)


def nbytes(arrays):
    return sum(a.nbytes for a in arrays.values())


def measured(cfg, method):
    """The bytes of the real arrays: the model's weights (the frozen base's as stored, and the trainable ones),
    one step's gradients, and the AdamW moments."""
    trainable, state, base, step_grads = setup(cfg, method)
    _, grads = step_grads(*batch(cfg, B=1, length=8))
    weights = nbytes(trainable) + (weight_bytes(base) if base is not None else 0)
    return Bytes(weights, nbytes(grads), nbytes(state["m"]) + nbytes(state["v"]))


def mib(n):
    return f"{n / MIB:.3f}"


def bytes_held():
    """(tables, values, {(config, method): Bytes}) of every config and method: the measured bytes beside the
    formula's, and full fine-tuning's total over QLoRA's."""
    rows, found = [], {}
    for name, cfg in CONFIGS.items():
        for method in METHODS:
            got, want = measured(cfg, method), formula(cfg, method)
            found[name, method] = got
            rows.append([name, method, mib(got.weights), mib(got.grads), mib(got.state), mib(got.total),
                         "equal" if got == want else f"**differs**: {want}"])
    ratios = [[name, f"{found[name, 'full'].total / found[name, 'QLoRA'].total:.1f}",
               f"{found[name, 'full'].total / found[name, 'LoRA'].total:.1f}"] for name in CONFIGS]
    tables = {"bytes": md_table(["config", "method", "weights (MiB)", "gradients (MiB)", "AdamW state (MiB)",
                                 "total (MiB)", "the formula's bytes"], rows),
              "ratios": md_table(["config", "full's total / QLoRA's", "full's total / LoRA's"], ratios)}
    gpt2 = {method.lower(): f"{formula(PRESETS['gpt2'], method).total / MIB:,.0f}" for method in METHODS}
    values = {"rank": LORA.rank, "targets": list(LORA.targets), "block": BLOCK, "block2": BLOCK2,
              "rows": len(rows), "equal": sum(r[-1] == "equal" for r in rows),
              "gpt2": {**gpt2, "params": param_count(PRESETS["gpt2"])}}
    return tables, values, found


def bytes_png(found):
    """Stacked bars of weights, gradients and AdamW state of each method, one panel (its own linear scale) per
    config."""
    fig, axes = new_figure(1, len(CONFIGS), figsize=(12, 3.4))
    parts = (("weights", "weights", "tab:gray"), ("gradients", "grads", "tab:orange"),
             ("AdamW state", "state", "tab:blue"))
    for ax, name in zip(axes, CONFIGS, strict=True):
        bottom = np.zeros(len(METHODS))
        for label, field, colour in parts:
            heights = np.array([getattr(found[name, method], field) / MIB for method in METHODS])
            ax.bar(METHODS, heights, 0.7, bottom=bottom, color=colour, label=label)
            bottom += heights
        ax.set_title(f"config {name}", fontsize=9)
        ax.tick_params(labelsize=8)
    axes[0].set_ylabel("MiB held")
    axes[0].legend(fontsize=8)
    fig.supxlabel("method", fontsize=9)
    axes[0].set_xlabel(" ")  # the shared label is the figure's
    return png(fig)


def peak_and_time(cfg, method):
    """(peak bytes above what the model and the state already hold, median seconds) of one step: loss and
    gradients, the clip, AdamW on the trained arrays."""
    trainable, state, _, step_grads = setup(cfg, method)
    ids, y = batch(cfg)
    opt = AdamWConfig()

    def step():
        _, grads = step_grads(ids, y)
        grads, _ = clip_grads(grads, 1.0)
        adamw_update(trainable, grads, state, opt.lr, opt)

    peak = traced_peak(step)
    times = []
    for _ in range(STEPS):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return peak, statistics.median(times)


def timed_configs():
    return ("A", "B") if mode() == "quick" else ("A", "B", "d = 512, L = 8")


def step_measurements():
    """{config: {method: (peak bytes, median seconds)}}, cached under a key of the code the steps run."""
    here = Path(__file__)
    key = hash_parts(here.read_text(), depends.units_text(depends.page_units(here)), numpy_version(),
                     timed_configs(), [CONFIGS[n] for n in timed_configs()], STEPS, BATCH, T)
    return cached_json(CACHE / f"qlora_steps-{mode()}.json", key,
                       lambda: {n: {m: peak_and_time(CONFIGS[n], m) for m in METHODS} for n in timed_configs()})


def steps():
    """(table, values) of one timed training step of each method at each timed config."""
    rows = []
    measured_steps = step_measurements()
    for name in timed_configs():
        found = measured_steps[name]  # reloaded from the cache with its keys sorted: walk METHODS' order
        for method in METHODS:
            peak, seconds = found[method]
            rows.append([name, method, mib(peak), f"{seconds * 1000:.1f}",
                         f"{seconds / found['full'][1]:.2f}"])
    table = md_table(["config", "method", "step peak (MiB)", "time per step (ms)", "time / full's"], rows)
    return table, {"batch": BATCH, "T": T, "steps": STEPS, "timed": list(timed_configs()),
                   "untimed": [n for n in CONFIGS if n not in timed_configs()]}
