"""Generator of the "Hand-written backward and autograd" page: the values its prose shows
(docs/verification/autograd.md binds them), its tables and pictures.

The LayerNorm gradient by `layer_norm_backward` and by the tape, the tape's graph drawn from its own nodes, the
tiny model on the tape, what each approach keeps in memory (counted), whether a graph of reference cycles is
freed, and the time of a training step (measured once per change of the code it times, as the benchmark pages
do). The evidence sections come from _autograd_anatomy.py.
"""

import gc
import json

import numpy as np

from tools import autograd_speed
from transformer import autograd as ag
from transformer.autograd_memory import capture_own_output, graph_census, train_steps
from transformer.autograd_model import as_leaves, cross_entropy, fused_layer_norm, layer_norm
from transformer.autograd_model import forward as tape_forward
from transformer.config import PRESETS
from transformer.gradcheck import relative_gap
from transformer.layernorm import layer_norm_backward, layer_norm_forward
from transformer.model import init_params

from .. import sections
from ..common import ROOT, mode
from ..examples import SEED, TINY_IDS, TINY_TARGETS, tiny
from ..figures import new_figure, png
from ._autograd_anatomy import devices_with_engine, gradcheck_md, symbols_md, tiny_part
from ._bench import timed

PAGE = "autograd"
EPS = 1e-5
SPREAD = 0.3  # the LayerNorm example's gain and shift: 1 + SPREAD N(0, 1) and SPREAD N(0, 1)
BATCH, WINDOW = 8, 16  # the default config's training windows
STEPS = 30
MIB = 2 ** 20
FIGURE = "steps.png"


def layer_norm_inputs():
    """A 3 x 4 input with its gain and shift off 1 and 0, and an upstream gradient R."""
    rng = np.random.default_rng(SEED)
    x = rng.standard_normal((3, 4))
    g, b = 1 + SPREAD * rng.standard_normal(4), SPREAD * rng.standard_normal(4)
    return x, g, b, rng.standard_normal((3, 4))


def taped_layer_norm(norm, x, g, b, r, free_graph=True):
    """(leaves, output) of norm on the tape, after backward with the upstream gradient r."""
    leaves = [ag.Tensor(a, requires_grad=True) for a in (x, g, b)]
    out = norm(*leaves, EPS)
    out.backward(r, free_graph=free_graph)
    return leaves, out


def layernorm():
    """dx by layer_norm_backward and by the tape (composed), and each gradient's relative gap to the hand-written
    one, composed and fused through the seam."""
    x, g, b, r = layer_norm_inputs()
    hand = layer_norm_backward(r, layer_norm_forward(x, g, b, EPS)[1])
    leaves, _ = taped_layer_norm(layer_norm, x, g, b, r)
    fused, _ = taped_layer_norm(fused_layer_norm, x, g, b, r)
    rows = []
    for name, h, t, f in zip(("∂f/∂x", "∂f/∂γ", "∂f/∂β"), hand, (t.grad for t in leaves), (t.grad for t in fused)):
        rows.append([name, f"{relative_gap(t, h):.1e}", f"{relative_gap(f, h):.1e}"])
    return {"ln_hand": sections.array_md("dx by layer_norm_backward", hand[0]),
            "ln_tape": sections.array_md("dx by the tape (composed)", leaves[0].grad),
            "ln_gaps": sections.md_table(["Gradient", "composed on the tape", "hand-written VJP through the seam"],
                                         rows)}, {"shape": x.shape}


def graph():
    """The composed LayerNorm's graph as a mermaid flowchart, read from the nodes of a real run."""
    x, g, b, r = layer_norm_inputs()
    leaves, out = taped_layer_norm(layer_norm, x, g, b, r, free_graph=False)
    names = dict(zip(map(id, leaves), ("x", "γ", "β")))
    order = ag.topological_order(out)
    number = {id(node): i for i, node in enumerate(order)}
    lines, constants = ["flowchart LR"], 0
    for node in order:
        label = names.get(id(node), node.op)
        lines.append(f'  n{number[id(node)]}["{label}<br/>{tuple(node.shape)}"]')
        for parent in node.parents:
            if id(parent) in number:
                lines.append(f"  n{number[id(parent)]} --> n{number[id(node)]}")
            else:  # a constant: ε, ½, 1/d
                constants += 1
                value = parent.data.item() if parent.data.size == 1 else "array"
                lines.append(f'  c{constants}(["{value:.4g}"]) -.-> n{number[id(node)]}')
    ops = [node for node in order if id(node) not in names]
    return "```mermaid\n" + "\n".join(lines) + "\n```\n", {"ops": len(ops), "constants": constants}


def census():
    cfg = PRESETS["default"]
    rng = np.random.default_rng(SEED)
    ids, targets = (rng.integers(0, cfg.vocab_size, (BATCH, WINDOW)) for _ in range(2))
    params = init_params(cfg, seed=SEED)
    rows, found = [], []
    for fused in ((), ("layer_norm",), ("layer_norm", "attention")):
        c = graph_census(params, ids, targets, cfg, fused)
        found.append(c)
        rows.append([", ".join(fused) or "nothing (all composed)", c.nodes - c.parameters, c.constants,
                     f"{c.graph_bytes / MIB:.2f}", f"{c.cache_bytes / MIB:.2f}",
                     f"{c.graph_bytes / c.cache_bytes:.1f}", f"{c.grads_peak_bytes / MIB:.2f}",
                     f"{c.grads_kept_peak_bytes / MIB:.2f}"])
    table = sections.md_table(["Fused through the seam", "Operation nodes", "Constants", "Graph (MiB)",
                               "Hand-written cache (MiB)", "Ratio", "Gradients at most, dropped (MiB)", "kept (MiB)"],
                              rows)
    return table, {"batch": BATCH, "window": WINDOW, "parameters": sum(p.nbytes for p in params.values()) / MIB}


VARIANTS = (("freed", True, False, False), ("freed, every loss kept", True, True, False),
            ("freed, self-capturing rules", True, False, True),
            ("not freed, every loss kept", False, True, False),
            ("not freed, self-capturing rules", False, False, True))


def measured_steps():
    """One row per variant: live Tensors after the first and last step, bytes held, growth per step."""
    cfg = PRESETS["default"]
    rng = np.random.default_rng(SEED)
    ids, targets = (rng.integers(0, cfg.vocab_size, (BATCH, WINDOW)) for _ in range(2))
    rows = []
    for name, free_graph, keep, capture in VARIANTS:
        records = train_steps(cfg, ids, targets, STEPS, free_graph, keep, capture, seed=SEED)
        growth = (records[-1].traced_bytes - records[4].traced_bytes) / (STEPS - 5)
        rows.append([name, records[0].live_tensors, records[-1].live_tensors,
                     f"{records[-1].traced_bytes / MIB:.2f}", f"{growth / 1024:.1f}"])
    return rows


def long_steps():
    """300 steps (60 in a quick build) of the three variants that free their graph: the bytes held
    after each step and the peak during it. The two that do not free it stop at STEPS: by step 300 they would
    hold about ten times the 30-step figure of the table, some two GiB."""
    return 60 if mode() == "quick" else 300


def measured_series():
    """{variant: [[held after the step, peak during it] per step]}, freed variants for long_steps(), the others
    for STEPS."""
    cfg = PRESETS["default"]
    rng = np.random.default_rng(SEED)
    ids, targets = (rng.integers(0, cfg.vocab_size, (BATCH, WINDOW)) for _ in range(2))
    return {name: [[r.traced_bytes, r.peak_bytes]
                   for r in train_steps(cfg, ids, targets, long_steps() if free_graph else STEPS, free_graph,
                                        keep, capture, seed=SEED)]
            for name, free_graph, keep, capture in VARIANTS}


def series():
    return timed("autograd_series", ROOT / "transformer" / "autograd_memory.py", measured_series,
                 json.dumps([long_steps(), STEPS, BATCH, WINDOW, SEED]))


def figure_png(found):
    """Left: bytes held after each step, log scale, every variant; right: the peak during each step of the
    variants that free their graph, on a linear scale, where flat must look flat."""
    fig, (held, peak) = new_figure(1, 2, figsize=(11, 4.2))
    for name, free_graph, *_ in VARIANTS:
        steps = range(1, len(found[name]) + 1)
        held.plot(steps, [h / MIB for h, _ in found[name]], "-" if free_graph else "--", label=name)
        if len(found[name]) == long_steps():
            peak.plot(steps, [p / MIB for _, p in found[name]], label=name)
    held.set(yscale="log", title="Held after each step", xlabel="training step",
             ylabel="bytes numpy and Python hold (MiB)")
    peak.set(title="Peak during each step, graph freed", xlabel="training step",
             ylabel="most bytes held at once (MiB)", ylim=(0, None))
    for ax in (held, peak):
        ax.legend(fontsize="small")
    fig.suptitle(f"The autograd engine's memory over {long_steps()} AdamW steps, float64, tracemalloc")
    fig.tight_layout()
    return png(fig)


def flat(found):
    """What the figure shows, in numbers read from the same series."""
    freed = found["freed"]
    peaks = [p for _, p in freed]
    return {"steps": len(freed), "peak_lo": min(peaks) / MIB, "peak_hi": max(peaks) / MIB,
            "held_10": freed[9][0] / MIB, "held_last": freed[-1][0] / MIB, "stop": STEPS}


def steps():
    # tracemalloc's totals move by a few hundred bytes from run to run (Python's free lists): kept under a key
    # of the code they measure, like the timings, so a rebuild with nothing changed prints the same table.
    rows = timed("autograd_steps", ROOT / "transformer" / "autograd_memory.py", measured_steps,
                 json.dumps([STEPS, BATCH, WINDOW, SEED]))
    table = sections.md_table(["Variant", "Tensors alive after step 1", f"after step {STEPS}",
                               f"Held after step {STEPS} (MiB)", "Growth per step (KiB)"], rows)
    return table, {"steps": STEPS, "growth": float(rows[0][4])}


def cycles():
    """The tiny model's graph with self-capturing rules, with the cyclic garbage collector off: how many of its
    Tensors are still alive once the last name for it is dropped, and how many gc.collect() then frees; and the
    same graph with the engine's own rules, for comparison."""
    ex = tiny()
    alive = {}
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for name, capture in (("own", False), ("capturing", True)):
            before = ag.live_tensors()
            loss = cross_entropy(tape_forward(as_leaves(ex.params, ex.cfg), np.array([TINY_IDS]), ex.cfg),
                                 np.array([TINY_TARGETS]))
            built = ag.live_tensors() - before
            if capture:
                capture_own_output(loss)
            del loss
            alive[name] = (built, ag.live_tensors() - before)
            gc.collect()
            alive[name] += (ag.live_tensors() - before,)
    finally:
        if enabled:
            gc.enable()
    return {"built": alive["capturing"][0], "own_left": alive["own"][1], "left": alive["capturing"][1],
            "after_collect": alive["capturing"][2]}


def speed():
    steps_, block = (4, 3) if mode() == "quick" else (20, 6)
    medians = timed("autograd_speed", ROOT / "tools" / "autograd_speed.py",
                    lambda: autograd_speed.bench("A", steps_, block, autograd_speed.FRAMEWORKS),
                    json.dumps([steps_, block]))
    base = medians["handwritten"]
    rows = [[name, f"{medians[name]:.0f}", f"{medians[name] / base:.2f}"] for name in autograd_speed.FRAMEWORKS]
    cfg = PRESETS["A"]
    return sections.md_table(["Step", "ms", "× hand-written"], rows), {
        "batch": autograd_speed.BATCH["A"], "T": cfg.context_len, "d": cfg.emb_dim, "L": cfg.num_layers,
        "steps": steps_, "tape": medians["autograd"] / base}


def generate(context):
    found = series()
    ln_tables, ln_values = layernorm()
    graph_md, graph_values = graph()
    census_table, census_values = census()
    steps_table, steps_values = steps()
    speed_table, speed_values = speed()
    symbols, symbols_values = symbols_md()
    tiny_tables, tiny_values = tiny_part()
    gradcheck, gradcheck_values = gradcheck_md()
    devices, engine_values = devices_with_engine()
    values = {"seed": SEED, "eps": EPS, "spread": SPREAD, "layernorm": ln_values, "graph": graph_values,
              "census": census_values, "steps": steps_values, "cycles": cycles(), "flat": flat(found),
              "speed": speed_values, "symbols": symbols_values, "tiny": tiny_values, "gradcheck": gradcheck_values,
              "engine": engine_values}
    return {"values": values, **ln_tables, "graph": graph_md, "census": census_table, "steps": steps_table,
            FIGURE: figure_png(found), "speed": speed_table, **tiny_tables, "symbols": symbols,
            "gradcheck": gradcheck, "devices": devices}
