"""Jacobian pictures for the explorer page: for a few functions, the Jacobian their backward implies (the backward
applied to each unit vector of the output) beside the one central differences of the forward give, and their
difference; then the same for mutants of the catalogue (tools/mutant_catalogue.py), whose broken backward is
built here from the real one by the mutant's own edit, so that a reader sees which entries it gets wrong."""

import importlib
import inspect
from dataclasses import dataclass

import numpy as np

from tools.mutant_catalogue import MUTANTS
from transformer import activations, attention, layernorm, softmax
from transformer.block import block_params

from ..examples import SEED
from ._explorer_steps import unit_jacobian

H = 1e-6  # central differences' step


@dataclass
class Case:
    """One function on one input: `forward(x)` -> (y, cache), `backward(dy, cache)` -> dx."""
    name: str
    title: str
    forward: object
    backward: object
    x: np.ndarray


def backward_jacobian(case, backward=None):
    """Row o: the backward of the unit vector e_o, that is ∂y_o/∂x, flattened."""
    backward = backward or case.backward
    y, cache = case.forward(case.x)
    return unit_jacobian(lambda unit: backward(unit, cache), y)


def central_jacobian(case):
    """Column i: (f(x + h e_i) - f(x - h e_i)) / 2h, flattened."""
    columns = []
    for i in range(case.x.size):
        ys = []
        for sign in (1, -1):
            x = case.x.copy()
            x.flat[i] += sign * H
            ys.append(np.ravel(case.forward(x)[0]))
        columns.append((ys[0] - ys[1]) / (2 * H))
    return np.array(columns).T


def cases(run):
    """The functions pictured, on inputs from the explorer's run (the tiny model's first block)."""
    rng = np.random.default_rng(SEED)
    p, cfg = block_params(run.params, 0), run.cfg
    ln_in, attn_in = run.values["embedding"][0], run.values["b0.ln1"]
    logits, targets = run.values["logits"], run.targets
    found = [
        Case("layernorm", "LayerNorm", lambda x: layernorm.layer_norm_forward(x, p["ln1_g"], p["ln1_b"], cfg.ln_eps),
             lambda dy, c: layernorm.layer_norm_backward(dy, c)[0], np.array(ln_in)),
        Case("softmax", "softmax of one row", softmax.softmax_forward, softmax.softmax_backward,
             rng.standard_normal(cfg.vocab_size)),
        Case("xent", "cross-entropy with softmax", lambda z: softmax.cross_entropy_forward(z, targets),
             softmax.cross_entropy_backward, np.array(logits)),
        Case("gelu", "GELU", activations.gelu_forward, activations.gelu_backward, rng.standard_normal(6)),
    ]
    for h in range(cfg.num_heads):  # one head's share of the attention output: W_o's other rows set to zero
        own = dict(p, wo=head_rows(p["wo"], h, cfg.num_heads))
        found.append(Case(f"attention-head-{h}", f"attention, head {h}'s share",
                          lambda u, own=own: attention.attention_forward(u, own, cfg.num_heads),
                          lambda dy, c: attention.attention_backward(dy, c)[0], np.array(attn_in)))
    return found


def head_rows(wo, h, num_heads):
    """W_o with only head h's rows (its d_h inputs) kept: the output then holds head h's contribution alone."""
    dh = wo.shape[0] // num_heads
    kept = np.zeros_like(wo)
    kept[h * dh:(h + 1) * dh] = wo[h * dh:(h + 1) * dh]
    return kept


def edited_source(mutant):
    """The function a mutant of the catalogue edits: its module, its real source, and that source with the
    mutant's edits applied (each edit's text must occur exactly once there, or the mutant no longer fits)."""
    path, function = mutant.subject
    module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
    source = inspect.getsource(getattr(module, function))
    edited = source
    for e in mutant.edits:
        if edited.count(e.old) != 1:
            raise RuntimeError(f"mutant {mutant.name}: its edit no longer fits {path}:{function}")
        edited = edited.replace(e.old, e.new)
    return module, source, edited


def mutated(mutant_name):
    """The function a mutant of the catalogue edits, rebuilt from its real source with the mutant's edits applied,
    in a copy of its module's namespace (the module itself is left as it is)."""
    mutant = next(m for m in MUTANTS if m.name == mutant_name)
    module, _, source = edited_source(mutant)
    namespace = dict(vars(module))
    exec(compile(source, f"<{mutant_name}>", "exec"), namespace)  # noqa: S102  (the project's own source, edited)
    return namespace[mutant.subject[1]]


# Mutants pictured, each with the case it breaks and how its backward is rebuilt from the mutated function.
MUTANT_CASES = {
    "layernorm-dx-no-mean-term": ("layernorm", lambda f: lambda dy, c: f(dy, c)[0]),
    "softmax-grad-no-subtraction": ("softmax", lambda f: f),
    "gelu-grad-no-density-term": ("gelu", lambda f: f),
    "attention-grad-no-scale": ("attention-head-0", lambda f: lambda dy, c: f(dy, c)[0]),
}


def pictures(run):
    """{case name: (J from the backward, J from central differences)} and {mutant: (its J, the true J)}."""
    found = {c.name: c for c in cases(run)}
    functions = {c.name: (backward_jacobian(c), central_jacobian(c)) for c in found.values()}
    mutants = {}
    for name, (case_name, wrap) in MUTANT_CASES.items():
        case = found[case_name]
        mutants[name] = (backward_jacobian(case, wrap(mutated(name))), functions[case_name][0])
    return found, functions, mutants


def heatmaps(rows, titles):
    """A figure of heatmaps, one row per entry of `rows` ((label, [matrices])), each matrix on its own symmetric
    scale with its colour bar: the columns are the input entries, the rows the output entries."""
    from ..figures import new_figure

    fig, axes = new_figure(len(rows), len(titles), figsize=(3.6 * len(titles), 2.9 * len(rows)),
                           layout="constrained")
    axes = np.atleast_2d(axes)
    for r, (label, matrices) in enumerate(rows):
        for c, matrix in enumerate(matrices):
            ax = axes[r, c]
            limit = float(np.abs(matrix).max()) or 1.0
            image = ax.imshow(np.atleast_2d(matrix), cmap="RdBu_r", vmin=-limit, vmax=limit, aspect="auto",
                              interpolation="nearest")
            fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04).ax.tick_params(labelsize=6)
            ax.set_title(f"{label}\n{titles[c]}", fontsize=8)
            ax.set_xlabel("input entry", fontsize=7)
            ax.set_ylabel("output entry", fontsize=7)
            ax.tick_params(labelsize=6)
    return fig
