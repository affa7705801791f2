"""The Full Model page's two diagrams, generated from the code: how `loss_and_grads` passes values from call
to call (read from its source), and which call of `backward` fills which keys of the gradient dictionary
(recorded by running it line by line). Mermaid text only; the words are in docs/model/full-model.md."""

import ast
import re
import sys

import numpy as np

from transformer.model import backward, forward
from transformer.softmax import cross_entropy_backward, cross_entropy_forward

from .. import depends, sections
from ..examples import TINY_TARGETS, tiny
from ._model_backward import PAGE, here, stream_labels


def url(md_link):
    """mermaid links are followed by the browser, so they need the built URL, not the .md path."""
    path, _, anchor = md_link.partition("#")
    if path:
        path = "../" + path.replace(".md", "/")  # pages are served as folders: model/x.md -> model/x/
    return path + ("#" + anchor if anchor else "")


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
        node, doc = f"c{i}", f"d{i}"
        nodes += [f'  {node}["{name}<br/>line {stmt.lineno}"]', f'  {doc}>"{name} explained"]']
        clicks.append(f'  click {node} href "{url(here("loss_and_grads", stmt.lineno))}" '
                      f'"line {stmt.lineno} of transformer/model.py"')
        edges.append(f"  {node} -.- {doc}")
        clicks.append(f'  click {doc} href "{url(sections.function_link(PAGE, f"transformer/{module}.py", name))}"')
        used = [n.id for n in ast.walk(call) if isinstance(n, ast.Name) and n.id in made_by and n.id != name]
        edges += [f"  {made_by[var]} -->|{var}| {node}" for var in dict.fromkeys(used)]
        if isinstance(stmt, ast.Assign):
            made_by.update({t.id: node for t in ast.walk(stmt.targets[0]) if isinstance(t, ast.Name)})
        else:
            nodes.append('  out(["loss, grads"])')
            edges.append(f"  {node} --> out")
    return "```mermaid\nflowchart TD\n" + "\n".join(nodes + edges + clicks) + "\n```\n"


def filled_keys():
    """Run `backward` on the tiny example line by line (sys.settrace) and record, in the order it runs, each
    call of a backward function: (line, callee, name and shape of the gradient passed in, keys of `grads`
    filled until the next such call, the lines that stored them)."""
    ex = tiny()
    logits, cache = forward(ex.params, ex.ids, ex.cfg)
    dlogits = cross_entropy_backward(1.0, cross_entropy_forward(logits, np.array([TINY_TARGETS]))[1])
    fn = depends.module_source("model").defs["backward"]
    callees = {c.lineno: (c.func.id, c.args[0].id) for c in ast.walk(fn)
               if isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id.endswith("_backward")}
    events = []

    def local(frame, event, arg):
        grads, names = frame.f_locals.get("grads", {}), frame.f_locals
        events.append((frame.f_lineno, list(grads), {a: np.shape(names[a]) for _, a in callees.values() if a in names}))
        return local

    previous = sys.gettrace()
    sys.settrace(lambda frame, event, arg: local if frame.f_code is backward.__code__ else None)
    try:
        backward(dlogits, cache)
    finally:
        sys.settrace(previous)
    calls = []
    for (line, before, shapes), (_, after, _) in zip(events, events[1:]):
        if line in callees:
            name, arg = callees[line]
            calls.append([line, name, arg, shapes.get(arg), [], []])
        new = [k for k in after if k not in before]
        if new:
            calls[-1][4] += new
            calls[-1][5].append(line)
    return calls


SYMBOL_TEXT = {r"\partial": "∂", r"\ell": "ℓ"}  # the stream's symbols as text: mermaid does not run MathJax
SUPERSCRIPT = str.maketrans("0123456789()", "⁰¹²³⁴⁵⁶⁷⁸⁹⁽⁾")


def plain_symbol(latex):
    """A symbol of stream_labels as mermaid can show it (mermaid runs no MathJax): ∂ℓ/∂X⁽⁰⁾ for the LaTeX
    \\partial\\ell/\\partial X^{(0)}."""
    text = re.sub(r"\\\(|\\\)|\\partial ?|\\ell", lambda m: SYMBOL_TEXT.get(m[0].strip(), ""), latex)
    return re.sub(r"\^\{(.*?)\}", lambda m: m[1].translate(SUPERSCRIPT), text)


def grad_flow_md():
    """Mermaid: each backward call, the gradient it receives and the keys of `grads` it fills."""
    calls, ex = filled_keys(), tiny()
    symbols = [plain_symbol(s) for _, s, _ in stream_labels(ex.cfg.num_layers)]
    lines, clicks = ["```mermaid", "flowchart TD", '  start(["cross_entropy_backward"])'], []
    previous = "start"
    for i, (line, name, arg, shape, keys, stored) in enumerate(calls):
        prefix = keys[0].split(".")[0] + "." if "." in keys[0] else ""
        short = [k[len(prefix):] for k in keys]
        rows = [", ".join(short[j:j + 4]) for j in range(0, len(short), 4)]
        lines += [f'  c{i}["{name}<br/>line {line}"]',
                  f'  k{i}[("grads{" " + prefix + "*" if prefix else ""}: {"<br/>".join(rows)}<br/>({len(keys)} '
                  f'keys, stored at line {", ".join(map(str, sorted(set(stored))))})")]',
                  f'  {previous} -->|"{arg} = {symbols[i]} {tuple(shape)}"| c{i}', f"  c{i} -.-> k{i}"]
        clicks.append(f'  click c{i} href "{url(here("backward", line))}" "line {line} of transformer/model.py"')
        previous = f"c{i}"
    return "\n".join(lines + clicks + ["```"]) + "\n"


def fragments():
    """The two diagrams, and the number of keys the backward fills."""
    return {"flow": flow_md(), "grad_flow": grad_flow_md()}, {"filled": len(tiny().params)}
