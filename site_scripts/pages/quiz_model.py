"""Generator of the Model chapter's quiz (site_scripts/pages/_quiz.py): attention's shapes, LayerNorm's cache,
the causal mask and the parameter count, each answer and each wrong choice read from a run of the model's code
or from the code itself, on the tiny model."""

import inspect

import numpy as np

from transformer.attention import attention_forward, causal_mask
from transformer.block import block_params
from transformer.config import PRESETS
from transformer.embedding import embedding_forward
from transformer.layernorm import LayerNormCache, layer_norm_forward
from transformer.model import init_params, param_count, param_shapes

from ..sections import page_link
from ._quiz import Choice, Question, page

CFG = PRESETS["tiny"]
# One window of three tokens: with T = 3 no two of the shapes the attention question offers coincide (T = d would).
IDS = np.array([[2, 0, 2]])


def code(names):
    return ", ".join(f"`{n}`" for n in names)


def embedded():
    """The tiny model (seed 0) and its embeddings of IDS, the input of block 0."""
    params = init_params(CFG, seed=0)
    x, _ = embedding_forward(IDS, params["tok_emb"], params["pos_emb"])
    return params, x


def attention_weights():
    """The shape of the attention weights, read from a run of `attention_forward` with a trace, against the
    shapes of its input and of its keys, which a reader may take it for."""
    params, x = embedded()
    trace = {}
    _, cache = attention_forward(x, block_params(params, 0), CFG.num_heads, trace)
    att = trace["attention"]
    (B, T, d), kv, H = x.shape, cache.k.shape, cache.k.shape[1]
    zeros = int((att == 0).sum())
    return Question(
        "quiz-attention-weights",
        f"Block 0 of the tiny model (\\(d\\) = {d}, \\(H\\) = {H} heads) runs attention on one window of "
        f"\\(T\\) = {T} tokens. What shape has the table of attention weights, the softmax of the scores, that "
        f"`attention_forward` keeps for the backward?",
        (Choice(f"`{att.shape}`",
                f"\\((B, H, T, T)\\): each of the {H} heads weighs every query position against every key position, "
                f"a {T} × {T} table per head and window. After the causal mask, {zeros} of its {att.size} entries are "
                f"exactly 0: the ones above each head's diagonal.", right=True),
         Choice(f"`{x.shape}`",
                f"That is attention's input (and its output), \\((B, T, d)\\). The weights are not per position and "
                f"feature but per pair of positions, and per head."),
         Choice(f"`{kv}`",
                f"That is the shape of the queries, keys and values, \\((B, H, T, d_h)\\) with \\(d_h = d/H\\) = "
                f"{kv[3]}. The scores multiply queries by keys and sum over \\(d_h\\), which leaves a {T} × {T} "
                f"table per head."),
         Choice(f"`{(B, T, T)}`",
                f"One table for all heads. Each of the {H} heads scores with its own queries and keys, so the "
                f"weights keep a head axis: {H} tables of {T} × {T}.")),
        page_link("quiz_model", "attention", "eq-attn-scores"), "Attention: scaled scores, per head")


def layernorm_cache():
    """What `layer_norm_backward` reads from its cache: the fields of LayerNormCache, against other tensors of
    the forward (its parameters and its locals, read from its code) that a reader may think it keeps."""
    params, x = embedded()
    _, cache = layer_norm_forward(x, params["b0.ln1_g"], params["b0.ln1_b"], CFG.ln_eps)
    fields = LayerNormCache._fields
    forward_names = set(inspect.signature(layer_norm_forward).parameters) | set(layer_norm_forward.__code__.co_varnames)
    if not {"x", "mean", "var", "b", "eps"} <= forward_names or set(fields) != {"xhat", "rstd", "g"}:
        raise ValueError(f"layer_norm_forward's names changed ({sorted(forward_names)}): rewrite this question")
    sizes = {f: int(np.size(getattr(cache, f))) for f in fields}
    rows = sizes["rstd"]
    return Question(
        "quiz-layernorm-cache",
        "`layer_norm_backward` works from the cache `layer_norm_forward` returns, a `LayerNormCache`. What does "
        "that cache hold?",
        (Choice(code(fields),
                f"\\(\\hat{{x}}\\) and each row's \\(r = 1/\\sqrt{{\\sigma^2 + \\epsilon}}\\) are all the three terms "
                f"of the input's gradient need, and the gain comes first in the backward (the gradient of "
                f"\\(\\hat{{x}}\\) is the upstream gradient times `g`). For block 0's first LayerNorm on one window "
                f"of {rows} tokens: {' + '.join(str(s) for s in sizes.values())} = {sum(sizes.values())} numbers.",
                right=True),
         Choice(code(("x", "mean", "rstd", "g")),
                f"Enough to rebuild \\(\\hat{{x}} = (x - \\mu)\\, r\\), but the backward would redo the forward's "
                f"subtraction and product. Keeping \\(\\hat{{x}}\\) itself costs the {sizes['xhat']} numbers `x` "
                f"would, and the {rows} means are not needed at all."),
         Choice(code(("xhat", "rstd", "g", "b")),
                "The shift `b` is never multiplied by anything: its gradient is the upstream gradient summed over "
                "the rows, and no other gradient holds it. The backward has no use for it."),
         Choice(code(("xhat", "var", "g")),
                f"With the variance, the backward would compute \\(1/\\sqrt{{\\sigma^2 + \\epsilon}}\\) again, and "
                f"it would need \\(\\epsilon\\) (`eps`), which the cache does not hold. The forward computed the "
                f"{rows} values of `rstd` already.")),
        page_link("quiz_model", "layernorm", "eq-ln-grad"), "LayerNorm: backward, three terms")


def mask_rows():
    """Whether a row of the causal mask can be minus infinity everywhere, read from `causal_mask` itself."""
    T = CFG.context_len
    mask = causal_mask(T, np.dtype(np.float64))
    seen = np.isfinite(mask).sum(axis=1).tolist()  # keys each query row may see
    hidden = int(np.isneginf(mask).sum())
    if np.isneginf(mask).all(axis=1).any():
        raise ValueError("causal_mask has a row masked everywhere: the question's answer changed")
    return Question(
        "quiz-causal-mask",
        f"Can a row of `causal_mask(T)` (here \\(T\\) = {T}) be \\(-\\infty\\) in every entry, leaving the "
        f"softmax of that row nothing to weigh?",
        (Choice("No: every row keeps its diagonal entry at 0",
                f"Query \\(t\\) always sees its own key, so row \\(t\\) has \\(t + 1\\) entries that are not "
                f"\\(-\\infty\\): {', '.join(map(str, seen))} here. A fully masked row, which the softmax refuses, "
                f"can come only from scores that are \\(-\\infty\\) themselves.", right=True),
         Choice("Yes: row 0, since the first position has no earlier one to look at",
                f"Row 0 looks at position 0 itself: its diagonal entry is 0, and only the {T - seen[0]} entries to "
                f"its right are \\(-\\infty\\)."),
         Choice(f"Yes: the last row, position {T - 1}",
                f"The last row is the one with no \\(-\\infty\\) at all: it sees all {seen[-1]} positions."),
         Choice("No: the mask holds no \\(-\\infty\\), it multiplies the weights by 0 or 1",
                f"{hidden} of its {mask.size} entries are \\(-\\infty\\). The mask is added to the scores before the "
                f"softmax, which turns those entries into weights of exactly 0; zeroing weights after the softmax "
                f"would leave rows that no longer sum to 1.")),
        page_link("quiz_model", "attention", "eq-attn-mask"), "Attention: causal mask")


def parameter_count():
    """The tiny model's number of scalars, `param_count`, against the counts of three common slips, each
    summed from `param_shapes`."""
    shapes = param_shapes(CFG)
    sizes = {name: int(np.prod(shape)) for name, shape in shapes.items()}
    total = param_count(CFG)
    if total != sum(sizes.values()):
        raise ValueError("param_count disagrees with param_shapes")
    block = sum(s for name, s in sizes.items() if name.startswith("b0."))
    matrices = sum(sizes[name] for name, shape in shapes.items() if len(shape) == 2)
    tied = param_count(CFG.with_(tied_head=True))
    L, n_v, d = CFG.num_layers, CFG.vocab_size, CFG.emb_dim
    return Question(
        "quiz-parameter-count",
        f"How many scalars do the parameters of the tiny model hold (\\(n_V\\) = {n_v}, \\(T_{{\\max}}\\) = "
        f"{CFG.context_len}, \\(d\\) = {d}, \\(H\\) = {CFG.num_heads}, \\(L\\) = {L}, \\(F\\) = {CFG.ff_dim})?",
        (Choice(str(total),
                f"\\(N_\\theta\\) = `param_count`: the two tables ({sizes['tok_emb']} + {sizes['pos_emb']}), "
                f"{L} blocks of {block}, the final LayerNorm ({sizes['lnf_g'] + sizes['lnf_b']}) and the head "
                f"({sizes['head_w']} + {sizes['head_b']}), the sizes of `param_shapes` added up.", right=True),
         Choice(str(total - (L - 1) * block),
                f"This counts one block only. Each of the {L} blocks has its own {block} parameters."),
         Choice(str(matrices),
                f"This counts the matrices only. The biases and the LayerNorm gains and shifts are parameters too: "
                f"{total - matrices} more scalars."),
         Choice(str(tied),
                f"That is GPT-2's layout, where the head is the token table's transpose. This model has a head of "
                f"its own, `head_w`, \\(d \\times n_V\\) = {d * n_v} more scalars.")),
        page_link("quiz_model", "model", "eq-param-count"), "The full model: number of scalars")


def questions():
    """The quiz's questions, in the order of the chapter's pages."""
    return [attention_weights(), layernorm_cache(), mask_rows(), parameter_count()]


def generate(context):
    return page(questions())
