"""Generator of the Full Model page's fragments: call order, parameter keys,
the scalar count and the gradient-flow diagram of loss_and_grads."""

import ast

import numpy as np

from transformer.config import PRESETS, ModelConfig
from transformer.gradcheck import gradcheck_model
from transformer.model import init_params, loss_and_grads, param_count, param_shapes
from transformer.optim import is_decayed

from .. import depends, sections
from ..common import ROOT
from ..examples import H_STEP, SEED, TINY_IDS, TINY_TARGETS, default_note, illustrative, sizes, tiny

PAGE = "model"
MODEL_PY = "transformer/model.py"
# Distinct primes for each size: a shape computed with them reads back as symbols.
SYMBOLIC = {101: "V", 103: "T_max", 107: "d", 109: "F"}
ROLES = {  # what each parameter is for (prose); a key missing here stops the build
    "tok_emb": "token embedding table", "pos_emb": "position embedding table",
    "ln1_g": "LN1 gain", "ln1_b": "LN1 shift", "wq": "query projection", "bq": "query bias",
    "wk": "key projection", "bk": "key bias", "wv": "value projection", "bv": "value bias",
    "wo": "output projection of the heads", "bo": "output bias", "ln2_g": "LN2 gain", "ln2_b": "LN2 shift",
    "ff1_w": "feed-forward, first layer", "ff1_b": "its bias", "ff2_w": "feed-forward, second layer",
    "ff2_b": "its bias", "lnf_g": "final LayerNorm gain", "lnf_b": "final LayerNorm shift",
    "head_w": "the head: width d to V logits", "head_b": "head bias",
}


def calls_md(function):
    """Line | Function | Call: each call of a transformer function in a model.py function, in source order; the
    line links to the function's listing on this page, the callee to its own listing."""
    source, text = depends.module_source("model"), (ROOT / MODEL_PY).read_text()
    found = []
    for call in ast.walk(source.defs[function]):
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name):
            name = call.func.id
            target = source.names.get(name) or (("model", name) if name in source.defs else None)
            if target:
                found.append((call.lineno, target[0], target[1], ast.get_source_segment(text, call)))
    rows = [[f"[{line}]({sections.page_link(PAGE, PAGE, sections.line_anchor(MODEL_PY, function, line))})",
             f"[`{name}`]({sections.function_link(PAGE, f'transformer/{module}.py', name)})", f"`{code}`"]
            for line, module, name, code in sorted(found)]
    return sections.md_table(["Line", "Function", "Call"], rows)


def forward_order_md():
    trace = tiny().trace
    out = [illustrative(f"ids `{TINY_IDS}`; the tensors are `forward(..., trace=...)`'s intermediates."), ""]
    out.append("The calls `forward` makes, in source order (the block call runs once per layer):\n")
    out.append(calls_md("forward"))
    out.append("The tensors at each step, in the order they are computed:\n")
    for key, value in trace.items():
        v = value[0]
        shown = v if v.ndim <= 2 else v[0]
        label = f"{key} {sections.shape_text(value.shape)}" + (", head 0" if v.ndim > 2 else "")
        out.append(f"**{label}**\n\n" + sections.array_md(key, shown, row_label="position"))
    return "\n".join(out)


def backward_order_md():
    ex = tiny()
    loss, grads = loss_and_grads(ex.params, ex.ids, np.array([TINY_TARGETS]), ex.cfg)
    table = [[f"`{k}`", sections.shape_text(g.shape), f"{np.linalg.norm(g):.4f}", f"{np.abs(g).max():.4f}"]
             for k, g in grads.items()]
    return ("The calls `backward` makes, in source order; the block call runs once per layer, last layer first:\n\n"
            + calls_md("backward")
            + f"\nThe gradient dictionary `loss_and_grads` returns for the tiny example (targets `{TINY_TARGETS}`, "
              f"loss {loss:.4f}): one entry per parameter, in the order of `params`.\n\n"
            + sections.md_table(["Key", "Shape", "‖grad‖", "max |grad|"], table))


def symbolic_shape(shape):
    return "(" + ", ".join(SYMBOLIC[n] for n in shape) + ("," if len(shape) == 1 else "") + ")"


def init_rule(name, value, shape):
    if len(shape) == 2:
        return f"Xavier, a = {np.sqrt(6 / sum(shape)):.4f}"
    if np.all(value == 1):
        return "ones"
    if np.all(value == 0):
        return "zeros"
    raise RuntimeError(f"{name}: an initialisation this table does not know")


def params_md():
    sym = ModelConfig(vocab_size=101, context_len=103, emb_dim=107, num_heads=1, num_layers=1, ff_dim=109)
    cfg = PRESETS["default"]
    shapes, params = param_shapes(cfg), init_params(cfg, seed=SEED)
    kinds = {}
    for name, shape in param_shapes(sym).items():
        short = name.split(".", 1)[-1]
        kinds[short if "." not in name else "b{l}." + short] = (short, symbolic_shape(shape))
    rows = []
    for key, (short, symbolic) in kinds.items():
        real = key.replace("{l}", "0")
        shape = shapes[real]
        rows.append([f"`{key}`", symbolic, sections.shape_text(shape), int(np.prod(shape)), ROLES[short],
                     init_rule(real, params[real], shape), "yes" if is_decayed(real) else "no"])
    every = [[f"`{k}`", sections.shape_text(s), int(np.prod(s)), "yes" if is_decayed(k) else "no"]
             for k, s in shapes.items()]
    total = sum(int(np.prod(s)) for s in shapes.values())
    counts = []
    for name, c in PRESETS.items():
        real = sum(v.size for v in init_params(c, seed=SEED).values())
        counts.append([name, c.vocab_size, c.context_len, c.emb_dim, c.num_layers, c.ff_dim, param_count(c), real,
                       "equal" if param_count(c) == real else "**DIFFER**"])
    return {
        "param-kinds": sections.md_table(["Key", "Shape", "Default config", "Scalars", "Role", "Initialisation",
                                          "Decay"], rows)
        + "\nThe symbolic shapes were read back from `param_shapes` called with distinct primes for V, T_max, d and "
          "F; `b{l}.` keys repeat for each block l = 0 .. L−1. Xavier means U(−a, a) with a = √(6 / (rows + "
          "columns)) ([the equation](" + sections.page_link(PAGE, "linear", "eq-xavier") + ")). Weight decay is "
          "`is_decayed(key)`.\n",
        "param-every": f"All {len(shapes)} keys at {default_note(batch=False)}, in the order of `param_shapes`:\n\n"
        + sections.md_table(["Key", "Shape", "Scalars", "Weight decay"], every)
        + f"\nTotal: **{total}** scalars.\n",
        "param-count": sections.md_table(["Preset", "V", "T_max", "d", "L", "F", "`param_count`",
                                          "Scalars `init_params` made", "Check"], counts),
    }


def flow_md():
    """A mermaid diagram of loss_and_grads: one box per call, arrows for the values passed."""
    source = depends.module_source("model")
    fn = source.defs["loss_and_grads"]
    made_by, nodes, edges, clicks = {}, [], [], []
    for arg in fn.args.args:
        nodes.append(f'  {arg.arg}(["{arg.arg}"])')
        made_by[arg.arg] = arg.arg
    for i, stmt in enumerate(fn.body):
        call = stmt.value if isinstance(stmt, (ast.Assign, ast.Return)) else None
        if isinstance(call, ast.Tuple):
            call = call.elts[0] if isinstance(call.elts[0], ast.Call) else None
        if not isinstance(call, ast.Call):
            continue
        name = call.func.id
        module = source.names.get(name, ("model", name))[0]
        node = f"c{i}"
        nodes.append(f'  {node}["{name}<br/>line {stmt.lineno}"]')
        here = sections.page_link(PAGE, PAGE, sections.line_anchor(MODEL_PY, "loss_and_grads", stmt.lineno))
        clicks.append(f'  click {node} href "{_url(here)}" "line {stmt.lineno} of transformer/model.py"')
        doc = f"d{i}"
        nodes.append(f'  {doc}>"{name} explained"]')
        edges.append(f"  {node} -.- {doc}")
        explained = _url(sections.function_link(PAGE, f"transformer/{module}.py", name))
        clicks.append(f'  click {doc} href "{explained}"')
        used = [n.id for n in ast.walk(call) if isinstance(n, ast.Name) and n.id in made_by and n.id != name]
        for var in dict.fromkeys(used):
            edges.append(f"  {made_by[var]} -->|{var}| {node}")
        if isinstance(stmt, ast.Assign):
            for target in ast.walk(stmt.targets[0]):
                if isinstance(target, ast.Name):
                    made_by[target.id] = node
        else:
            nodes.append('  out(["loss, grads"])')
            edges.append(f"  {node} --> out")
    return ("```mermaid\nflowchart TD\n" + "\n".join(nodes + edges + clicks) + "\n```\n\n"
            "Generated from the source of `loss_and_grads`: a box per call (click it for its line), the "
            "arrows carry the variables passed on, and each flag opens the page that explains the function. "
            "The gradient starts at `cross_entropy_backward` (dlogits) and flows through `backward`, which uses "
            "the cache `forward` left.\n")


def _url(md_link):
    """mermaid links are followed by the browser, so they need the built URL, not the .md path."""
    path, _, anchor = md_link.partition("#")
    if path:
        path = "../" + path.replace(".md", "/")  # pages are served as folders: model/x.md -> model/x/
    return path + ("#" + anchor if anchor else "")


def gradcheck_md():
    ex = tiny()
    report = gradcheck_model(ex.cfg, ex.ids, np.array([TINY_TARGETS]), seed=SEED, h=H_STEP, perturb=0.1)
    shapes = param_shapes(ex.cfg)
    rows = [sections.GradRow(name, shapes[name], gap, rel, "float64", H_STEP) for name, (gap, rel) in report.items()]
    return (f"`gradcheck_model` on the tiny model: every one of the {len(rows)} gradients of the loss, from "
            f"`loss_and_grads`, against central differences of `loss_fn` (ids `{TINY_IDS}`, targets "
            f"`{TINY_TARGETS}`, 1-D parameters moved by 0.1 × N(0, 1) off their initial values, seeds {SEED} "
            f"and {SEED + 1}).\n\n"
            + sections.gradcheck_table(rows))


def generate(context):
    return {
        "forward": forward_order_md(),
        "backward": backward_order_md(),
        **params_md(),
        "flow": flow_md(),
        "gradcheck": gradcheck_md(),
        "sizes": f"At the default config: {sizes(PRESETS['default'])}.\n",
    }
