"""The tiny model's forward and backward as a list of steps, for the explorer: each step one layer function the
model calls, run on the output of the step before, with the backward that undoes it and the Jacobian that
backward implies.

The list spells out the order in which the model's functions run (the block's wiring), so it is checked
against the model itself on every run: each step's output is compared, bit for bit, with the same tensor in
`forward`'s trace where the trace keeps it, and each gradient with `backward`'s trace, so a step in the wrong
place or with the wrong input fails the build instead of showing a wrong picture.

A step's Jacobian is its backward applied to each unit vector of its output: row o holds the derivatives of
output entry o with respect to every input entry. Its non-zero entries are what the explorer highlights as
the inputs an output entry depends on; nothing about the dependencies is drawn by hand.
"""

from dataclasses import dataclass

import numpy as np

from transformer.activations import ACTIVATION_FUNCTIONS
from transformer.attention import attention_backward, attention_forward
from transformer.block import block_params
from transformer.embedding import embedding_backward, embedding_forward
from transformer.layernorm import layer_norm_backward, layer_norm_forward
from transformer.linear import linear_backward, linear_forward
from transformer.model import backward, forward, head_weights
from transformer.softmax import cross_entropy_backward, cross_entropy_forward

# Plain-text symbols of the Notation page, for each tensor of a block (l: the block) and of the model.
BLOCK_SYMBOLS = {"ln1": "U₁", "attn": "Attn(U₁)", "mid": "M", "ln2": "U₂", "pre": "G", "hidden": "φ(G)",
                 "ffn": "FFN(U₂)"}
MODEL_SYMBOLS = {"tok_emb": "E_tok", "pos_emb": "E_pos", "embedding": "X⁽⁰⁾", "lnf": "X_f", "logits": "Z",
                 "loss": "ℒ"}
SUPERSCRIPT = str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")
# Which traced gradient each tensor's gradient must equal: backward's trace names (block names for b{l}.*).
TRACED_GRADS = {"logits": "dlogits", "lnf": "dlnf", "embedding": "dembedding"}
BLOCK_TRACED_GRADS = {"hidden": "dhidden", "pre": "dpre", "ln2": "dln2", "mid": "dmid", "ln1": "dln1"}


@dataclass
class Step:
    """One call of the forward, and its backward.

    `inputs` and `output` are tensor names; `jacobians[k]` is (output size, size of input k); `dx[k]` is the
    gradient this step's backward sends to input k (the whole of that input's gradient unless another step reads
    it too); `eqs` and `beqs` are the ids of the equations of its forward and its backward."""
    id: str
    title: str
    inputs: tuple
    output: str
    eqs: tuple
    beqs: tuple
    jacobians: list
    dx: list = None


def unit_jacobian(vjp, y):
    """A Jacobian from a backward: row o is vjp(e_o), the backward of the unit vector of output entry o, flattened,
    that is ∂y_o/∂x. (The backward never forms this matrix; this is how a page shows it.)"""
    y = np.asarray(y, dtype=float)
    rows = []
    for o in range(y.size):
        unit = np.zeros_like(y)
        unit.flat[o] = 1.0
        rows.append(np.ravel(vjp(unit)))
    return np.array(rows)


def symbol(name, cfg):
    """The plain-text symbol of a tensor: X⁽ˡ⁾ for the stream between blocks, and the tables above."""
    if name in MODEL_SYMBOLS:
        return MODEL_SYMBOLS[name]
    block, _, part = name.partition(".")
    if part == "out":
        return f"X⁽{str(int(block[1:]) + 1).translate(SUPERSCRIPT)}⁾"
    return BLOCK_SYMBOLS[part]


class Run:
    """The steps of one forward and backward of the model (params, cfg) on one sequence of ids and targets, with
    every tensor's value and gradient (`values`, `grads`: name to a 2-D array, the batch axis dropped)."""

    def __init__(self, params, cfg, ids, targets):
        self.params, self.cfg = params, cfg
        self.ids, self.targets = np.array([ids]), np.array([targets])
        self.trace, self.grad_trace = {}, {}
        logits, cache = forward(params, self.ids, cfg, self.trace)
        loss, xent_cache = cross_entropy_forward(logits, self.targets)
        self.trace["loss"] = loss
        self.param_grads = backward(cross_entropy_backward(1.0, xent_cache), cache, trace=self.grad_trace)
        self.values, self.caches, self.forwards, self.backwards, self.steps = {}, {}, {}, {}, []
        self.values.update(tok_emb=params["tok_emb"], pos_emb=params["pos_emb"])
        self.run_forward()
        self.run_backward()

    def call(self, id, title, inputs, output, fn, back, eqs, beqs, traced=None):
        """Run one step's forward on its inputs' values and keep its output, its cache and its backward."""
        y, cache = fn(*(self.values[name] for name in inputs))
        if traced is not None and not np.array_equal(y, self.trace[traced]):
            raise RuntimeError(f"the explorer's step {id} computes {output} otherwise than the model's forward")
        self.values[output], self.caches[id], self.forwards[id], self.backwards[id] = y, cache, fn, back
        self.steps.append(Step(id, title, tuple(inputs), output, eqs, beqs, []))

    def run_forward(self):
        cfg, params = self.cfg, self.params
        act_forward, act_backward = ACTIVATION_FUNCTIONS[cfg.activation]
        act = cfg.activation.replace("_", "-")  # its equations' ids: relu, gelu, gelu-tanh
        first = lambda back: lambda dy, c: (back(dy, c)[0],)  # noqa: E731  (the input's gradient alone)
        both = lambda dy, c: (dy, dy)  # noqa: E731  (a residual addition passes its gradient to both terms)
        self.call("embedding", "token and position embeddings", ("tok_emb", "pos_emb"), "embedding",
                  lambda tok, pos: embedding_forward(self.ids, tok, pos), lambda dy, c: embedding_backward(dy, c),
                  ("model-embed",), ("embed-grad",), traced="embedding")
        x = "embedding"
        for l in range(cfg.num_layers):
            p, b = block_params(params, l), f"b{l}."
            self.call(b + "ln1", f"block {l}: LayerNorm 1", (x,), b + "ln1",
                      lambda x, p=p: layer_norm_forward(x, p["ln1_g"], p["ln1_b"], cfg.ln_eps),
                      first(layer_norm_backward), ("ln-norm", "ln-affine"), ("ln-grad",), traced=b + "ln1")
            self.call(b + "attn", f"block {l}: attention", (b + "ln1",), b + "attn",
                      lambda u, p=p: attention_forward(u, p, cfg.num_heads), first(attention_backward),
                      ("attn-scores", "attn-softmax", "attn-mix", "attn-out"), ("attn-grad-input",))
            self.call(b + "mid", f"block {l}: residual", (x, b + "attn"), b + "mid", lambda x, a: (x + a, None),
                      both, ("block-attn-residual",), ("block-residual-grad",))
            self.call(b + "ln2", f"block {l}: LayerNorm 2", (b + "mid",), b + "ln2",
                      lambda h, p=p: layer_norm_forward(h, p["ln2_g"], p["ln2_b"], cfg.ln_eps),
                      first(layer_norm_backward), ("ln-norm", "ln-affine"), ("ln-grad",), traced=b + "ln2")
            self.call(b + "pre", f"block {l}: first linear layer", (b + "ln2",), b + "pre",
                      lambda u, p=p: linear_forward(u, p["ff1_w"], p["ff1_b"]), first(linear_backward),
                      ("linear",), ("linear-grad",))
            self.call(b + "hidden", f"block {l}: {cfg.activation}", (b + "pre",), b + "hidden", act_forward,
                      lambda dy, c: (act_backward(dy, c),), (act,), (f"{act}-grad",))
            self.call(b + "ffn", f"block {l}: second linear layer", (b + "hidden",), b + "ffn",
                      lambda h, p=p: linear_forward(h, p["ff2_w"], p["ff2_b"]), first(linear_backward),
                      ("linear",), ("linear-grad",))
            self.call(b + "out", f"block {l}: residual", (b + "mid", b + "ffn"), b + "out",
                      lambda m, f: (m + f, None), both, ("block-ffn-residual",), ("block-residual-grad",),
                      traced=b + "out")
            x = b + "out"
        self.call("lnf", "final LayerNorm", (x,), "lnf",
                  lambda x: layer_norm_forward(x, params["lnf_g"], params["lnf_b"], cfg.ln_eps),
                  first(layer_norm_backward), ("model-lnf",), ("ln-grad",), traced="lnf")
        self.call("logits", "head", ("lnf",), "logits", lambda x: linear_forward(x, *head_weights(params, cfg)),
                  first(linear_backward), ("head",), ("head-grads",), traced="logits")
        self.call("loss", "cross-entropy", ("logits",), "loss",
                  lambda z: cross_entropy_forward(z, self.targets), lambda dy, c: (cross_entropy_backward(dy, c),),
                  ("xent",), ("model-dlogits",), traced="loss")

    def run_backward(self):
        """Each step's backward, last to first, on the gradient of its output; a tensor read by two steps sums
        both; each gradient the model's backward traces must come out the same."""
        self.grads = {"loss": np.ones_like(self.values["loss"])}
        for step in reversed(self.steps):
            dy, cache, back = self.grads[step.output], self.caches[step.id], self.backwards[step.id]
            step.dx = list(back(dy, cache))
            for name, dx in zip(step.inputs, step.dx, strict=True):
                self.grads[name] = self.grads[name] + dx if name in self.grads else dx
            step.jacobians = [self.jacobian(step, k) for k in range(len(step.inputs))]
        expected = {name: self.grad_trace[traced] for name, traced in self.traced_grads().items()}
        expected.update(tok_emb=self.param_grads["tok_emb"], pos_emb=self.param_grads["pos_emb"])
        for name, value in expected.items():
            if not np.array_equal(self.grads[name], value):
                raise RuntimeError(f"the explorer's gradient of {name} differs from the model's backward")

    def traced_grads(self):
        pairs = dict(TRACED_GRADS)
        for l in range(self.cfg.num_layers):
            pairs.update({f"b{l}.{k}": f"b{l}.{v}" for k, v in BLOCK_TRACED_GRADS.items()})
            pairs[f"b{l}.out"] = f"b{l}.dout"
        return pairs

    def jacobian(self, step, k):
        """The Jacobian of a step's output with respect to its input k: the backward of each unit vector."""
        back, cache = self.backwards[step.id], self.caches[step.id]
        return unit_jacobian(lambda unit: back(unit, cache)[k], self.values[step.output])

    def matrix(self, name):
        """A tensor as the explorer draws it: 2-D, the batch axis dropped (the loss: 1 by 1)."""
        value = np.asarray(self.values[name], dtype=float)
        return value.reshape(1, 1) if value.ndim == 0 else value.reshape(-1, value.shape[-1])
