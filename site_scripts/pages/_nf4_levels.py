"""The NF4 page's weights and where they fall: the float32 weights it quantizes (normal, and heavy-tailed), one
block of them against the 16 levels and each level's share of a whole weight (the page's picture), and the
error of NF4 against a uniform 4-bit code on the same blocks (with its figure).

Values, tables and figures only; the words are in docs/finetuning/nf4.md."""

import inspect
from statistics import NormalDist

import numpy as np

from transformer import nf4

from ..common import md_table
from ..examples import SEED, default_run
from ..figures import new_figure, png

BLOCK = inspect.signature(nf4.quantize).parameters["block_size"].default
SIGMA = 0.02  # the spread of the page's normal weights
TAIL_DOF = 4  # the heavy-tailed weights: a Student-t with this many degrees of freedom, times SIGMA
ERROR_SHAPE = (256, 256)
UNIFORM = np.arange(-7, 8, dtype=np.float32) / np.float32(7)  # symmetric 4-bit absmax code: -7..7 over 7
REAL = "b0.ff1_w"  # the model's own weight whose level shares the page shows (as init_params draws it)
IDEAL_DRAWS = 1 << 20  # draws of the spread the levels are spaced for, to measure their shares


def normal_weight(shape, seed=SEED, scale=SIGMA):
    """A float32 weight drawn from N(0, scale²): the distribution NF4 is built for."""
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def heavy_weight(shape, seed=SEED, scale=SIGMA):
    """A float32 weight from a Student-t with TAIL_DOF degrees of freedom: heavier tails than the normal, as
    trained weights have (rare outliers set the absmax of their block)."""
    return (np.random.default_rng(seed).standard_t(TAIL_DOF, shape) * scale).astype(np.float32)


def weights():
    """The weights whose level shares the page measures, by the label its table and figure give them."""
    return {"normal": normal_weight(ERROR_SHAPE), "heavy-tailed": heavy_weight(ERROR_SHAPE),
            f"default model's `{REAL}`": default_run().params[REAL].astype(np.float32)}


# ---------------------------------------------------------------- the levels: one block, and each level's share

def shares(w):
    """The share of the weight's entries stored as each of the 16 codes (single quantization, blocks of BLOCK)."""
    codes = nf4.unpack(nf4.quantize(w, BLOCK, double=False).packed, w.size)
    return np.bincount(codes, minlength=16) / w.size


def levels_png(block, all_shares):
    """Left: one block's weights sorted, the 16 levels times its absmax, and each weight's decoded value. Right:
    the share of each level over whole weights, beside the equal share 1/16."""
    from matplotlib.ticker import MaxNLocator

    code, absmax = nf4.nf4_code(), np.abs(block).max()
    block = np.sort(block)
    decoded = code[nf4.nearest(block / absmax, code)] * absmax
    fig, (ax, right) = new_figure(1, 2, figsize=(12, 4.2), gridspec_kw={"width_ratios": [3, 2]})
    for j, level in enumerate(code * absmax):
        ax.axhline(level, color="tab:gray", lw=0.6, zorder=0)
        ax.text(block.size + 0.5, level, f"j = {j}", fontsize=6, va="center", color="tab:gray")
    x = np.arange(block.size)
    ax.vlines(x, block, decoded, color="tab:red", lw=0.8)
    ax.plot(x, block, "o", ms=3, color="tab:blue", label="weight θ_i, sorted")
    ax.plot(x, decoded, "_", ms=7, color="tab:red", label="decoded: its nearest level")
    ax.set(xlabel="the block's weights, smallest first", ylabel="value")
    ax.set_title(f"one block of {block.size} weights and the 16 levels ν_j × its absmax", fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    for (label, share), marker in zip(all_shares.items(), "os^", strict=True):
        right.plot(np.arange(16), share, marker + "-", ms=4, lw=0.8, label=label.replace("`", ""))
    right.axhline(1 / 16, color="k", ls=":", lw=1, label="equal shares, 1/16")
    right.set(xlabel="level j", ylabel="share of the weight's entries")
    right.set_title(f"each level's share of a whole weight, blocks of {BLOCK}", fontsize=10)
    right.xaxis.set_major_locator(MaxNLocator(integer=True))
    right.legend(fontsize=7)
    return png(fig)


def levels():
    """(the picture, the shares table, values): one block of the normal weight against the levels, and each
    level's share of three whole weights."""
    drawn = weights()
    found = {label: shares(w) for label, w in drawn.items()}
    normal = drawn["normal"].reshape(-1)
    blocks = normal[: normal.size - normal.size % BLOCK].reshape(-1, BLOCK)
    table = md_table(["level \\(j\\)", "\\(\\nu_j\\)", *(f"share, {label}" for label in found)],
                     [[j, f"{v:+.4f}", *(f"{s[j]:.2%}" for s in found.values())] for j, v in enumerate(nf4.nf4_code())])
    short = {"normal": "normal", "heavy-tailed": "heavy", f"default model's `{REAL}`": "real"}
    ranges = {short[label]: {"lo": float(s.min()), "lo_j": int(s.argmin()), "hi": float(s.max()),
                             "hi_j": int(s.argmax())} for label, s in found.items()}
    block = normal[:BLOCK]
    spread = float(np.mean(blocks.std(axis=1) / np.abs(blocks).max(axis=1)))
    assumed = 1 / NormalDist().inv_cdf(nf4.NF4_OFFSET)
    ideal = np.clip(np.random.default_rng(SEED).standard_normal(IDEAL_DRAWS) * assumed, -1, 1).astype(np.float32)
    ideal_shares = np.bincount(nf4.nearest(ideal, nf4.nf4_code()), minlength=16) / ideal.size
    return levels_png(block, found), table, {
        **ranges, "equal": 1 / 16, "block": BLOCK, "absmax": float(np.abs(block).max()),
        "unused": int(16 - np.unique(nf4.nearest(block / np.abs(block).max(), nf4.nf4_code())).size),
        "spread": spread, "assumed": assumed, "real_name": REAL, "ideal_draws": IDEAL_DRAWS,
        "ideal_lo": float(ideal_shares.min()), "ideal_hi": float(ideal_shares.max())}


# ---------------------------------------------------------------- the error, NF4 against uniform

def errors(w):
    """(error / block absmax) of every weight under NF4 and under the uniform code, same blocks, same scales."""
    flat = w.reshape(-1)
    out = {}
    for name, code in (("NF4", nf4.nf4_code()), ("uniform 4-bit", UNIFORM)):
        codes, absmax = nf4.quantize_blocks(flat, code, BLOCK)
        scale = np.repeat(absmax, BLOCK)[:flat.size]
        out[name] = (code[codes] * scale - flat) / scale
    return out


def error_runs():
    return {"normal": errors(normal_weight(ERROR_SHAPE)), "heavy-tailed": errors(heavy_weight(ERROR_SHAPE))}


def error_png(runs):
    fig, axes = new_figure(1, 2, figsize=(11, 4))
    bins = np.linspace(-0.2, 0.2, 81)
    for ax, (kind, errs) in zip(axes, runs.items()):
        for name, e in errs.items():
            ax.hist(e, bins=bins, histtype="step", lw=1.4, label=f"{name} (RMS {np.sqrt(np.mean(e ** 2)):.4f})")
        ax.set(yscale="log", title=f"{kind} weights, blocks of {BLOCK}",
               xlabel="error of a weight / its block's absmax", ylabel="weights")
        ax.legend(loc="upper right", fontsize=8)
    fig.suptitle(f"Quantization error of NF4 and of a uniform 4-bit absmax code, {ERROR_SHAPE[0]}×{ERROR_SHAPE[1]} "
                 "float32 weights")
    fig.tight_layout()
    return png(fig)


def error_table(runs):
    """(table, values) of the error of both codes on both kinds of weight."""
    cells = []
    for kind, errs in runs.items():
        for name, e in errs.items():
            cells.append([kind, name, f"{np.sqrt(np.mean(e ** 2)):.4f}", f"{np.mean(np.abs(e)):.4f}",
                          f"{np.abs(e).max():.4f}", f"{np.mean(e == 0):.1%}"])
    worst = {name: max(np.abs(errs[name]).max() for errs in runs.values()) for name in ("NF4", "uniform 4-bit")}
    ratio = {kind: float(np.sqrt(np.mean(errs["uniform 4-bit"] ** 2) / np.mean(errs["NF4"] ** 2)))
             for kind, errs in runs.items()}
    table = md_table(["weights", "code", "RMS error / absmax", "mean |error| / absmax", "largest", "exact"], cells)
    return table, {"shape": ERROR_SHAPE, "block": BLOCK, "sigma": SIGMA, "dof": TAIL_DOF, "seed": SEED,
                   "ratio_normal": ratio["normal"], "ratio_heavy": ratio["heavy-tailed"],
                   "worst_nf4": float(worst["NF4"]), "worst_uniform": float(worst["uniform 4-bit"]),
                   "gap_nf4": float(np.diff(nf4.nf4_code()).max()), "gap_uniform": float(np.diff(UNIFORM).max())}
