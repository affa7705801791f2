"""Generator of the Embeddings page's fragments (see site_scripts/build.py).

The backward example scatters the tiny model's real gradient of the embedding output (tiny_backward()'s
`dembedding`). `repeated_check` and `order_gaps` take what they test as arguments, so that
tests/site/test_pages_ln.py can show each one fails on a planted mistake.
"""

from dataclasses import dataclass

import numpy as np

from transformer.embedding import embedding_backward, embedding_forward
from transformer.model import forward

from .. import sections
from ..common import md_table, verdict_text
from ..examples import H_STEP, SEED, TINY_IDS, TINY_TARGETS, default_note, default_run, illustrative, tiny, weighted_sum
from ..sections import gap_text
from ..tiny_backward import tiny_backward

# Two results that are equal in exact arithmetic but summed in another order differ by float64 rounding,
# about 1e-16 of their size; below this fraction of the size they count as equal.
ROUNDING_TOL = 1e-12
NOTATION = "../reference/notation.md"
DX = r"\(\partial\ell/\partial X^{(0)}\)"  # how the sentences write the embedding output's gradient


def second_window():
    """A window of other ids, TINY_IDS rotated by one (it too repeats an id), for a batch of two."""
    return TINY_IDS[-1:] + TINY_IDS[:-1]


def fancy_index_backward(dx, cache):
    """The plain fancy-index version of the token table's gradient, `dtok_emb[ids] += dx`, written only to
    show what it loses (the model uses np.add.at)."""
    dtok = np.zeros(cache.tok_shape)
    dtok[cache.ids.reshape(-1)] += dx.reshape(-1, cache.tok_shape[1])
    return dtok, embedding_backward(dx, cache)[1]


# ---------------------------------------------------------------- the repeated id

@dataclass(frozen=True)
class RepeatedCheck:
    token: int
    positions: list  # where the token occurs in the window
    expected: np.ndarray  # the sum of dX at those positions
    got: np.ndarray  # the backward's row of dE_tok
    gap: float

    @property
    def passed(self):
        return self.gap <= ROUNDING_TOL * np.abs(self.expected).max()


def repeated_check(ids, dx, backward=embedding_backward):
    """The first repeated id of one window: its row of dE_tok against the sum of dX at its positions."""
    p = tiny().params
    token = next(v for v in ids if ids.count(v) > 1)
    positions = [t for t, v in enumerate(ids) if v == token]
    dtok, _ = backward(dx[None], embedding_forward(np.array([ids]), p["tok_emb"], p["pos_emb"])[1])
    expected = dx[positions].sum(axis=0)
    return RepeatedCheck(token, positions, expected, dtok[token], float(np.abs(dtok[token] - expected).max()))


def repeated_md():
    dx = tiny_backward().steps["dembedding"][0]
    right, wrong = repeated_check(TINY_IDS, dx), repeated_check(TINY_IDS, dx, fancy_index_backward)
    rows = [[f"{DX} at \\(t\\) = {t}", *(f"{v:.4f}" for v in dx[t])] for t in right.positions]
    rows += [["their sum", *(f"{v:.4f}" for v in right.expected)],
             [f"row {right.token} from `np.add.at`", *(f"{v:.4f}" for v in right.got)],
             [f"row {right.token} from `dtok_emb[ids] += dx`", *(f"{v:.4f}" for v in wrong.got)]]
    last = right.positions[-1]
    return "\n".join([
        f"Token {right.token} stands at positions {right.positions} of ids `{TINY_IDS}`; {DX} is the tiny "
        f"model's real gradient (`dembedding` of `site_scripts/tiny_backward.py`).\n",
        md_table(["", *range(dx.shape[1])], rows),
        f"`np.add.at` gives the sum: largest gap {gap_text(right.gap)}, {verdict_text(right.passed, False, '')}. "
        f"The fancy-index assignment gives position {last}'s row alone (the last write): its gap to the sum is "
        f"{wrong.gap:.4f}, the largest entry of the rows it dropped, and the same check "
        f"{'passes (wrongly)' if wrong.passed else 'fails on it'}. The [mutation run](../verification/mutants.md) "
        "plants this mistake in the model's code (`embedding-grad-fancy-index`) and reports which tests catch it.\n",
    ])


# ---------------------------------------------------------------- order without a position table

def order_gaps(params, cfg, ids, other):
    """Largest difference at the last position between two id sequences, after each block."""
    runs = []
    for seq in (ids, other):
        trace = {}
        forward(params, np.array([seq]), cfg, trace)
        runs.append(trace)
    return [float(np.abs(runs[0][f"b{l}.out"][0, -1] - runs[1][f"b{l}.out"][0, -1]).max())
            for l in range(cfg.num_layers)]


def constant_gaps(params, cfg, token, T):
    """Largest difference between positions of the window [token] * T, after each block."""
    trace = {}
    forward(params, np.array([[token] * T]), cfg, trace)
    return [float(np.abs(trace[f"b{l}.out"][0] - trace[f"b{l}.out"][0, :1]).max()) for l in range(cfg.num_layers)]


@dataclass(frozen=True)
class OrderFacts:
    """What the prose says of order without a position table, measured (gaps after block 0, block 1, ...)."""
    ids: list
    swapped: list
    without: list  # the last position, ids against swapped, position table zero
    with_pos: list  # the same with the position table as initialised
    constant: list  # a window of one repeated token, position t against position 0, position table zero
    scale: float  # the size of the stream, for what counts as rounding

    def same(self, gap):
        return gap <= ROUNDING_TOL * self.scale

    def problems(self):
        """The prose's claims that the numbers contradict."""
        claims = {"one layer without positions cannot tell the two orders apart": self.same(self.without[0]),
                  "two layers without positions can": not self.same(self.without[-1]),
                  "one layer with positions can": not self.same(self.with_pos[0]),
                  "a repeated token gives every position the same vector": all(map(self.same, self.constant))}
        return [claim for claim, holds in claims.items() if not holds]


def order_facts(params, cfg, ids=tuple(TINY_IDS)):
    ids = list(ids)
    if ids[0] == ids[1]:
        raise ValueError(f"ids {ids}: swapping two equal tokens shows nothing")
    swapped = [ids[1], ids[0], *ids[2:]]
    no_pos = dict(params, pos_emb=np.zeros_like(params["pos_emb"]))
    trace = {}
    forward(params, np.array([ids]), cfg, trace)
    return OrderFacts(ids, swapped, order_gaps(no_pos, cfg, ids, swapped), order_gaps(params, cfg, ids, swapped),
                      constant_gaps(no_pos, cfg, ids[-1], len(ids)), float(np.abs(trace["b0.out"]).max()))


def order_md(facts=None):
    ex = tiny()
    facts = facts or order_facts(ex.params, ex.cfg)
    if facts.problems():
        raise RuntimeError("the Embeddings page's prose on order no longer holds: " + "; ".join(facts.problems()))
    word = lambda gap: f"{gap_text(gap)} (the same)" if facts.same(gap) else f"{gap:.4f} (different)"
    blocks = [f"after block {l}" for l in range(len(facts.without))]
    rows = [[f"`{facts.ids}` against `{facts.swapped}`, last position", "zero", *map(word, facts.without)],
            [f"`{facts.ids}` against `{facts.swapped}`, last position", "as initialised", *map(word, facts.with_pos)],
            [f"`{[facts.ids[-1]] * len(facts.ids)}`, every position against position 0", "zero",
             *map(word, facts.constant)]]
    return "\n".join([
        md_table(["windows compared", "position table", *blocks], rows),
        "Each cell is the largest difference between the two residual-stream rows compared (a row of "
        f"\\(X^{{(l+1)}}\\), entries of size up to {facts.scale:.2f} here); \"the same\" means below "
        f"{ROUNDING_TOL:g} of that size, where the only difference left is rounding (the same terms summed in "
        "another order). Without a position table, block 0 gives the last position the same row for both orders "
        "and block 1 does not: the second layer reads what the first computed at positions 0 and 1, which "
        "depended on their order. With the position table, block 0 already tells the orders apart. A window of "
        "one repeated token stays the same at every position after every block: with nothing to tell positions "
        "apart, no depth helps.\n",
    ])


# ---------------------------------------------------------------- the tiny example, forward and backward

def zero_rows_text(table, used, what):
    """Which rows were not used, and whether every entry of them is exactly zero."""
    unused = [j for j in range(len(table)) if j not in used]
    if not unused:
        return f"Every {what} is used, so no row is left at zero."
    exact = all(np.all(table[j] == 0) for j in unused)
    state = "exactly 0.0 in every entry" if exact else "**not all zero**"
    return f"The rows of the {what}s not used ({unused}) are {state}"


def batch_sum_md():
    """dE_pos over two windows against the sum of their rows of dX, for a random upstream gradient."""
    ex = tiny()
    ids = np.array([TINY_IDS, second_window()])
    dx = np.random.default_rng(SEED).standard_normal((*ids.shape, ex.cfg.emb_dim))
    _, dpos = embedding_backward(dx, embedding_forward(ids, ex.params["tok_emb"], ex.params["pos_emb"])[1])
    T = ids.shape[1]
    gap = float(np.abs(dpos[:T] - (dx[0] + dx[1])).max())
    passed = gap <= ROUNDING_TOL * np.abs(dpos).max()
    return (f"With two windows (ids `{ids.tolist()}`, a random upstream gradient \\(R\\) of seed {SEED}), the first "
            f"{T} rows of \\(\\partial\\ell/\\partial E_{{\\mathrm{{pos}}}}\\) are the two windows of \\(R\\) added: "
            f"largest gap {gap_text(gap)}, {verdict_text(passed, False, '')}.\n")


def example_md():
    ex, replay = tiny(), tiny_backward()
    p, T, dx = ex.params, len(TINY_IDS), replay.steps["dembedding"][0]
    x = ex.trace["embedding"][0]
    dtok, dpos = replay.grads["tok_emb"], replay.grads["pos_emb"]
    return "\n".join([
        illustrative(f"ids `{TINY_IDS}` (one window, \\(T\\) = {T} of \\(T_{{\\max}}\\) = {ex.cfg.context_len} "
                     "positions); the tables as initialised."),
        sections.array_md("E_tok (tok_emb)", p["tok_emb"], row_label="token id j"),
        sections.array_md("E_pos (pos_emb)", p["pos_emb"], row_label="position t"),
        sections.array_md("X^(0) = E_tok[id] + E_pos[:T]", x, row_label="position t"),
        "Backward. The upstream gradient is the tiny model's real one, the gradient of the mean cross-entropy "
        f"against the targets `{TINY_TARGETS}` that reaches the embedding output (`dembedding` of "
        "`site_scripts/tiny_backward.py`: block 0's \\(\\partial\\ell/\\partial M\\) plus its LN1's share, worked out "
        "on the "
        "[LayerNorm](layernorm.md#tiny-numerical-example) page):\n",
        sections.array_md("∂ℓ/∂X^(0)", dx, row_label="position t"),
        sections.array_md("∂ℓ/∂E_tok", dtok, row_label="token id j"),
        f"Row \\(j\\) is the sum of the rows of {DX} at the positions where id \\(j\\) stands: "
        + "; ".join(f"row {j} from positions {[t for t, v in enumerate(TINY_IDS) if v == j]}"
                    for j in sorted(set(TINY_IDS)))
        + f" (the [check above](#into-the-token-table)). {zero_rows_text(dtok, TINY_IDS, 'id')}: the window "
        "never reads them, so \\(\\ell\\) does not depend on them.\n",
        sections.array_md("∂ℓ/∂E_pos", dpos, row_label="position t"),
        f"Rows 0 to {T - 1} are {DX} itself, summed over one window. "
        f"{zero_rows_text(dpos, range(T), 'position')}: a window of \\(T\\) = {T} never reads them.\n",
        batch_sum_md(),
    ])


def symbols_md():
    ex = default_run()
    cfg, ids, p = ex.cfg, ex.ids, ex.params
    x, cache = embedding_forward(ids, p["tok_emb"], p["pos_emb"])
    dx = np.random.default_rng(SEED).standard_normal(x.shape)
    dtok, dpos = embedding_backward(dx, cache)
    rows = [
        (r"\mathrm{id}", "ids", ids.shape),
        (r"n_V", "cfg.vocab_size", f"{cfg.vocab_size}"),
        (r"T", "ids.shape[-1]", f"{ids.shape[-1]}"),
        (r"T_{\max}", "cfg.context_len", f"{cfg.context_len}"),
        (r"E_{\mathrm{tok}}", "tok_emb", p["tok_emb"].shape),
        (r"E_{\mathrm{pos}}", "pos_emb", p["pos_emb"].shape),
        (r"X^{(0)}", "x", x.shape),
        (r"\partial\ell/\partial X^{(0)}", "dx", dx.shape),
        (r"\partial\ell/\partial E_{\mathrm{tok}}", "dtok_emb", dtok.shape,
         "scatter-added over the positions of each id"),
        (r"\partial\ell/\partial E_{\mathrm{pos}}", "dpos_emb", dpos.shape, "summed over the windows"),
    ]
    return sections.symbols_md(rows, default_note())


def gradcheck_md():
    ex = tiny()
    ids = np.array([TINY_IDS, second_window()])  # two windows, each repeating an id
    tok, pos = ex.params["tok_emb"].copy(), ex.params["pos_emb"].copy()
    dx = np.random.default_rng(SEED).standard_normal((*ids.shape, ex.cfg.emb_dim))
    dtok, dpos = embedding_backward(dx, embedding_forward(ids, tok, pos)[1])
    rows = sections.gradcheck_rows(weighted_sum(dx, embedding_forward, ids, tok, pos),
                                   [("dtok_emb", dtok, tok), ("dpos_emb", dpos, pos)], H_STEP)
    return (f"The [fake loss]({NOTATION}#fake-loss) \\(f = \\sum \\mathcal{{F}} \\odot R\\) with "
            f"\\(\\mathcal{{F}} = X^{{(0)}}\\), for ids `{ids.tolist()}` (a repeated id in each window) and a random "
            f"\\(R\\) (seed {SEED}); `dtok_emb` and `dpos_emb` are "
            "\\(\\partial f/\\partial E_{\\mathrm{tok}}\\) and \\(\\partial f/\\partial E_{\\mathrm{pos}}\\).\n\n"
            + sections.gradcheck_table(rows))


def generate(context):
    return {"symbols": symbols_md(), "example": example_md(), "gradcheck": gradcheck_md(), "order": order_md(),
            "repeated": repeated_md()}
