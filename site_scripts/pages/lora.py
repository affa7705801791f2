"""Generator of the LoRA page's fragments: the symbol table, the tiny example (one adapted layer at step 0 and
after one AdamW step), the adapters at the real configuration, the checks (step 0, merge, the chain rule, the
loss over part of a window), the gradient checks, and the command line run for real (site_scripts/pages/_lora_cli.py).
"""

import numpy as np

from transformer.config import PRESETS
from transformer.finetune import adapter_loss_and_grads
from transformer.lora import TARGETS, Frozen, LoRAConfig, adapter_shapes, frozen_linear_backward, \
    frozen_linear_forward, init_adapters
from transformer.model import param_count, param_shapes
from transformer.optim import AdamWConfig, adamw_init, adamw_update, is_decayed

from .. import sections
from ..common import md_table
from ..examples import H_STEP, SEED, TINY_IDS, TINY_TARGETS, default_note, default_run, illustrative, tiny, \
    weighted_sum
from . import _lora_checks, _lora_cli

EXAMPLE_LORA = LoRAConfig(rank=2, alpha=4.0, targets=("q", "v"))  # the tiny model is 4 wide
ALL_TARGETS = LoRAConfig(rank=2, alpha=4.0, targets=tuple(TARGETS))
EXAMPLE_LR = 1e-2  # one AdamW step of the example
LEARN_FROM = 1  # the tiny model's gradient check counts positions 1 and 2 of its three


def trained(adapters, seed=SEED + 1, size=0.3):
    """Adapters as training leaves them (W_B no longer zero), so that every gradient term counts."""
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(v.shape) * size for k, v in adapters.items()}


# ---------------------------------------------------------------- symbols

def symbols_md():
    ex, lora = default_run(), LoRAConfig()
    cfg = ex.cfg
    adapters = init_adapters(param_shapes(cfg), lora, seed=SEED)
    x, p = ex.trace["b0.ln1"], ex.params
    w = Frozen(p["b0.wq"], adapters["b0.wq.lora_a"], adapters["b0.wq.lora_b"], lora.scale)
    y, cache = frozen_linear_forward(x, w, p["b0.bq"])
    dy = np.ones_like(y)
    dx, (da, dbm) = frozen_linear_backward(dy, cache)
    n_a = sum(int(np.prod(s)) for s in adapter_shapes(param_shapes(cfg), lora).values())
    T = x.shape[1]
    rows = [
        (r"A", "x", x.shape, "block 0's \\(U_1\\), the input of its query projection"),
        (r"W", "w.base", w.shape, "`b0.wq`, frozen"),
        (r"b", "b", p["b0.bq"].shape, "`b0.bq`, frozen"),
        (r"W_A", "w.a", w.a.shape, "`b0.wq.lora_a`"),
        (r"W_B", "w.bm", w.bm.shape, "`b0.wq.lora_b`"),
        (r"n_r", "lora.rank", "int", f"{lora.rank} (`LoRAConfig`'s default)"),
        (r"\alpha_{\mathrm{LoRA}}", "lora.alpha", "float", f"{lora.alpha:g}"),
        (r"s_{\mathrm{LoRA}}", "w.scale", "float", f"{lora.scale:g}"),
        (r"Y", "y", y.shape),
        (r"\partial\ell/\partial Y", "dy", dy.shape),
        (r"\partial\ell/\partial A", "dx", dx.shape),
        (r"\partial\ell/\partial W_A", "da", da.shape),
        (r"\partial\ell/\partial W_B", "dbm", dbm.shape),
        (r"W_{\mathrm{merged}}", "merged['b0.wq']", w.shape),
        (r"t_{\mathrm{from}}", "learn_from", "int", f"any of 0 to {T - 1}"),
        (r"N_A", "sum of the adapters' sizes", "int",
         f"{n_a:,} for targets {', '.join(lora.targets)}, of \\(N_\\theta\\) = {param_count(cfg):,}"),
    ]
    return sections.symbols_md(rows, default_note() + f", adapters of rank {lora.rank} on q and v")


# ---------------------------------------------------------------- the tiny example

def example_md():
    ex, lora = tiny(), EXAMPLE_LORA
    cfg, params = ex.cfg, ex.params
    ids, targets = np.array([TINY_IDS]), np.array([TINY_TARGETS])
    adapters = init_adapters(param_shapes(cfg), lora, seed=SEED)
    x, W, b = ex.trace["b0.ln1"][0], params["b0.wq"], params["b0.bq"]
    a, bm = adapters["b0.wq.lora_a"], adapters["b0.wq.lora_b"]
    y0, _ = frozen_linear_forward(x, Frozen(W, a, bm, lora.scale), b)
    base = x @ W + b
    _, grads = adapter_loss_and_grads(params, adapters, ids, targets, cfg, lora)
    zero_a = [k for k in grads if k.endswith(".lora_a") and not grads[k].any()]
    state = adamw_init(adapters)
    after = {k: v.copy() for k, v in adapters.items()}
    adamw_update(after, grads, state, EXAMPLE_LR, AdamWConfig())
    a1, bm1 = after["b0.wq.lora_a"], after["b0.wq.lora_b"]
    y1, _ = frozen_linear_forward(x, Frozen(W, a1, bm1, lora.scale), b)
    correction = lora.scale * (x @ a1) @ bm1
    return "\n".join([
        illustrative(f"ids `{TINY_IDS}`, targets `{TINY_TARGETS}`. Adapters of rank \\(n_r\\) = {lora.rank} on "
                     f"q and v, \\(\\alpha_{{\\mathrm{{LoRA}}}}\\) = {lora.alpha:g}, so \\(s_{{\\mathrm{{LoRA}}}}\\) = "
                     f"{lora.scale:g}; the layer shown is block 0's query projection."),
        "The layer's input \\(A\\) (block 0's \\(U_1\\)), its frozen weight \\(W\\), and the adapters as "
        "`init_adapters` draws them:\n",
        sections.array_md("A", x, row_label="position"), sections.array_md("W", W), sections.array_md("W_A", a),
        sections.array_md("W_B", bm),
        f"\n**Step 0.** `frozen_linear_forward` gives \\(Y\\); the base layer \\(A W + b\\) is the same array "
        f"(`np.array_equal`: {np.array_equal(y0, base)}), because \\((A W_A) W_B\\) adds exact zeros.\n",
        sections.array_md("Y", y0, row_label="position"),
        f"\nThe whole model's loss at step 0 gives every \\(W_B\\) a gradient, and every \\(W_A\\) exactly zero "
        f"({len(zero_a)} of the {sum(k.endswith('.lora_a') for k in grads)} `lora_a` gradients are all zeros): \\(\\partial\\ell/\\partial W_A\\) is proportional to "
        f"\\(W_B\\) ([its equation](#eq-lora-grad-a)). One AdamW step (learning rate {EXAMPLE_LR:g}) therefore "
        "moves \\(W_B\\) only:\n",
        sections.array_md("W_B after one step", bm1),
        f"\n\\(W_A\\) after the step equals \\(W_A\\) before it (`np.array_equal`: {np.array_equal(a1, a)}): its "
        f"gradient was zero, and the adapters take no weight decay (`is_decayed('b0.wq.lora_a')` is "
        f"{is_decayed('b0.wq.lora_a')}). The correction \\(s_{{\\mathrm{{LoRA}}}} (A W_A) W_B\\) the step made, "
        "and the layer's new output:\n",
        sections.array_md("correction", correction, row_label="position"),
        sections.array_md("Y after one step", y1, row_label="position"),
        f"\nThe new output is the base layer plus the correction, to rounding: largest gap "
        f"{sections.gap_text(float(np.abs(y1 - (base + correction)).max()))}.\n",
    ])


# ---------------------------------------------------------------- the adapters at the real configuration

def targets_md():
    cfg, lora = PRESETS["default"], LoRAConfig()
    shapes = param_shapes(cfg)
    rows = []
    for target, short in TARGETS.items():
        names = [n for n in shapes if n.rsplit(".", 1)[-1] == short]
        one = adapter_shapes({names[0]: shapes[names[0]]}, LoRAConfig(lora.rank, lora.alpha, (target,)))
        a_shape, b_shape = one.values()
        per = sum(int(np.prod(s)) for s in one.values())
        rows.append([f"`{target}`", f"`{short}`", len(names), sections.shape_text(shapes[names[0]]),
                     sections.shape_text(a_shape), sections.shape_text(b_shape), f"{per:,}",
                     f"{int(np.prod(shapes[names[0]])):,}"])
    counts = []
    for name in ("default", "A", "B"):
        c = PRESETS[name]
        for targets in (lora.targets, tuple(TARGETS)):
            n_a = sum(int(np.prod(s)) for s in adapter_shapes(param_shapes(c), LoRAConfig(lora.rank, lora.alpha,
                                                                                           targets)).values())
            counts.append([f"`{name}`", f"\\(d\\) = {c.emb_dim}, \\(L\\) = {c.num_layers}, \\(F\\) = {c.ff_dim}",
                           ", ".join(targets), f"{n_a:,}", f"{param_count(c):,}", f"{n_a / param_count(c):.2%}"])
    return (f"Every target at the default config, rank \\(n_r\\) = {lora.rank} (`LoRAConfig`'s default), read "
            "from `adapter_shapes`:\n\n"
            + md_table(["target", "weight", "weights adapted", "\\(W\\)", "\\(W_A\\)", "\\(W_B\\)",
                        "adapter scalars per weight", "scalars of \\(W\\)"], rows)
            + f"\nThe trainable fraction \\(N_A / N_\\theta\\) at the model's presets, for the default targets "
              f"({', '.join(lora.targets)}) and for all of them:\n\n"
            + md_table(["preset", "sizes", "targets", "\\(N_A\\)", "\\(N_\\theta\\)", "trainable"], counts)
            + "\n\\(N_\\theta\\) is `param_count` of the base; \\(N_A\\) the sum of the sizes `adapter_shapes` "
              "gives. The adapters' gradients and AdamW moments are \\(3 N_A\\) numbers where full fine-tuning "
              "holds \\(3 N_\\theta\\); the [QLoRA](qlora.md#memory) page measures the bytes.\n")


# ---------------------------------------------------------------- gradient checks

def layer_gradcheck_md():
    ex, rng = tiny(), np.random.default_rng(SEED)
    x = rng.standard_normal((2, 3, ex.cfg.emb_dim))
    adapters = trained(init_adapters(param_shapes(ex.cfg), EXAMPLE_LORA, seed=SEED))
    w = Frozen(ex.params["b0.wq"].copy(), adapters["b0.wq.lora_a"], adapters["b0.wq.lora_b"], EXAMPLE_LORA.scale)
    b = ex.params["b0.bq"] + 0.1 * rng.standard_normal(ex.params["b0.bq"].shape)
    dy = rng.standard_normal((2, 3, w.shape[1]))
    dx, (da, dbm) = frozen_linear_backward(dy, frozen_linear_forward(x, w, b)[1])
    checks = [("dx", dx, x), ("da", da, w.a), ("dbm", dbm, w.bm)]
    rows = sections.gradcheck_rows(weighted_sum(dy, frozen_linear_forward, x, w, b), checks, H_STEP)
    return (f"**One adapted layer.** The [fake loss](../reference/notation.md#fake-loss) \\(f = \\sum Y \\odot R\\) "
            f"of `frozen_linear_forward` on the tiny model's `b0.wq` with adapters of rank {EXAMPLE_LORA.rank} "
            f"(\\(W_B\\) moved off zero, so that every term counts), a random input of shape `{x.shape}` and a "
            f"random \\(R\\) (seed {SEED}):\n\n" + sections.gradcheck_table(rows))


def model_gradcheck_md():
    ex = tiny()
    cfg, params, lora = ex.cfg, ex.params, ALL_TARGETS
    ids, targets = np.array([TINY_IDS, TINY_IDS[::-1]]), np.array([TINY_TARGETS, TINY_TARGETS[::-1]])
    adapters = trained(init_adapters(param_shapes(cfg), lora, seed=SEED))
    _, grads = adapter_loss_and_grads(params, adapters, ids, targets, cfg, lora, LEARN_FROM)

    def loss():
        return adapter_loss_and_grads(params, adapters, ids, targets, cfg, lora, LEARN_FROM)[0]

    rows = sections.gradcheck_rows(loss, [(k, grads[k], adapters[k]) for k in adapters], H_STEP)
    return (f"**Every adapter parameter of the whole model.** `adapter_loss_and_grads` on the tiny model with "
            f"adapters of rank {lora.rank} on every target ({', '.join(lora.targets)}; \\(W_B\\) moved off zero), "
            f"two windows, learning from position \\(t_{{\\mathrm{{from}}}}\\) = {LEARN_FROM}; each of the "
            f"{sum(a.size for a in adapters.values())} adapter entries moved in turn:\n\n"
            + sections.gradcheck_table(rows, differentiated="the mean cross-entropy over the counted positions, "
                                                            "[the loss over part of a window](#eq-time-range-loss)"))


def generate(context):
    return {"symbols": symbols_md(), "example": example_md(), "targets": targets_md(),
            "checks": _lora_checks.checks_md(), "gradcheck": layer_gradcheck_md() + "\n" + model_gradcheck_md(),
            "cli": _lora_cli.cli_md()}

