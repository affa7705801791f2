"""Generator of the Embeddings page: the values its prose shows (docs/model/embeddings.md binds them), its tables
and its picture.

The backward example scatters the tiny model's real gradient of the embedding output (tiny_backward()'s
`dembedding`). `repeated_check` and `order_facts` take what they test as arguments, so that
tests/site/test_pages_ln.py can show each one fails on a planted mistake.
"""

from dataclasses import dataclass

import numpy as np

from transformer.embedding import embedding_backward, embedding_forward
from transformer.errors import InputError
from transformer.model import forward

from .. import sections
from ..common import md_table, verdict_text
from ..examples import H_STEP, SEED, TINY_IDS, TINY_TARGETS, default_note, default_run, tiny, weighted_sum
from ..figures import new_figure, png
from ..sections import gap_text
from ..tiny_backward import tiny_backward

# Two results that are equal in exact arithmetic but summed in another order differ by float64 rounding,
# about 1e-16 of their size; below this fraction of the size they count as equal.
ROUNDING_TOL = 1e-12
FOLLOW = (1, 0)  # the entry of X^(0) whose sum the example writes out: position t, entry i


def second_window():
    """A window of other ids, TINY_IDS rotated by one (it too repeats an id), for a batch of two."""
    return TINY_IDS[-1:] + TINY_IDS[:-1]


def fancy_index_backward(dx, cache):
    """The plain fancy-index version of the token table's gradient, `dtok_emb[ids] += dx`, written only to
    show what it loses (the model uses np.add.at)."""
    dtok = np.zeros(cache.tok_shape)
    dtok[cache.ids.reshape(-1)] += dx.reshape(-1, cache.tok_shape[1])
    return dtok, embedding_backward(dx, cache)[1]


def tiny_sizes():
    cfg = tiny().cfg
    return {"n_v": cfg.vocab_size, "t_max": cfg.context_len, "d": cfg.emb_dim, "h": cfg.num_heads,
            "l": cfg.num_layers, "f": cfg.ff_dim}


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


def repeated(dx):
    """The table of the repeated id's rows, and its values."""
    right, wrong = repeated_check(TINY_IDS, dx), repeated_check(TINY_IDS, dx, fancy_index_backward)
    dx_label = r"\(\partial\ell/\partial X^{(0)}\)"
    rows = [[f"{dx_label} at \\(t\\) = {t}", *(f"{v:.4f}" for v in dx[t])] for t in right.positions]
    rows += [["their sum", *(f"{v:.4f}" for v in right.expected)],
             [f"row {right.token} from `np.add.at`", *(f"{v:.4f}" for v in right.got)],
             [f"row {right.token} from `dtok_emb[ids] += dx`", *(f"{v:.4f}" for v in wrong.got)]]
    values = {"token": right.token, "positions": right.positions, "gap": right.gap,
              "verdict": verdict_text(right.passed, False, ""), "last": right.positions[-1], "wrong_gap": wrong.gap,
              "planted": "caught" if not wrong.passed else "**NOT CAUGHT**"}
    return md_table(["", *range(dx.shape[1])], rows), values


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


def order():
    """The table of the three comparisons (the prose states what they show; tests/site/test_pages_ln.py holds
    the claims to the numbers), and its values."""
    ex = tiny()
    facts = order_facts(ex.params, ex.cfg)
    word = lambda gap: f"{gap_text(gap)} (the same)" if facts.same(gap) else f"{gap:.4f} (different)"  # noqa: E731
    blocks = [f"after block {l}" for l in range(len(facts.without))]
    rows = [[f"`{facts.ids}` against `{facts.swapped}`, last position", "zero", *map(word, facts.without)],
            [f"`{facts.ids}` against `{facts.swapped}`, last position", "as initialised", *map(word, facts.with_pos)],
            [f"`{[facts.ids[-1]] * len(facts.ids)}`, every position against position 0", "zero",
             *map(word, facts.constant)]]
    return md_table(["windows compared", "position table", *blocks], rows), {"scale": facts.scale, "tol": ROUNDING_TOL}


# ---------------------------------------------------------------- the tiny example, forward and backward

def forward_part(ex):
    p, x = ex.params, ex.trace["embedding"][0]
    t, i = FOLLOW
    tables = {"tok": sections.array_md("E_tok (tok_emb)", p["tok_emb"], row_label="token id j"),
              "pos": sections.array_md("E_pos (pos_emb)", p["pos_emb"], row_label="position t"),
              "x": sections.array_md("X^(0) = E_tok[id] + E_pos[:T]", x, row_label="position t")}
    follow = {"t": t, "i": i, "id": TINY_IDS[t], "tok": p["tok_emb"][TINY_IDS[t], i], "pos": p["pos_emb"][t, i],
              "x": x[t, i]}
    if abs(follow["tok"] + follow["pos"] - follow["x"]) > ROUNDING_TOL:
        raise RuntimeError("the Embeddings page's sum by hand disagrees with embedding_forward")
    return tables, {"T": len(TINY_IDS), "follow": follow}


def unused_rows(table, used):
    """The rows a window never reads, and the largest entry of them in size (0 when every one is exactly 0)."""
    unused = [j for j in range(len(table)) if j not in used]
    return unused, float(np.abs(table[unused]).max()) if unused else 0.0


def batch_sum():
    """dE_pos over two windows against the sum of their rows of dX, for a random upstream gradient."""
    ex = tiny()
    ids = np.array([TINY_IDS, second_window()])
    dx = np.random.default_rng(SEED).standard_normal((*ids.shape, ex.cfg.emb_dim))
    _, dpos = embedding_backward(dx, embedding_forward(ids, ex.params["tok_emb"], ex.params["pos_emb"])[1])
    T = ids.shape[1]
    gap = float(np.abs(dpos[:T] - (dx[0] + dx[1])).max())
    return {"ids": str(ids.tolist()), "T": T, "gap": gap,
            "verdict": verdict_text(gap <= ROUNDING_TOL * np.abs(dpos).max(), False, "")}


def backward_part(dx, dtok, dpos):
    positions = [[j, ", ".join(str(t) for t, v in enumerate(TINY_IDS) if v == j)] for j in sorted(set(TINY_IDS))]
    tables = {"dx": sections.array_md("∂ℓ/∂X^(0)", dx, row_label="position t"),
              "dtok": sections.array_md("∂ℓ/∂E_tok", dtok, row_label="token id j"),
              "where": md_table(["id \\(j\\)", "positions \\(t\\) where it stands"], positions),
              "dpos": sections.array_md("∂ℓ/∂E_pos", dpos, row_label="position t")}
    unused_ids, ids_max = unused_rows(dtok, TINY_IDS)
    unused_pos, pos_max = unused_rows(dpos, range(len(TINY_IDS)))
    return tables, {"unused_ids": unused_ids, "unused_ids_max": ids_max, "unused_pos": unused_pos,
                    "unused_pos_max": pos_max, "last": len(TINY_IDS) - 1, "batch": batch_sum()}


# ---------------------------------------------------------------- the picture, and what it costs

WINDOW = 1  # the default run's window the picture shows: it holds two tokens twice each


def lookup_png():
    """The default run's window WINDOW: the token rows looked up, the position rows, and their sum X^(0); the
    rows of the first repeated id are framed. Returns the figure and its values."""
    from matplotlib.patches import Rectangle

    ex = default_run()
    ids, T, d = ex.ids[WINDOW], ex.ids.shape[1], ex.cfg.emb_dim
    token = next(int(v) for v in ids if list(ids).count(v) > 1)
    where = [t for t, v in enumerate(ids) if v == token]
    tok, x = ex.params["tok_emb"][ids], ex.trace["embedding"][WINDOW]
    parts = ((tok, "token rows E_tok[id_t]"), (ex.params["pos_emb"][:T], "position rows E_pos[t]"),
             (x, "their sum X⁽⁰⁾, the stream's start"))
    top = max(np.abs(a).max() for a, _ in parts)
    fig, axes = new_figure(1, 3, figsize=(12, 3.8), sharey=True)
    for ax, (a, title) in zip(axes, parts, strict=True):
        image = ax.imshow(a, cmap="RdBu_r", vmin=-top, vmax=top, aspect="auto")
        ax.set(title=title, xlabel="entry i of the row (of d)")
        for t in where:
            ax.add_patch(Rectangle((-0.5, t - 0.5), d, 1, fill=False, edgecolor="black", lw=1.5))
    axes[0].set_yticks(range(T), [f"t={t}: id {v}" for t, v in enumerate(ids)], fontsize="x-small")
    axes[0].set_ylabel("position t and its token id")
    fig.colorbar(image, ax=list(axes), label="value of the entry", shrink=0.9)
    values = {"window": WINDOW, "T": T, "token": token, "where": where,
              "tok_gap": float(np.abs(tok[where[0]] - tok[where[1]]).max()),
              "x_gap": float(np.abs(x[where[0]] - x[where[1]]).max())}
    return png(fig), values


def cost():
    """The lookup against the one-hot product it stands for, and the refusal of a window longer than T_max."""
    ex = default_run()
    (B, T), cfg = ex.ids.shape, ex.cfg
    try:
        forward(ex.params, np.zeros((1, cfg.context_len + 1), dtype=int), cfg)
        refusal = "none"
    except InputError as e:
        refusal = str(e)
    return {"B": B, "T": T, "n_v": cfg.vocab_size, "d": cfg.emb_dim, "lookup": B * T * cfg.emb_dim,
            "onehot": B * T * cfg.vocab_size * cfg.emb_dim, "t_max": cfg.context_len, "too_long": cfg.context_len + 1,
            "refusal": refusal}


# ---------------------------------------------------------------- the evidence

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
    return sections.gradcheck_table(rows)


def generate(context):
    ex, replay = tiny(), tiny_backward()
    dx = replay.steps["dembedding"][0]
    order_table, order_values = order()
    forward_tables, forward_values = forward_part(ex)
    backward_tables, backward_values = backward_part(dx, replay.grads["tok_emb"], replay.grads["pos_emb"])
    repeated_table, repeated_values = repeated(dx)
    picture, picture_values = lookup_png()
    values = {"ids": TINY_IDS, "targets": TINY_TARGETS, "seed": SEED, "sizes": tiny_sizes(), "picture": picture_values,
              "order": order_values, "forward": forward_values, "backward": backward_values,
              "repeated": repeated_values, "cost": cost()}
    return {"values": values, "order": order_table, **forward_tables, **backward_tables, "repeated": repeated_table,
            "lookup.png": picture, "symbols": symbols_md(), "gradcheck": gradcheck_md()}
