"""Generator of the AdamW / learning rate / clipping page: the values its prose shows (docs/training/optim.md binds
them), its tables, and its picture of one parameter entry over a real AdamW run of the tiny model."""

import numpy as np

from transformer.config import PRESETS
from transformer.model import init_params, loss_and_grads
from transformer.optim import AdamWConfig, adamw_init, adamw_update, clip_grads, global_norm, is_decayed, lr_at
from transformer.train_config import TrainConfig

from .. import sections
from ..common import md_table
from ..examples import SEED, TINY_IDS, TINY_TARGETS, default_note, tiny
from ..figures import new_figure, png

EXAMPLE_KEYS = ("head_w", "lnf_g")  # one decayed array, one not
RUN_STEPS = 80  # updates of the picture's run: long enough for the tracked gradient to change sign
TRACKED = ("head_w", (0, 0))  # the entry the picture follows, the one the example writes out


def tiny_grads():
    """The tiny example's parameters and the gradients of its loss on TINY_TARGETS."""
    ex = tiny()
    return ex.params, loss_and_grads(ex.params, ex.ids, np.array([TINY_TARGETS]), ex.cfg)[1]


def first_update(theta, g, lr, opt, decayed):
    """The first AdamW update (n = 1, so m̂ = g and v̂ = g ⊙ g) in one formula: the change of θ,
    −η_s λ θ (decayed arrays only) − η_s g/(|g| + ε_A)."""
    return -(lr * opt.weight_decay * theta if decayed else 0.0) - lr * g / (np.abs(g) + opt.eps)


# ---------------------------------------------------------------- the tiny example: one update

def entry_values(theta, g, change, lr, opt):
    """Entry (0, 0) of a decayed array's first update, term by term, and the change adamw_update made."""
    t, gv = float(theta[0, 0]), float(g[0, 0])
    return {"theta": t, "g": gv, "decay": -lr * opt.weight_decay * t, "adam": -lr * gv / (abs(gv) + opt.eps),
            "total": -lr * opt.weight_decay * t - lr * gv / (abs(gv) + opt.eps), "change": float(change[0, 0])}


def example():
    """One AdamW update of the tiny model: the arrays before and after, the change against the first-update
    formula, and entry (0, 0) written out."""
    params, grads = tiny_grads()
    opt, state = AdamWConfig(), adamw_init(params)
    before = {k: params[k].copy() for k in EXAMPLE_KEYS}
    adamw_update(params, grads, state, opt.lr, opt)
    tables, rows = {}, []
    for k in EXAMPLE_KEYS:
        change = params[k] - before[k]
        gap, verdict = sections.agreement(change, first_update(before[k], grads[k], opt.lr, opt, is_decayed(k)))
        rows.append([f"`{k}`", "yes" if is_decayed(k) else "no", sections.gap_text(gap), verdict])
        if is_decayed(k):  # the only arrays whose θ enters the change
            tables[f"theta_{k}"] = sections.array_md(f"θ of {k} before the update", before[k])
        tables[f"g_{k}"] = sections.array_md(f"g of {k}", grads[k])
        tables[f"change_{k}"] = sections.array_md(f"change of {k}", change, decimals=6)
    tables["agreement"] = md_table(["Array", "decayed", "largest gap", "verdict"], rows)
    change = params["lnf_g"] - before["lnf_g"]
    against = bool(np.all(np.sign(-grads["lnf_g"]) == np.sign(change)))
    cfg = tiny().cfg
    values = {"sizes": {"n_v": cfg.vocab_size, "t_max": cfg.context_len, "d": cfg.emb_dim, "h": cfg.num_heads,
                        "l": cfg.num_layers, "f": cfg.ff_dim},
              "n": state["step"], "lr": opt.lr, "beta1": opt.beta1, "beta2": opt.beta2, "eps": opt.eps,
              "wd": opt.weight_decay, "coef": opt.lr * opt.weight_decay, "keep": 1 - opt.lr * opt.weight_decay,
              "entry": entry_values(before["head_w"], grads["head_w"], params["head_w"] - before["head_w"], opt.lr, opt),
              "lnf_hi": float(np.abs(change).max()), "lnf_lo": float(np.abs(change).min()),
              "against": "yes" if against else "no"}
    return tables, values


# ---------------------------------------------------------------- the picture: one entry over a real run

def adamw_run(steps=RUN_STEPS):
    """The tiny model trained on its example (ids TINY_IDS, targets TINY_TARGETS) with `adamw_update` at the
    constant rate AdamWConfig().lr; per update n = 1..steps: the loss before it, and the tracked entry's
    gradient, moments m and v after it, change and value after it."""
    ex, opt = tiny(), AdamWConfig()
    params = {k: v.copy() for k, v in ex.params.items()}
    state, (key, at) = adamw_init(params), TRACKED
    names = ("loss", "g", "m", "v", "step", "theta")
    rec = {name: [] for name in names}
    for _ in range(steps):
        loss, grads = loss_and_grads(params, ex.ids, np.array([TINY_TARGETS]), ex.cfg)
        before = params[key][at]
        adamw_update(params, grads, state, opt.lr, opt)
        for name, value in zip(names, (loss, grads[key][at], state["m"][key][at], state["v"][key][at],
                                       params[key][at] - before, params[key][at])):
            rec[name].append(float(value))
    return {name: np.array(v) for name, v in rec.items()}


def first_below_zero(a):
    return int(np.argmax(a < 0)) + 1 if (a < 0).any() else None


def trajectory_png(rec, opt):
    """Three panels over the updates: g with m and its correction m̂; |g| with √v and √v̂; the change in units
    of η_s, with the Adam term alone."""
    n = np.arange(1, len(rec["g"]) + 1)
    m_hat, v_hat = rec["m"] / (1 - opt.beta1 ** n), rec["v"] / (1 - opt.beta2 ** n)
    fig, (top, mid, low) = new_figure(3, 1, figsize=(9, 7.5), sharex=True)
    top.plot(n, rec["g"], ".", color="0.5", label="gradient g")
    top.plot(n, rec["m"], "--", color="tab:blue", label="m (running mean)")
    top.plot(n, m_hat, color="tab:blue", label="m̂ = m / (1 − β₁ⁿ)")
    mid.plot(n, np.abs(rec["g"]), ".", color="0.5", label="|g|")
    mid.plot(n, np.sqrt(rec["v"]), "--", color="tab:orange", label="√v (running mean of g²)")
    mid.plot(n, np.sqrt(v_hat), color="tab:orange", label="√v̂ = √(v / (1 − β₂ⁿ))")
    low.plot(n, rec["step"] / opt.lr, ".", color="tab:green", label="change of θ / η")
    low.plot(n, -m_hat / (np.sqrt(v_hat) + opt.eps), color="tab:green", label="−m̂ / (√v̂ + ε_A)")
    for ax in (top, low):
        ax.axhline(0, color="black", linewidth=0.5)
    top.set_ylabel("gradient")
    mid.set_ylabel("size of the gradient")
    low.set_ylabel("change, in units of η")
    low.set_xlabel("update n")
    key, at = TRACKED
    top.set_title(f"entry {at} of {key}, updated by adamw_update at η = {opt.lr:g}")
    for ax in (top, mid, low):
        ax.legend(loc="best", fontsize="small")
    return png(fig)


def trajectory():
    rec, opt = adamw_run(), AdamWConfig()
    ratio, smallest = np.abs(rec["step"]) / opt.lr, int(np.argmin(np.abs(rec["g"])))
    values = {"steps": RUN_STEPS, "key": TRACKED[0], "at": list(TRACKED[1]), "lr": opt.lr,
              "m_share": 1 - opt.beta1, "v_share": float(np.sqrt(1 - opt.beta2)),
              "loss_first": rec["loss"][0], "loss_last": rec["loss"][-1],
              "g_flip": first_below_zero(rec["g"]), "m_flip": first_below_zero(rec["m"]),
              "ratio_hi": float(ratio.max()), "g_hi": float(np.abs(rec["g"]).max()),
              "g_lo": float(np.abs(rec["g"][smallest])), "at_lo": smallest + 1, "ratio_at_lo": float(ratio[smallest])}
    return trajectory_png(rec, opt), values


# ---------------------------------------------------------------- the schedule, clipping, decay

def schedule_branch(s, tc):
    """Which branch of eq-lr-schedule `lr_at` takes at step s, tested in its order."""
    return "warm-up" if s < tc.warmup else "floor" if s >= tc.steps else "cosine"


def schedule():
    tc = TrainConfig()
    marks = sorted({0, 1, tc.warmup // 2, tc.warmup - 1, tc.warmup, tc.steps // 4, tc.steps // 2,
                    3 * tc.steps // 4, tc.steps - 1, tc.steps, tc.steps + 1})
    rates = {s: lr_at(s, tc.lr, tc.warmup, tc.steps, tc.min_lr) for s in marks}
    rows = [[s, schedule_branch(s, tc), f"{rates[s]:.6f}", f"{rates[s] * tc.weight_decay:.2e}"] for s in marks]
    decay = [lr_at(s, tc.lr, tc.warmup, tc.steps, tc.min_lr) * tc.weight_decay for s in range(tc.steps)]
    table = md_table(["\\(s\\) (from 0)", "branch", "\\(\\eta_s\\)", "\\(\\eta_s\\lambda\\)"], rows)
    return table, {"lr": tc.lr, "warmup": tc.warmup, "steps": tc.steps, "min_lr": tc.min_lr, "wd": tc.weight_decay,
                   "lo": min(decay), "lo_step": int(np.argmin(decay)), "hi": max(decay),
                   "hi_step": int(np.argmax(decay)), "factor": max(decay) / min(decay),
                   "kept": float(np.prod([1 - f for f in decay]))}


def clip():
    grads = tiny_grads()[1]
    norm, default = global_norm(grads), TrainConfig().grad_clip
    limit = round(norm / 2, 3)  # half the norm, so that clipping has work to do
    rows = []
    for rho, why in [(limit, "this example: half of \\(\\lVert g \\rVert\\), rounded to 3 decimals"),
                     (default, "the training default, `TrainConfig().grad_clip`"),
                     (round(2 * norm, 3), "twice \\(\\lVert g \\rVert\\), rounded")]:
        clipped, _ = clip_grads(grads, rho)
        after = global_norm(clipped)
        acted = clipped is not grads
        rows.append([f"{rho:g}", why, "yes" if acted else "no (the same arrays back)", f"{after / norm:.6f}",
                     f"{after:.7f}", f"{rho - after:.1e}" if acted else "(not clipped)"])
    clipped, reported = clip_grads(grads, limit)
    factor = {k: float(np.median(clipped[k][grads[k] != 0] / grads[k][grads[k] != 0])) for k in grads}
    table = md_table(["\\(\\rho\\)", "where it comes from", "clipped?", "factor", "\\(\\lVert g \\rVert\\) after",
                      "\\(\\rho\\) − norm after"], rows)
    return table, {"arrays": len(grads), "norm": norm, "reported": reported, "limit": limit,
                   "spread": max(factor.values()) - min(factor.values())}


def decay():
    cfg = PRESETS["default"]
    params = init_params(cfg, seed=SEED)
    decayed = [k for k in params if is_decayed(k)]
    sizes = {"n_v": cfg.vocab_size, "t_max": cfg.context_len, "d": cfg.emb_dim, "h": cfg.num_heads,
             "l": cfg.num_layers, "f": cfg.ff_dim}
    return {"sizes": sizes, "keys": decayed, "rest": [k for k in params if not is_decayed(k)], "count": len(decayed),
            "all": len(params), "scalars": sum(params[k].size for k in decayed),
            "total": sum(v.size for v in params.values())}


def symbols_md():
    cfg = PRESETS["default"]
    params = init_params(cfg, seed=SEED)
    state = adamw_init(params)
    opt, tc = AdamWConfig(), TrainConfig()
    rows = [
        (r"\theta", "p = params[name]", params["head_w"].shape),
        (r"g", "grads[name]", params["head_w"].shape),
        (r"m, v", "state['m'][name], state['v'][name]", state["m"]["head_w"].shape),
        (r"n", "state['step']", "int"),
        (r"\eta_s", "lr", f"peak {opt.lr:g}"),
        (r"\beta_1, \beta_2", "cfg.beta1, cfg.beta2", f"{opt.beta1}, {opt.beta2}"),
        (r"\epsilon_{\mathrm{A}}", "cfg.eps", f"{opt.eps:g}"),
        (r"\lambda", "cfg.weight_decay", f"{opt.weight_decay}"),
        (r"\eta_{\max}, \eta_{\min}", "peak_lr, min_lr", f"{tc.lr:g}, {tc.min_lr:g}"),
        (r"N_s, N_w", "total_steps, warmup_steps", f"{tc.steps}, {tc.warmup}"),
        (r"\rho", "max_norm", f"{tc.grad_clip}", "the training default"),
    ]
    return sections.symbols_md(rows, default_note(batch=False) + " (θ shown for `head_w`) and the AdamW and "
                               "training defaults")


def generate(context):
    example_tables, example_values = example()
    picture, run = trajectory()
    schedule_table, schedule_values = schedule()
    clip_table, clip_values = clip()
    overflow = {dtype: float(np.sqrt(np.finfo(dtype).max)) for dtype in ("float32", "float64")}
    values = {"seed": SEED, "ids": TINY_IDS, "targets": TINY_TARGETS, "overflow": overflow, "example": example_values,
              "run": run, "schedule": schedule_values, "clip": clip_values, "decay": decay()}
    return {"values": values, "trajectory.png": picture, **example_tables, "schedule": schedule_table,
            "clip": clip_table, "symbols": symbols_md()}
