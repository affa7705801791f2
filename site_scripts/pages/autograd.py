"""Generator of the "Hand-written backward and autograd" page's fragments.

The LayerNorm gradient by `layer_norm_backward` and by the tape, the tape's graph drawn from its own nodes,
what each approach keeps in memory (counted), and the time of a training step (measured once per change of
the code it times, as the benchmark pages do).
"""

import json

import numpy as np

from tools import autograd_speed
from transformer import autograd as ag
from transformer.autograd_memory import graph_census, train_steps
from transformer.autograd_model import fused_layer_norm, layer_norm
from transformer.config import PRESETS
from transformer.gradcheck import relative_gap
from transformer.layernorm import layer_norm_backward, layer_norm_forward
from transformer.model import init_params

from .. import sections
from ..common import ROOT, mode
from ..examples import SEED
from ..figures import new_figure, png
from ._autograd_anatomy import devices_with_engine_md, example_md, gradcheck_md, symbols_md
from ._bench import timed

PAGE = "autograd"
EPS = 1e-5
BATCH, WINDOW = 8, 16  # the default config's training windows
STEPS = 30
MIB = 2 ** 20
FIGURE = "steps.png"


def layer_norm_inputs():
    """A 3 x 4 input with its gain and shift off 1 and 0, and an upstream gradient R."""
    rng = np.random.default_rng(SEED)
    x = rng.standard_normal((3, 4))
    g, b = 1 + 0.3 * rng.standard_normal(4), 0.3 * rng.standard_normal(4)
    return x, g, b, rng.standard_normal((3, 4))


def taped_layer_norm(norm, x, g, b, r, free_graph=True):
    """(leaves, output) of norm on the tape, after backward with the upstream gradient r."""
    leaves = [ag.Tensor(a, requires_grad=True) for a in (x, g, b)]
    out = norm(*leaves, EPS)
    out.backward(r, free_graph=free_graph)
    return leaves, out


def layernorm_md():
    x, g, b, r = layer_norm_inputs()
    hand = layer_norm_backward(r, layer_norm_forward(x, g, b, EPS)[1])
    leaves, _ = taped_layer_norm(layer_norm, x, g, b, r)
    fused, _ = taped_layer_norm(fused_layer_norm, x, g, b, r)
    rows = []
    for name, h, t, f in zip(("∂f/∂x", "∂f/∂γ", "∂f/∂β"), hand, (t.grad for t in leaves), (t.grad for t in fused)):
        rows.append([name, f"{relative_gap(t, h):.1e}", f"{relative_gap(f, h):.1e}"])
    return (f'!!! example "Illustrative: a 3 × 4 input drawn with seed {SEED}"\n'
            f"    γ and β moved off 1 and 0, a random upstream gradient R, ε = {EPS:g}. "
            "`layer_norm_backward` computes dx from its three terms; the tape composes mean, subtraction, "
            "product, mean, power −½, product and sum, and differentiates that.\n"
            + "\n" + sections.array_md("dx by layer_norm_backward", hand[0])
            + "\n" + sections.array_md("dx by the tape (composed)", leaves[0].grad)
            + "\nRelative gap of each gradient to the hand-written one:\n\n"
            + sections.md_table(["Gradient", "composed on the tape", "hand-written VJP through the seam"], rows))


def graph_md():
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
    ops = [node.op for node in order if id(node) not in names]
    return ("The graph the tape recorded for the composed LayerNorm above, drawn from its nodes "
            f"(`topological_order` of the output, kept with `free_graph=False`): {len(ops)} operations on "
            f"the three leaves, {constants} constants (dotted). `backward` visits it from right to left and "
            "calls each node's rule once.\n\n```mermaid\n" + "\n".join(lines) + "\n```\n")


def census_md():
    cfg = PRESETS["default"]
    rng = np.random.default_rng(SEED)
    ids, targets = (rng.integers(0, cfg.vocab_size, (BATCH, WINDOW)) for _ in range(2))
    params = init_params(cfg, seed=SEED)
    rows = []
    for fused in ((), ("layer_norm",), ("layer_norm", "attention")):
        c = graph_census(params, ids, targets, cfg, fused)
        rows.append([", ".join(fused) or "nothing (all composed)", c.nodes - c.parameters, c.constants,
                     f"{c.graph_bytes / MIB:.2f}", f"{c.cache_bytes / MIB:.2f}",
                     f"{c.graph_bytes / c.cache_bytes:.1f}", f"{c.grads_peak_bytes / MIB:.2f}",
                     f"{c.grads_kept_peak_bytes / MIB:.2f}"])
    parameters = sum(p.nbytes for p in params.values())
    return (f"One float64 step of the default configuration on a batch of {BATCH} windows of {WINDOW} tokens: "
            "the graph just before `backward` against the cache `transformer.model.forward` returns for the same "
            "batch. Bytes are those of distinct buffers (a view counts once), the parameters not counted. The last "
            "two columns count the gradients during `backward` (counted each time a rule returns): as the engine "
            "runs it, dropping each intermediate gradient once its rule has passed it on, and with every one kept "
            f"(`keep_grads=True`). The parameters' own gradients, {parameters / MIB:.2f} MiB, are in both.\n\n"
            + sections.md_table(["Fused through the seam", "Operation nodes", "Constants", "Graph (MiB)",
                                 "Hand-written cache (MiB)", "Ratio", "Gradients at most, dropped (MiB)",
                                 "kept (MiB)"], rows))


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
    """The issue's 300 steps (60 in a quick build) of the three variants that free their graph: the bytes held
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


def flat_md(found):
    """The figure and what it shows, in numbers read from the same series."""
    freed = found["freed"]
    peaks = [p for _, p in freed]
    first, last = freed[9], freed[-1]
    return (f"![Memory held after each step and the peak during each step, by variant](autograd/{FIGURE})\n\n"
            f"Over {len(freed)} steps with the graph freed, the peak during a step stays between "
            f"{min(peaks) / MIB:.2f} and {max(peaks) / MIB:.2f} MiB, and what is held after a step goes from "
            f"{first[0] / MIB:.3f} MiB at step 10 to {last[0] / MIB:.3f} MiB at step {len(freed)}. Not freed, "
            f"the held bytes climb by a graph a step, so those two lines stop at step {STEPS}.\n")


def steps_md():
    # tracemalloc's totals move by a few hundred bytes from run to run (Python's free lists): kept under a key
    # of the code they measure, like the timings, so a rebuild with nothing changed prints the same table.
    rows = timed("autograd_steps", ROOT / "transformer" / "autograd_memory.py", measured_steps,
                 json.dumps([STEPS, BATCH, WINDOW, SEED]))
    return (f"{STEPS} AdamW steps on one batch (as above) with the cyclic garbage collector off, so that what is "
            "freed is what reference counting frees. *Self-capturing rules* re-creates the bug of the reference "
            "engine: every node's rule holds the node itself, so each node is a reference cycle.\n\n"
            + sections.md_table(["Variant", "Tensors alive after step 1", f"after step {STEPS}",
                                 f"Held after step {STEPS} (MiB)", "Growth per step (KiB)"], rows)
            + f"\nFreed, the {rows[0][4]} KiB a step that remain are the records of this table and Python's free "
              "lists filling up; kept losses are one number each. Not freed, a step keeps its whole graph.\n")


def speed_md():
    steps, block = (4, 3) if mode() == "quick" else (20, 6)
    medians = timed("autograd_speed", ROOT / "tools" / "autograd_speed.py",
                    lambda: autograd_speed.bench("A", steps, block, autograd_speed.FRAMEWORKS),
                    json.dumps([steps, block]))
    base = medians["handwritten"]
    rows = [[name, f"{medians[name]:.0f}", f"{medians[name] / base:.2f}"] for name in autograd_speed.FRAMEWORKS]
    cfg = PRESETS["A"]
    return (f"One float32 training step (forward, backward, AdamW) of configuration A (B = "
            f"{autograd_speed.BATCH['A']}, T = {cfg.context_len}, d = {cfg.emb_dim}, L = {cfg.num_layers}), median "
            f"of {steps} steps each, the three alternating in blocks (`python -m tools.autograd_speed`). Times "
            "depend on the machine and its load, unlike every other number on this page.\n\n"
            + sections.md_table(["Step", "ms", "× hand-written"], rows))


def generate(context):
    found = series()
    return {"symbols": symbols_md(), "example": example_md(), "gradcheck": gradcheck_md(),
            "devices": devices_with_engine_md(), "layernorm": layernorm_md(), "graph": graph_md(),
            "census": census_md(), "steps": steps_md(), "flat": flat_md(found), FIGURE: figure_png(found),
            "speed": speed_md()}
