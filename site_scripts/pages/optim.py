"""Generator of the AdamW / learning rate / clipping page's fragments."""

import numpy as np

from transformer.config import PRESETS
from transformer.model import init_params, loss_and_grads
from transformer.optim import AdamWConfig, adamw_init, adamw_update, clip_grads, global_norm, is_decayed, lr_at
from transformer.train_config import TrainConfig

from .. import sections
from ..examples import SEED, TINY_IDS, TINY_TARGETS, default_note, illustrative, tiny


def tiny_grads():
    """The tiny example's parameters and the gradients of its loss on TINY_TARGETS."""
    ex = tiny()
    return ex.params, loss_and_grads(ex.params, ex.ids, np.array([TINY_TARGETS]), ex.cfg)[1]


def first_update(theta, g, lr, opt, decayed):
    """The first AdamW update (n = 1, so m̂ = g and v̂ = g ⊙ g) in one formula: the change of θ,
    −η_s λ θ (decayed arrays only) − η_s g/(|g| + ε_A)."""
    return -(lr * opt.weight_decay * theta if decayed else 0.0) - lr * g / (np.abs(g) + opt.eps)


def tex_number(v):
    """A number for LaTeX: 1e-08 as 10^{-8}, 2.5e-05 as 2.5 \\times 10^{-5}, others as :g writes them."""
    text = f"{v:g}"
    if "e" not in text:
        return text
    mantissa, exponent = text.split("e")
    power = f"10^{{{int(exponent)}}}"
    return power if mantissa == "1" else f"{mantissa} \\times {power}"


def entry_arithmetic(theta, g, change, lr, opt):
    """Entry (0, 0) of a decayed array's first update written out from the arrays."""
    t, gv, c = theta[0, 0], g[0, 0], change[0, 0]
    decay, adam = lr * opt.weight_decay * t, lr * gv / (abs(gv) + opt.eps)
    return (f"Entry (0, 0): \\(-{lr * opt.weight_decay:g} \\cdot {sections.num(t)} - {lr:g} \\cdot "
            f"{sections.num(gv)} / (|{sections.num(gv)}| + {tex_number(opt.eps)})\\) = "
            f"{sections.num(-decay, 6, False)} − {sections.num(adam, 6)} = {sections.num(-decay - adam, 6, False)}; "
            f"the table's change is {sections.num(c, 6, False)}.")


def example_md():
    params, grads = tiny_grads()
    opt = AdamWConfig()
    state = adamw_init(params)
    names = ["head_w", "lnf_g"]
    before = {k: params[k].copy() for k in names}
    adamw_update(params, grads, state, opt.lr, opt)
    parts = [illustrative(f"One AdamW update (\\(n = {state['step']}\\), \\(\\eta_s = {opt.lr:g}\\), "
                          f"\\(\\beta_1 = {opt.beta1}\\), \\(\\beta_2 = {opt.beta2}\\), "
                          f"\\(\\epsilon_{{\\mathrm{{A}}}} = {tex_number(opt.eps)}\\), "
                          f"\\(\\lambda = {opt.weight_decay}\\)) "
                          f"on the tiny model's gradients for ids `{TINY_IDS}`, targets `{TINY_TARGETS}`.")]
    parts.append("On the first update \\(\\hat m = g\\) and \\(\\hat v = g \\odot g\\), so the "
                 "[decay](#eq-adamw-decay) and the [update](#eq-adam-update) together are\n\n"
                 "$$\n\\theta \\leftarrow \\theta - \\eta_s \\lambda\\, \\theta "
                 "- \\eta_s\\, \\frac{g}{|g| + \\epsilon_{\\mathrm{A}}}\n$$\n\n"
                 "entry by entry, without the term \\(-\\eta_s \\lambda\\, \\theta\\) for an array that is not "
                 "decayed; \\(\\theta\\) on the right is the array before the update. In the tables of `head_w` "
                 "(\\(W_h\\)), row \\(i\\) is the input unit and column \\(i'\\) the output unit.\n")
    rows = []
    for k in names:
        change = params[k] - before[k]
        formula = first_update(before[k], grads[k], opt.lr, opt, is_decayed(k))
        gap, verdict = sections.agreement(change, formula)
        rows.append([f"`{k}`", "yes" if is_decayed(k) else "no", sections.gap_text(gap), verdict])
        parts.append(f"**`{k}`** (decayed: {'yes' if is_decayed(k) else 'no'})\n")
        if is_decayed(k):  # the only arrays whose θ enters the change
            parts.append(sections.array_md(f"θ of {k} before the update", before[k]))
        parts.append(sections.array_md(f"g of {k}", grads[k]))
        parts.append(sections.array_md(f"change of {k}", change, decimals=6))
        if is_decayed(k):
            parts.append(entry_arithmetic(before[k], grads[k], change, opt.lr, opt) + "\n")
    parts.append("The change computed by `adamw_update` against the formula above, for every entry:\n\n"
                 + sections.md_table(["Array", "decayed", "largest gap", "verdict"], rows))
    change = params["lnf_g"] - before["lnf_g"]
    sign_ok = np.all(np.sign(-grads["lnf_g"]) == np.sign(change))
    parts.append(f"Without the decay every entry changes by \\(-\\eta_s\\, g/(|g| + \\epsilon_{{\\mathrm{{A}}}})\\), "
                 f"about \\(\\eta_s\\) against the sign of its "
                 f"gradient whatever the gradient's size (largest |change| of `lnf_g`: {np.abs(change).max():.6f}, "
                 f"smallest {np.abs(change).min():.6f}; every entry moved against its gradient: "
                 f"{'yes' if sign_ok else 'no'}). `head_w` is decayed as well: before that step it was multiplied by "
                 f"\\(1 - \\eta_s\\lambda\\) = {1 - opt.lr * opt.weight_decay:g}, losing "
                 f"\\(\\eta_s\\lambda\\) = {opt.lr * opt.weight_decay:g} of itself at this \\(\\eta_s\\).\n")
    return "\n".join(parts)


def schedule_branch(s, tc):
    """Which branch of eq-lr-schedule `lr_at` takes at step s, tested in its order."""
    return "warm-up" if s < tc.warmup else "floor" if s >= tc.steps else "cosine"


def schedule_md():
    tc = TrainConfig()
    marks = sorted({0, 1, tc.warmup // 2, tc.warmup - 1, tc.warmup, tc.steps // 4, tc.steps // 2,
                    3 * tc.steps // 4, tc.steps - 1, tc.steps, tc.steps + 1})
    rates = {s: lr_at(s, tc.lr, tc.warmup, tc.steps, tc.min_lr) for s in marks}
    rows = [[s, schedule_branch(s, tc), f"{rates[s]:.6f}", f"{rates[s] * tc.weight_decay:.2e}"] for s in marks]
    decay = [lr_at(s, tc.lr, tc.warmup, tc.steps, tc.min_lr) * tc.weight_decay for s in range(tc.steps)]
    return (f"`lr_at(s, {tc.lr:g}, {tc.warmup}, {tc.steps}, {tc.min_lr:g})` at the training defaults "
            f"(\\(\\eta_{{\\max}}\\), \\(N_w\\), \\(N_s\\), \\(\\eta_{{\\min}}\\)), with the branch of the "
            f"[whole schedule](#eq-lr-schedule) it takes and the fraction \\(\\eta_s\\lambda\\) "
            f"(\\(\\lambda = {tc.weight_decay}\\)) that weight decay removes from a decayed parameter at that step:\n\n"
            + sections.md_table(["\\(s\\) (from 0)", "branch", "\\(\\eta_s\\)", "\\(\\eta_s\\lambda\\)"], rows)
            + f"\nOver the {tc.steps} steps of a default run the decay fraction ranges from {min(decay):.2e} (step "
              f"{int(np.argmin(decay))}) to {max(decay):.2e} (step {int(np.argmax(decay))}), a factor of "
              f"{max(decay) / min(decay):.0f}: the shrinking follows the schedule. A decayed parameter that received "
              f"no gradient at all would keep {np.prod([1 - f for f in decay]):.4f} of itself after the whole run.\n")


def clip_md():
    grads = tiny_grads()[1]
    norm, default = global_norm(grads), TrainConfig().grad_clip
    limit = round(norm / 2, 3)  # half the norm, so that clipping has work to do
    rows = []
    for rho, why in [(limit, "this example: half of \\(\\lVert g \\rVert\\), rounded to 3 decimals"),
                     (default, "the training default, `TrainConfig().grad_clip`"),
                     (round(2 * norm, 3), "twice \\(\\lVert g \\rVert\\), rounded")]:
        clipped, reported = clip_grads(grads, rho)
        after = global_norm(clipped)
        acted = clipped is not grads
        rows.append([f"{rho:g}", why, "yes" if acted else "no (the same arrays back)", f"{after / norm:.6f}",
                     f"{after:.7f}", f"{rho - after:.1e}" if acted else "(not clipped)"])
    clipped, reported = clip_grads(grads, limit)
    factor = {k: float(np.median(clipped[k][grads[k] != 0] / grads[k][grads[k] != 0])) for k in grads}
    spread = max(factor.values()) - min(factor.values())
    return (f"The tiny example's gradients (all {len(grads)} arrays) have global norm "
            f"\\(\\lVert g \\rVert\\) = {norm:.6f}; `clip_grads` returns that norm ({reported:.6f}) whatever it "
            "does, and the training loop logs it as `grad_norm`. The threshold \\(\\rho\\) is a setting, not a "
            f"property of the gradients: the first row's {limit:g} is chosen by this page only so that clipping has "
            "work to do. Three thresholds on the same gradients:\n\n"
            + sections.md_table(["\\(\\rho\\)", "where it comes from", "clipped?", "factor",
                                 "\\(\\lVert g \\rVert\\) after", "\\(\\rho\\) − norm after"], rows)
            + f"\nWhen clipping acts, the factor is \\(\\rho/(\\lVert g \\rVert + 10^{{-6}})\\) and the same for "
              f"every array (over the {len(grads)} arrays at \\(\\rho\\) = {limit:g}, the per-array factors differ by "
              f"{spread:.1e}), so the direction of the whole update is unchanged; the \\(10^{{-6}}\\) leaves the norm "
              "after a little below \\(\\rho\\). Above the norm, nothing is scaled.\n")


def decay_md():
    cfg = PRESETS["default"]
    params = init_params(cfg, seed=SEED)
    decayed = [k for k in params if is_decayed(k)]
    rest = [k for k in params if not is_decayed(k)]
    n = sum(params[k].size for k in decayed)
    total = sum(v.size for v in params.values())
    return (f"At {default_note(batch=False)}: {len(decayed)} of {len(params)} keys are decayed ({n} of {total} "
            "scalars): " + ", ".join(f"`{k}`" for k in decayed) + ". Not decayed: "
            + ", ".join(f"`{k}`" for k in rest) + ".\n")


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
    overflow = {dtype: float(np.sqrt(np.finfo(dtype).max)) for dtype in ("float32", "float64")}
    return {"values": {"overflow": overflow}, "symbols": symbols_md(), "example": example_md(), "schedule": schedule_md(), "clip": clip_md(),
            "decay": decay_md()}
