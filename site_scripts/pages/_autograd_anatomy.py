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
from ..examples import H_STEP, SEED, TINY_IDS, TINY_TARGETS, collapsed, illustrative, sizes, tiny
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
    return {size: name for name, size in named.items()} | {1: "1"}


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
    return sections.symbols_md(rows, note) + "\n" + shapes_md(t, names)


def shapes_md(t, names):
    """The graph's operation nodes by kind: how many, and their shapes, named and as recorded."""
    by_op = {}
    for node in t.order:
        if not node.is_leaf:
            by_op.setdefault(node.op, Counter())[node.shape] += 1
    rows = [[f"`{op}`", sum(shapes.values()),
             ", ".join(f"{symbolic(s, names)} = `{s}`" + (f" × {k}" if k > 1 else "") for s, k in shapes.items())]
            for op, shapes in sorted(by_op.items(), key=lambda item: -sum(item[1].values()))]
    return ("The graph's operation nodes, recorded from the same run (leaves are the parameters, shaped as on the "
            "[full model](../model/full-model.md) page; constants, such as the causal mask and the one-hot "
            f"targets, are not nodes: {len(t.constants())} of them):\n\n"
            + md_table(["Operation", "Nodes", "Shapes (symbolic = recorded, × how many)"], rows))


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


def example_md(c=None):
    c = c or tiny_comparison()
    t = c.tape
    number = {id(node): i for i, node in enumerate(t.order)}
    names = {id(leaf): name for name, leaf in t.leaves.items()}
    users = t.users()
    first = list(reversed(t.order))[:8]
    visit = [[f"#{number[id(n)]}", f"`{n.op}`", sections.shape_text(n.shape),
              ", ".join(parent_label(p, number, names) for p in n.parents), users[id(n)],
              f"{np.abs(n.grad).max():.4f}"] for n in first]
    operations = sum(not n.is_leaf for n in t.order)
    grad_rows = [[f"`{name}`", sections.shape_text(shape), f"{gap:.1e}", verdict]
                 for name, shape, gap, verdict in c.rows()]
    worst = max(c.rows(), key=lambda r: r[2])
    gap, verdict = sections.agreement(c.dlogits_tape(), c.dlogits_hand)
    return "\n".join([
        illustrative(f"The mean cross-entropy of ids `{TINY_IDS}` against the targets `{TINY_TARGETS}`, on the "
                     f"tape: {len(t.order)} nodes ({len(t.leaves)} parameters and {operations} operations) and "
                     f"{len(t.constants())} constants. `backward` ran with `keep_grads=True` so that every node's "
                     "gradient can be shown; the engine drops them as it goes."),
        "The first nodes `backward` visits, from the root down (#k is \\(\\operatorname{ord}(\\psi)\\), the "
        "node's place in the topological order; the root's gradient is the seed, "
        f"{t.loss.grad.item():g}):\n",
        md_table(["Node", "Operation", "Shape", "Made from", "Users", "Largest \\(\\lvert\\partial\\ell/\\partial"
                  "\\psi\\rvert\\)"], visit),
        sections.array_md("∂ℓ/∂Z by the tape (the logits node's grad)", c.dlogits_tape(), row_label="position t"),
        sections.array_md("∂ℓ/∂Z = (P − e_y)/N by cross_entropy_backward", c.dlogits_hand, row_label="position t"),
        f"The two agree to {gap:.0e}: {verdict}. The tape found this without a rule for cross-entropy: it is the "
        "sum of what the log-sum-exp, the subtraction and the product with the one-hot targets pass back.\n",
        f"Every parameter's gradient against `loss_and_grads` (the hand-written backward): the largest gap is "
        f"{worst[2]:.0e}, in `{worst[0]}`; {sum(r[3].startswith('pass') for r in c.rows())} of "
        f"{len(grad_rows)} pass.\n",
        collapsed(f"All {len(grad_rows)} parameter gradients, tape against hand-written",
                  md_table(["Parameter", "Shape", "Largest gap", "Result"], grad_rows)),
    ])


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


def primitive_rows(primitives=PRIMITIVES):
    """Each primitive's gradient of every input, by the tape, against central differences of the fake loss."""
    rng, rows = np.random.default_rng(SEED), []
    for label, op, shapes, positive in primitives:
        arrays = [rng.standard_normal(s) for s in shapes]
        arrays = [np.abs(a) + 0.5 for a in arrays] if positive else arrays
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
    return ("Every primitive of `transformer/autograd.py` and `transformer/autograd_functions.py`, and one custom op, "
            "differentiated by the tape (`backward` seeded with \\(R\\)) against central differences of the "
            f"[fake loss](../reference/notation.md#fake-loss) \\(f = \\sum \\mathcal{{F}} \\odot R\\), for random inputs "
            f"and a random \\(R\\) (seed {SEED}; inputs of log, power and div moved to 0.5 and above).\n\n"
            + sections.gradcheck_table(primitive_rows()))


# ---------------------------------------------------------------- the cross-check: torch, and the hand-written backward

def engine_against_numpy_md(report):
    """The report's comparison of the engine with the hand-written gradients (both NumPy float64), per parameter."""
    engine, tol = report["autograd"], report["autograd"]["tolerance"]
    order = [r.tensor for r in report["rows"] if r.check == "autograd"]  # the parameters' order, not the JSON's
    names = sorted(engine["gaps"], key=lambda name: order.index(name) if name in order else len(order))
    rows = [[f"`{name}`", f"{g['max_abs']:.2e}", f"{g['max_rel']:.2e}",
             verdict_text(g["passed"], g["on_floor"], "a zero gradient: held to the absolute bound")]
            for name, g in ((name, engine["gaps"][name]) for name in names)]
    failed = sum(not g["passed"] for g in engine["gaps"].values())
    return (f"**The engine against the hand-written backward.** Both are NumPy float64, so they are held to "
            f"{tol['rel']:g} relative ({tol['abs']:g} absolute for a gradient that is zero in exact arithmetic): "
            f"{tol['why']}. Largest relative gap {engine['max_rel']:.1e}, in `{engine['worst']}`; "
            f"{len(engine['on_floor'])} zero gradients ({', '.join(f'`{n}`' for n in engine['on_floor'])}) within "
            f"the absolute bound; {'all pass' if not failed else f'**{failed} FAIL**'}. The command line prints the "
            "three side by side: hand-written against torch, engine against torch, engine against hand-written.\n\n"
            + collapsed(f"All {len(rows)} gradients, engine against hand-written",
                        md_table(["Parameter", "Max abs gap", "Max rel gap", "Result"], rows)))


def devices_with_engine_md():
    report = crosscheck_report()
    return devices_md(PAGE, registry.BY_ID[PAGE].crosscheck) + "\n" + engine_against_numpy_md(report)
