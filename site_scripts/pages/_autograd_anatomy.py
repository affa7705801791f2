"""The autograd page's standard sections: its symbols with the shapes of a real graph, the tiny model's tape,
the primitives against central differences, and the engine beside the hand-written backward in the
cross-check.

Every check returns its numbers with its verdict, so that tests/site/test_pages_autograd.py can show each
one failing on a planted mistake.
"""

from collections import Counter
from dataclasses import dataclass

import numpy as np

from transformer import autograd as ag
from transformer import autograd_functions as agf
from transformer.autograd_model import as_leaves, cross_entropy, fused_layer_norm
from transformer.autograd_model import forward as tape_forward
from transformer.config import PRESETS
from transformer.model import forward, init_params, loss_and_grads
from transformer.softmax import cross_entropy_backward, cross_entropy_forward

from .. import registry, sections
from ..common import md_table, verdict_text
from ..examples import H_STEP, SEED, TINY_IDS, TINY_TARGETS, collapsed, sizes, tiny
from ..results import crosscheck_report, devices_md

PAGE = "autograd"
SYMBOL_BATCH = (3, 16)  # B, T: with the default config every size differs (N = B T = 48 is not d = 32)


@dataclass(frozen=True)
class Tape:
    """A model's loss on the tape after backward, graph and every gradient kept (free_graph=False, keep_grads)."""
    leaves: dict  # parameter name -> leaf Tensor
    logits: ag.Tensor
    loss: ag.Tensor
    order: list  # topological_order(loss): every node after its parents

    def users(self):
        """id(node) -> how many nodes of the graph read it (its users, U(psi))."""
        count = Counter(id(p) for node in self.order for p in node.parents)
        return {id(node): count[id(node)] for node in self.order}

    def constants(self):
        return {id(p): p for node in self.order for p in node.parents if not p.requires_grad}


def taped(params, ids, targets, cfg):
    leaves = as_leaves(params, cfg)
    logits = tape_forward(leaves, ids, cfg)
    loss = cross_entropy(logits, targets)
    loss.backward(free_graph=False, keep_grads=True)
    return Tape(leaves, logits, loss, ag.topological_order(loss))


# ---------------------------------------------------------------- symbols and the graph's shapes

def symbol_names(cfg, batch):
    """Size -> symbol for naming the axes of recorded shapes; two sizes that coincide are an error."""
    B, T = batch
    named = {"B": B, "T": T, "d": cfg.emb_dim, "H": cfg.num_heads, "d_h": cfg.emb_dim // cfg.num_heads,
             "F": cfg.ff_dim, "n_V": cfg.vocab_size, "N": B * T}
    if len(set(named.values())) != len(named) or 1 in named.values():
        raise RuntimeError(f"sizes {named} coincide: a recorded shape could not name its axes")
    # The cross-entropy lays its log-probabilities out as N n_V rows of one entry to gather the targets' (by index).
    return {size: name for name, size in named.items()} | {1: "1", B * T * cfg.vocab_size: "N n_V"}


def symbolic(shape, names):
    return "(" + ", ".join(names[n] for n in shape) + ("," if len(shape) == 1 else "") + ")"


def default_tape():
    cfg = PRESETS["default"]
    ids = np.random.default_rng(SEED).integers(0, cfg.vocab_size, SYMBOL_BATCH)
    targets = np.roll(ids, -1, axis=1)  # each id's next id in its window (the last wraps round)
    return cfg, taped(init_params(cfg, seed=SEED), ids, targets, cfg)


def symbols_md():
    cfg, t = default_tape()
    names, users = symbol_names(cfg, SYMBOL_BATCH), t.users()
    operations = [node for node in t.order if not node.is_leaf]
    if any(node.grad is None or node.grad.shape != node.shape for node in t.order):
        raise RuntimeError("a node's gradient is missing or not shaped like it: the symbol table would be wrong")
    busiest = max(operations, key=lambda node: users[id(node)])
    beta = t.leaves["b0.ln1_b"]
    beta_user = next(node for node in operations if any(p is beta for p in node.parents))
    copies = beta_user.data.size // beta.data.size
    rows = [
        (r"\psi", "node.data", f"{len(t.order)} arrays, by operation below"),
        (r"\partial\ell/\partial \psi", "node.grad", "each shaped like its node"),
        (r"\chi", "a node with psi in chi.parents", f"up to {users[id(busiest)]} for one ψ"),
        (r"\mathcal{U}(\psi)", "[chi for chi in order if psi in chi.parents]",
         f"1 to {users[id(busiest)]} nodes; the most read node: `{busiest.op}`, {symbolic(busiest.shape, names)}"),
        (r"\operatorname{vjp}_{\chi\psi}", "chi.rule", f"{len(operations)} rules, one per operation"),
        (r"\operatorname{ord}(\psi)", "order.index(psi)", f"0 to {len(t.order) - 1}"),
        (r"N_{\mathrm{node}}", "len(topological_order(loss))", f"{len(t.order)}",
         f"{len(t.leaves)} parameters and {len(operations)} operations"),
        (r"\psi_{\mathrm{root}}", "loss", t.loss.shape, "the mean cross-entropy"),
        (r"\iota", "an index tuple", f"(w, t, i) of a {symbolic(beta_user.shape, names)} array"),
        (r"\tilde{\psi}", "grad in unbroadcast(grad, shape)", beta_user.shape,
         f"block 0's LN1 shift \\(\\beta\\), shape {beta.shape}, in \\(\\hat{{x}} \\odot \\gamma + \\beta\\)"),
        (r"\mathcal{B}(\iota)", "the axes unbroadcast sums", f"{copies} entries for each of β's",
         "\\(B T\\) copies of each entry of \\(\\beta\\)"),
    ]
    note = (f"the default config ({sizes(cfg)}) with a batch of \\(B\\) = {SYMBOL_BATCH[0]} windows of \\(T\\) = "
            f"{SYMBOL_BATCH[1]} tokens, its graph built by `autograd_model.forward` and `cross_entropy` and kept "
            "after `backward(free_graph=False, keep_grads=True)`")
    return sections.symbols_md(rows, note) + "\n" + shapes_md(t, names), {"constants": len(t.constants())}


def shapes_md(t, names):
    """The graph's operation nodes by kind: how many, and their shapes, named and as recorded."""
    by_op = {}
    for node in t.order:
        if not node.is_leaf:
            by_op.setdefault(node.op, Counter())[node.shape] += 1
    rows = [[f"`{op}`", sum(shapes.values()),
             ", ".join(f"{symbolic(s, names)} = `{s}`" + (f" × {k}" if k > 1 else "") for s, k in shapes.items())]
            for op, shapes in sorted(by_op.items(), key=lambda item: -sum(item[1].values()))]
    return md_table(["Operation", "Nodes", "Shapes (symbolic = recorded, × how many)"], rows)


# ---------------------------------------------------------------- the tiny model's tape

@dataclass(frozen=True)
class TinyComparison:
    """The tiny model's tape against the hand-written backward: the logits' gradient and every parameter's."""
    tape: Tape
    dlogits_hand: np.ndarray  # (T, n_V) from cross_entropy_backward
    grads_hand: dict

    def dlogits_tape(self):
        return self.tape.logits.grad[0]

    def rows(self):
        """(name, shape, largest gap, verdict) of every parameter, by the gradient checks' pass rule."""
        return [(name, leaf.shape, *sections.agreement(leaf.grad, self.grads_hand[name]))
                for name, leaf in self.tape.leaves.items()]

    def passed(self):
        return all(verdict.startswith("pass") for *_, verdict in self.rows()) and \
            sections.agreement(self.dlogits_tape(), self.dlogits_hand)[1].startswith("pass")


def tiny_comparison():
    ex = tiny()
    targets = np.array([TINY_TARGETS])
    logits, _ = forward(ex.params, ex.ids, ex.cfg)
    dlogits = cross_entropy_backward(1.0, cross_entropy_forward(logits, targets)[1])
    return TinyComparison(taped(ex.params, ex.ids, targets, ex.cfg), dlogits[0],
                          loss_and_grads(ex.params, ex.ids, targets, ex.cfg)[1])


def parent_label(parent, number, names):
    if id(parent) in names:
        return f"`{names[id(parent)]}`"
    return f"#{number[id(parent)]}" if id(parent) in number else "a constant"


def tiny_part(c=None):
    """The tiny example on the tape: its tables (the first nodes backward visits, the logits' gradient both ways,
    every parameter's gradient against the hand-written one) and the values its prose shows."""
    c = c or tiny_comparison()
    t = c.tape
    number = {id(node): i for i, node in enumerate(t.order)}
    names = {id(leaf): name for name, leaf in t.leaves.items()}
    users = t.users()
    visit = [[f"#{number[id(n)]}", f"`{n.op}`", sections.shape_text(n.shape),
              ", ".join(parent_label(p, number, names) for p in n.parents), users[id(n)],
              f"{np.abs(n.grad).max():.4f}"] for n in list(reversed(t.order))[:8]]
    rows = c.rows()
    worst = max(rows, key=lambda r: r[2])
    gap, verdict = sections.agreement(c.dlogits_tape(), c.dlogits_hand)
    tables = {
        "tiny_visit": md_table(["Node", "Operation", "Shape", "Made from", "Users",
                                "Largest \\(\\lvert\\partial\\ell/\\partial\\psi\\rvert\\)"], visit),
        "tiny_dlogits_tape": sections.array_md("∂ℓ/∂Z by the tape (the logits node's grad)", c.dlogits_tape(),
                                               row_label="position t"),
        "tiny_dlogits_hand": sections.array_md("∂ℓ/∂Z = (P − e_y)/N by cross_entropy_backward", c.dlogits_hand,
                                               row_label="position t"),
        "tiny_grads": md_table(["Parameter", "Shape", "Largest gap", "Result"],
                               [[f"`{name}`", sections.shape_text(shape), f"{g:.1e}", v] for name, shape, g, v in rows])}
    cfg = tiny().cfg
    values = {"ids": TINY_IDS, "targets": TINY_TARGETS, "seed": SEED, "positions": len(TINY_IDS), "loss": float(t.loss.data),
              "sizes": {"n_v": cfg.vocab_size, "t_max": cfg.context_len, "d": cfg.emb_dim, "h": cfg.num_heads,
                        "l": cfg.num_layers, "f": cfg.ff_dim},
              "nodes": len(t.order), "parameters": len(t.leaves), "operations": sum(not n.is_leaf for n in t.order),
              "constants": len(t.constants()), "seed_grad": float(t.loss.grad.item()), "dlogits_gap": gap,
              "dlogits_verdict": verdict, "worst_gap": worst[2], "worst": worst[0],
              "passed": sum(v.startswith("pass") for *_, v in rows), "total": len(rows)}
    return tables, values


# ---------------------------------------------------------------- every primitive against central differences

def repeated_ids():
    return np.array([[1, 3, 1], [1, 0, 3]])  # row 1 read three times, row 2 never


PRIMITIVES = (  # (label, operation on Tensors, input shapes, inputs made positive)
    ("add, (2, 3) + (3,)", ag.add, [(2, 3), (3,)], False),
    ("add, (2, 1, 4) + (3, 1)", ag.add, [(2, 1, 4), (3, 1)], False),
    ("sub, (2, 3) − (2, 1)", ag.sub, [(2, 3), (2, 1)], False),
    ("mul, (2, 3, 4) ⊙ (4,)", ag.mul, [(2, 3, 4), (4,)], False),
    ("div, (2, 3) / (3,)", ag.div, [(2, 3), (3,)], True),
    ("power −½", lambda a: ag.power(a, -0.5), [(2, 3)], True),
    ("exp", agf.exp, [(2, 3)], False),
    ("log", agf.log, [(2, 3)], True),
    ("relu", agf.relu, [(3, 4)], False),
    ("erf", agf.erf, [(3, 4)], False),
    ("gelu", agf.gelu, [(3, 4)], False),
    ("softmax", agf.softmax, [(3, 5)], False),
    ("matmul, batched", ag.matmul, [(2, 3, 4), (2, 4, 5)], False),
    ("matmul, a weight", ag.matmul, [(2, 3, 4), (4, 5)], False),
    ("sum, axis 1", lambda a: ag.tensor_sum(a, axis=1), [(2, 3, 4)], False),
    ("mean, last axis", lambda a: ag.mean(a, axis=-1, keepdims=True), [(2, 3, 4)], False),
    ("reshape", lambda a: ag.reshape(a, (3, 4)), [(2, 6)], False),
    ("swapaxes", lambda a: ag.swapaxes(a, 1, 2), [(2, 3, 4)], False),
    ("embedding, repeated ids", lambda table: agf.embedding(table, repeated_ids()), [(4, 5)], False),
    ("layer_norm through the seam", lambda x, g, b: fused_layer_norm(x, g, b, 1e-5), [(2, 4, 3), (3,), (3,)], False),
)


POSITIVE = 0.5  # the inputs of log, power and div are |N(0, 1)| + POSITIVE: away from 0, where they blow up


def primitive_rows(primitives=PRIMITIVES):
    """Each primitive's gradient of every input, by the tape, against central differences of the fake loss."""
    rng, rows = np.random.default_rng(SEED), []
    for label, op, shapes, positive in primitives:
        arrays = [rng.standard_normal(s) for s in shapes]
        arrays = [np.abs(a) + POSITIVE for a in arrays] if positive else arrays
        leaves = [ag.Tensor(a, requires_grad=True) for a in arrays]
        out = op(*leaves)
        r = rng.standard_normal(out.shape)
        out.backward(r)
        loss = lambda: float(np.sum(op(*map(ag.Tensor, arrays)).data * r))  # noqa: E731  reads arrays as moved
        checks = [(f"{label}: input {k}" if len(arrays) > 1 else label, leaf.grad, a)
                  for k, (leaf, a) in enumerate(zip(leaves, arrays))]
        rows += sections.gradcheck_rows(loss, checks, H_STEP)
    return rows


def gradcheck_md():
    return sections.gradcheck_table(primitive_rows()), {"seed": SEED, "positive": POSITIVE}


# ---------------------------------------------------------------- the cross-check: torch, and the hand-written backward

def engine_against_numpy(report):
    """The report's comparison of the engine with the hand-written gradients (both NumPy float64), per parameter:
    the table (folded) and the values of its lead."""
    engine, tol = report["autograd"], report["autograd"]["tolerance"]
    order = [r.tensor for r in report["rows"] if r.check == "autograd"]  # the parameters' order, not the JSON's
    names = sorted(engine["gaps"], key=lambda name: order.index(name) if name in order else len(order))
    rows = [[f"`{name}`", f"{g['max_abs']:.2e}", f"{g['max_rel']:.2e}",
             verdict_text(g["passed"], g["on_floor"], "a zero gradient: held to the absolute bound")]
            for name, g in ((name, engine["gaps"][name]) for name in names)]
    failed = sum(not g["passed"] for g in engine["gaps"].values())
    table = collapsed(f"All {len(rows)} gradients, engine against hand-written",
                      md_table(["Parameter", "Max abs gap", "Max rel gap", "Result"], rows))
    return table, {"rel": tol["rel"], "abs": tol["abs"], "why": tol["why"], "max_rel": engine["max_rel"],
                   "worst": engine["worst"], "on_floor": list(engine["on_floor"]), "floor_count": len(engine["on_floor"]),
                   "verdict": "all pass" if not failed else f"**{failed} FAIL**"}


def devices_with_engine():
    """The tape against torch on every device (the shared renderer), then the engine against the hand-written
    backward; and the values of the section's lead."""
    report = crosscheck_report()
    table, values = engine_against_numpy(report)
    return devices_md(PAGE, registry.BY_ID[PAGE].crosscheck) + "\n" + table, values
