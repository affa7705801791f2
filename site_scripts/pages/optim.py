"""Generator of the AdamW / learning rate / clipping page's fragments."""

import numpy as np

from transformer.config import PRESETS
from transformer.model import init_params, loss_and_grads
from transformer.optim import AdamWConfig, adamw_init, adamw_update, clip_grads, global_norm, is_decayed, lr_at
from transformer.train import TrainConfig

from .. import sections
from ..examples import SEED, TINY_IDS, TINY_TARGETS, default_note, illustrative, tiny


def tiny_grads():
    """The tiny example's parameters and the gradients of its loss on TINY_TARGETS."""
    ex = tiny()
    return ex.params, loss_and_grads(ex.params, ex.ids, np.array([TINY_TARGETS]), ex.cfg)[1]


def example_md():
    params, grads = tiny_grads()
    opt = AdamWConfig()
    state = adamw_init(params)
    names = ["head_w", "lnf_g"]
    before = {k: params[k].copy() for k in names}
    adamw_update(params, grads, state, opt.lr, opt)
    parts = [illustrative(f"One AdamW step (lr = {opt.lr:g}, β1 = {opt.beta1}, β2 = {opt.beta2}, ε = {opt.eps:g}, "
                          f"weight decay {opt.weight_decay}) on the tiny model's gradients for ids `{TINY_IDS}`, "
                          f"targets `{TINY_TARGETS}`.")]
    for k in names:
        change = params[k] - before[k]
        parts.append(f"**`{k}`** (decayed: {'yes' if is_decayed(k) else 'no'})\n")
        parts.append(sections.array_md(f"grad {k}", grads[k]))
        parts.append(sections.array_md(f"change of {k}", change))
    sign_ok = np.all(np.sign(-grads["lnf_g"]) == np.sign(params["lnf_g"] - before["lnf_g"]))
    parts.append(f"On the first step m̂ = g and v̂ = g², so every entry moves by about lr · sign(g) (largest "
                 f"|change| of `lnf_g`: {np.abs(params['lnf_g'] - before['lnf_g']).max():.6f}; every entry "
                 f"moved against its gradient: {'yes' if sign_ok else 'no'}). `head_w` also shrinks by "
                 f"lr · λ = {opt.lr * opt.weight_decay:g} of itself before that.\n")
    return "\n".join(parts)


def schedule_md():
    tc = TrainConfig()
    marks = sorted({0, 1, tc.warmup // 2, tc.warmup - 1, tc.warmup, tc.steps // 4, tc.steps // 2,
                    3 * tc.steps // 4, tc.steps - 1, tc.steps})
    rows = [[s, f"{lr_at(s, tc.lr, tc.warmup, tc.steps, tc.min_lr):.6f}"] for s in marks]
    return (f"`lr_at(step, {tc.lr:g}, {tc.warmup}, {tc.steps}, {tc.min_lr:g})`, the training defaults "
            "(peak, warm-up steps, total steps, floor):\n\n" + sections.md_table(["step (0-based)", "learning rate"],
                                                                                rows))


def clip_md():
    grads = tiny_grads()[1]
    norm = global_norm(grads)
    limit = round(norm / 2, 3)
    clipped, reported = clip_grads(grads, limit)
    after = global_norm(clipped)
    return (f"The tiny example's gradients have global norm {norm:.6f}. Clipped to {limit:g}, `clip_grads` returns "
            f"the norm it found ({reported:.6f}) and gradients of norm {after:.6f}, every one scaled by the same "
            f"factor {after / norm:.6f}, so the direction of the whole update is unchanged.\n")


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
        (r"N_s, N_w", "total_steps, warmup_steps", f"{tc.steps}, {tc.warmup}"),
        (r"\rho", "max_norm", f"{tc.grad_clip}"),
    ]
    return sections.symbols_md(rows, default_note(batch=False) + " (θ shown for `head_w`) and the AdamW and "
                               "training defaults")


def generate(context):
    return {"symbols": symbols_md(), "example": example_md(), "schedule": schedule_md(), "clip": clip_md(),
            "decay": decay_md()}
