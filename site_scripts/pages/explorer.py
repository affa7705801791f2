"""Generator of the explorer page: the tiny model's forward and backward, step by step (_explorer_steps.Run), as
data for the page's viewer (docs/assets/explorer.js), for a few sequences and seeds, each computed here.

Each choice is one data file served beside the page (`<key>.data.js`, in the page's own folder: a script that stores the data
under its key, so that the page works opened from disk, where a browser refuses to fetch a file), holding every
tensor's values and gradients and, for each step, the non-zero entries of its Jacobian. The steps' titles and
equations are written into the page itself, from the pages that derive them, so that they are typeset with the
rest and printed."""

import json
import posixpath

import numpy as np

from transformer.config import PRESETS
from transformer.model import init_params

from ..common import md_table
from ..equations import by_id
from ..examples import MOVE, biases_moved
from ..figures import new_figure, png
from ..sections import PAGE_PATHS, page_link
from . import _jacobians as jac
from ._explorer_steps import Run, symbol

CFG = PRESETS["tiny"]
# Each sequence: the ids, then the target of the last position (the targets are the ids shifted by one).
SEQUENCES = {"2 0 2 1": [2, 0, 2, 1], "1 3 4 0 2": [1, 3, 4, 0, 2], "4 4 1": [4, 4, 1]}
SEEDS = (0, 1, 2)


def key(sequence, seed):
    return f"s{list(SEQUENCES).index(sequence)}-seed{seed}"


def run(sequence, seed):
    """The steps of one choice: the tiny model with seed `seed` (biases and gains moved off 0 and 1, so that
    every term shows), on the sequence."""
    tokens = SEQUENCES[sequence]
    params = biases_moved(init_params(CFG, seed=seed), np.random.default_rng(seed))
    return Run(params, CFG, tokens[:-1], tokens[1:])


def data(r: Run):
    """What the viewer draws of one run: each tensor's symbol, shape, values and gradient, and each step's
    inputs, output, the gradient its backward sends to each input, and Jacobians (per output entry, the
    [input entry, derivative] pairs that are not zero)."""
    tensors = {}
    for name in r.values:
        value, grad = r.matrix(name), np.asarray(r.grads[name], dtype=float).reshape(r.matrix(name).shape)
        tensors[name] = {"symbol": symbol(name, CFG), "shape": list(value.shape), "value": value.ravel().tolist(),
                         "grad": grad.ravel().tolist()}
    readers = {name: sum(name in s.inputs for s in r.steps) for name in r.values}
    steps = [{"id": s.id, "title": s.title, "inputs": list(s.inputs), "output": s.output,
              "shared": [readers[name] > 1 for name in s.inputs],  # another step reads it too
              "dx": [np.ravel(dx).astype(float).tolist() for dx in s.dx],
              "jacobians": [[[[int(i), float(row[i])] for i in np.flatnonzero(row)] for row in j]
                            for j in s.jacobians]} for s in r.steps]
    return {"ids": r.ids[0].tolist(), "targets": r.targets[0].tolist(), "tensors": tensors, "steps": steps}


def data_script(k, value):
    """A data file: a script that stores `value` under key k in window.explorerData."""
    return (f"(window.explorerData = window.explorerData || {{}})[{json.dumps(k)}] = "
            f"{json.dumps(value, separators=(',', ':'))};\n").encode()


def equation_md(ids):
    eqs = by_id()
    return "\n\n".join(f"$$\n{eqs[i].latex}\n$$" for i in ids)


def steps_md(r: Run):
    """Every step as a block of the page: its title, a link to where it is derived, its forward's equations and
    its backward's. The viewer marks the block of the step it shows."""
    eqs, parts = by_id(), []
    for n, s in enumerate(r.steps, 1):
        where = eqs[s.eqs[0]].page
        link = page_link("explorer", where, f"eq-{s.eqs[0]}")
        blink = page_link("explorer", eqs[s.beqs[0]].page, f"eq-{s.beqs[0]}")
        inputs = ", ".join(symbol(i, CFG) for i in s.inputs)
        parts.append(f'<div class="xp-step" id="xp-step-{s.id.replace(".", "-")}" data-step="{s.id}" markdown>\n\n'
                     f"**{n}. {s.title}**: {inputs} → {symbol(s.output, CFG)} "
                     f"([forward]({link}), [backward]({blink}))\n\n"
                     f"Forward:\n\n{equation_md(s.eqs)}\n\nBackward:\n\n{equation_md(s.beqs)}\n\n</div>")
    return "\n\n".join(parts)


def viewer_md():
    """The viewer's container: the choices it offers, and where their data files are from the page's URL (the
    page is served as <its path without .md>/, its data files in <its folder>/<its id>/: build.figure_files)."""
    choices = [{"key": key(seq, seed), "sequence": seq, "seed": seed} for seq in SEQUENCES for seed in SEEDS]
    path = PAGE_PATHS["explorer"]
    base = posixpath.relpath(posixpath.join(posixpath.dirname(path), "explorer"), posixpath.splitext(path)[0])
    return (f"<div class=\"explorer\" data-choices='{json.dumps(choices)}' data-base=\"{base}/\" "
            f"data-first=\"{key(next(iter(SEQUENCES)), SEEDS[0])}\"></div>")


def still_png(r: Run, step_id="b0.ln1", entry=(1, 2)):
    """The print edition's still picture: one step's input and output as heatmaps, an output entry chosen and
    the input entries its Jacobian says it depends on outlined."""
    step = next(s for s in r.steps if s.id == step_id)
    x, y = r.matrix(step.inputs[0]), r.matrix(step.output)
    from matplotlib.patches import Rectangle

    o = entry[0] * y.shape[1] + entry[1]
    deps = np.flatnonzero(step.jacobians[0][o])
    fig, (ax_in, ax_out) = new_figure(1, 2, figsize=(8, 2.6))
    for ax, value, name in ((ax_in, x, step.inputs[0]), (ax_out, y, step.output)):
        limit = float(np.abs(value).max())
        ax.imshow(value, cmap="RdBu_r", vmin=-limit, vmax=limit)
        ax.set_title(f"{symbol(name, CFG)} {value.shape}", fontsize=9)
        ax.set_xticks(range(value.shape[1]))
        ax.set_yticks(range(value.shape[0]))
        ax.set_xlabel("feature i")
        ax.set_ylabel("position t")
        for (t, i), v in np.ndenumerate(value):
            ax.text(i, t, f"{v:.2f}", ha="center", va="center", fontsize=7,
                    color="white" if abs(v) > 0.6 * limit else "black")
    for d in deps:
        t, i = divmod(int(d), x.shape[1])
        ax_in.add_patch(Rectangle((i - 0.5, t - 0.5), 1, 1, fill=False, lw=2, ec="black"))
    ax_out.add_patch(Rectangle((entry[1] - 0.5, entry[0] - 0.5), 1, 1, fill=False, lw=2.5, ec="black"))
    return png(fig), {"step": step.title, "entry": list(entry), "deps": len(deps), "symbol": symbol(step.output, CFG),
                      "input": symbol(step.inputs[0], CFG)}


def generate(context):
    runs = {key(seq, seed): run(seq, seed) for seq in SEQUENCES for seed in SEEDS}
    first = runs[key(next(iter(SEQUENCES)), SEEDS[0])]
    files = {f"{k}.data.js": data_script(k, data(r)) for k, r in runs.items()}
    still, still_values = still_png(first)
    sizes = md_table(["symbol", "what", "shape"],
                     [[f"`{symbol(n, CFG)}`", n, f"`{first.matrix(n).shape}`"] for n in first.values])
    values = {"steps": len(first.steps), "choices": len(runs), "sequences": list(SEQUENCES), "seeds": list(SEEDS),
              "move": MOVE, "still": still_values, "tensors": len(first.values)}
    jacobian_fragments, values["jacobians"] = jacobian_part(first)
    return {"values": values, "viewer": viewer_md(), "steps": steps_md(first), "still.png": still, "sizes": sizes,
            **jacobian_fragments, **files}


def jacobian_part(r: Run):
    """The Jacobian pictures (_jacobians): each function's backward against central differences, each mutant's
    against the true backward, as figures and tables."""
    found, functions, mutants = jac.pictures(r)
    rows = [(found[n].title, [jb, jc, jb - jc]) for n, (jb, jc) in functions.items()]
    fig = jac.heatmaps(rows, ["backward", "central differences", "difference"])
    mrows = [(n, [jm, jt, jm - jt]) for n, (jm, jt) in mutants.items()]
    mfig = jac.heatmaps(mrows, ["mutant's backward", "true backward", "difference"])
    table = md_table(["function", "Jacobian shape", "largest entry", "largest difference from central differences"],
                     [[found[n].title, f"`{jb.shape}`", f"{np.abs(jb).max():.3g}", f"{np.abs(jb - jc).max():.1e}"]
                      for n, (jb, jc) in functions.items()])
    breaks = {m.name: m.breaks for m in jac.MUTANTS}
    mtable = md_table(["mutant", "what it breaks", "pictured on", "entries it changes"],
                      [[f"`{n}`", breaks[n], found[jac.MUTANT_CASES[n][0]].title,
                        f"{int((jm != jt).sum())} of {jm.size}"] for n, (jm, jt) in mutants.items()])
    values = {"functions": len(functions), "mutants": len(mutants), "h": jac.H,
              "worst": max(float(np.abs(jb - jc).max()) for jb, jc in functions.values())}
    return {"jacobians.png": png(fig), "mutants.png": png(mfig), "jacobians": table, "mutant_jacobians": mtable}, values
