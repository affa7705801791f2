"""Generator of the LoRA page (docs/finetuning/lora.md): its values and tables. The picture of one trained
adapter pair, the tiny example and one step at several ranks (site_scripts/pages/_lora_example.py), the
adapters at the real configuration, the checks (site_scripts/pages/_lora_checks.py), the command line run for
real (site_scripts/pages/_lora_cli.py), the symbol table and the gradient checks."""

import numpy as np

from transformer.config import PRESETS
from transformer.finetune import adapter_loss_and_grads
from transformer.lora import TARGETS, Frozen, LoRAConfig, adapter_shapes, frozen_linear_backward, \
    frozen_linear_forward, init_adapters
from transformer.model import param_count, param_shapes
from transformer.optim import AdamWConfig, adamw_init, adamw_update

from .. import sections
from ..common import md_table
from ..examples import H_STEP, SEED, TINY_IDS, TINY_TARGETS, default_note, default_run, tiny, weighted_sum
from ..figures import new_figure, png
from . import _lora_checks, _lora_cli, _lora_example
from ._lora_example import EXAMPLE_LORA

ALL_TARGETS = LoRAConfig(rank=2, alpha=4.0, targets=tuple(TARGETS))
LEARN_FROM = 1  # the tiny model's gradient check counts positions 1 and 2 of its three
FIGURE_LORA = LoRAConfig(rank=4, alpha=8.0, targets=("q", "v"))  # a rank small beside d = 32, to see
FIGURE_STEPS = 10
FIGURE_LR = 1e-2
MOVE = 0.3  # trained(): how far W_B moves off zero, in standard normal units


def trained(adapters, seed=SEED + 1, size=MOVE):
    """Adapters as training leaves them (W_B no longer zero), so that every gradient term counts."""
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(v.shape) * size for k, v in adapters.items()}


# ---------------------------------------------------------------- the picture: one adapter pair after training

def figure_adapters():
    """b0.wq's W, W_A and W_B after FIGURE_STEPS AdamW steps on the default run (targets drawn with seed
    SEED + 1), and the update s W_A W_B."""
    ex, lora = default_run(), FIGURE_LORA
    targets = np.random.default_rng(SEED + 1).integers(0, ex.cfg.vocab_size, ex.ids.shape)
    adapters = init_adapters(param_shapes(ex.cfg), lora, seed=SEED)
    state, losses = adamw_init(adapters), []
    for _ in range(FIGURE_STEPS + 1):  # the last loss is the trained adapters'
        loss, grads = adapter_loss_and_grads(ex.params, adapters, ex.ids, targets, ex.cfg, lora)
        losses.append(loss)
        if len(losses) <= FIGURE_STEPS:
            adamw_update(adapters, grads, state, FIGURE_LR, AdamWConfig())
    a, bm = adapters["b0.wq.lora_a"], adapters["b0.wq.lora_b"]
    return ex, ex.params["b0.wq"], a, bm, lora.scale * a @ bm, losses


def heatmap(ax, m, title, xlabel, ylabel):
    from matplotlib.ticker import MaxNLocator

    lim = np.abs(m).max()
    ax.imshow(m, cmap="RdBu_r", vmin=-lim, vmax=lim, interpolation="nearest")
    ax.set_title(f"{title}\n|entries| ≤ {lim:.2f}" if title else "", fontsize=9)
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.tick_params(labelsize=7)
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(MaxNLocator(integer=True))


def update_png(W, a, bm, update):
    """W, W_A, W_B above the update (drawn where a product's factors stand), each on its own colour scale, and
    the singular values of the update beside W's: n_r of them above rounding."""
    r, (n_in, n_out) = a.shape[1], W.shape
    fig, axes = new_figure(2, 4, figsize=(13, 5), gridspec_kw={"width_ratios": [n_out, r, n_out, 34],
                                                               "height_ratios": [r, n_in], "hspace": 0.3,
                                                               "wspace": 0.3})
    for ax in (axes[0, 0], axes[0, 1], axes[0, 3]):
        ax.remove()
    heatmap(axes[1, 0], W, "$W$ (frozen)", "output unit i'", "input unit i")
    heatmap(axes[1, 1], a, "$W_A$", "rank unit", "input unit i")
    heatmap(axes[0, 2], bm, "", "", "rank unit")
    axes[0, 2].set_title(f"$W_B$, |entries| ≤ {np.abs(bm).max():.2f}", fontsize=9)
    heatmap(axes[1, 2], update, r"update $s_{\mathrm{LoRA}} W_A W_B$", "output unit i'", "")
    ax, k = axes[1, 3], np.arange(1, min(W.shape) + 1)
    ax.semilogy(k, np.linalg.svd(W, compute_uv=False), "s", ms=3, color="tab:gray", label="$W$")
    ax.semilogy(k, np.linalg.svd(update, compute_uv=False), "o", ms=4, color="tab:red",
                label=r"update $s_{\mathrm{LoRA}} W_A W_B$")
    ax.set_xlabel("singular values, largest first", fontsize=8)
    ax.set_ylabel("size", fontsize=8)
    ax.yaxis.tick_right()
    ax.yaxis.set_label_position("right")
    ax.tick_params(labelsize=7)
    ax.set_title(f"singular values: rank {r} gives {r} above rounding", fontsize=9)
    ax.legend(fontsize=8, loc="center right")
    return png(fig)


def figure():
    """(the picture, its values)."""
    ex, W, a, bm, update, losses = figure_adapters()
    sv = np.linalg.svd(update, compute_uv=False)
    r = a.shape[1]
    return update_png(W, a, bm, update), {
        "rank": r, "alpha": FIGURE_LORA.alpha, "steps": FIGURE_STEPS, "lr": FIGURE_LR, "seed": SEED + 1,
        "batch": int(ex.ids.shape[0]), "T": int(ex.ids.shape[1]),
        "loss0": losses[0],
        "loss1": losses[-1], "shape": W.shape, "sv_r": float(sv[r - 1]), "sv_next": float(sv[r]),
        "targets": list(FIGURE_LORA.targets)}


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


# ---------------------------------------------------------------- the adapters at the real configuration

def target_rows(cfg, lora):
    shapes, rows = param_shapes(cfg), []
    for target, short in TARGETS.items():
        names = [n for n in shapes if n.rsplit(".", 1)[-1] == short]
        one = adapter_shapes({names[0]: shapes[names[0]]}, LoRAConfig(lora.rank, lora.alpha, (target,)))
        a_shape, b_shape = one.values()
        per = sum(int(np.prod(s)) for s in one.values())
        rows.append([f"`{target}`", f"`{short}`", len(names), sections.shape_text(shapes[names[0]]),
                     sections.shape_text(a_shape), sections.shape_text(b_shape), f"{per:,}",
                     f"{int(np.prod(shapes[names[0]])):,}"])
    return rows


def targets():
    """(the two tables, their values): every target at the default config, and the trainable fraction at the
    model's presets for the default targets and for all of them."""
    lora = LoRAConfig()
    counts = []
    for name in ("default", "A", "B"):
        c = PRESETS[name]
        for chosen in (lora.targets, tuple(TARGETS)):
            n_a = sum(int(np.prod(s)) for s in adapter_shapes(param_shapes(c), LoRAConfig(lora.rank, lora.alpha,
                                                                                          chosen)).values())
            counts.append([f"`{name}`", f"\\(d\\) = {c.emb_dim}, \\(L\\) = {c.num_layers}, \\(F\\) = {c.ff_dim}",
                           ", ".join(chosen), f"{n_a:,}", f"{param_count(c):,}", f"{n_a / param_count(c):.2%}"])
    tables = {"targets": md_table(["target", "weight", "weights adapted", "\\(W\\)", "\\(W_A\\)", "\\(W_B\\)",
                                   "adapter scalars per weight", "scalars of \\(W\\)"],
                                  target_rows(PRESETS["default"], lora)),
              "fraction": md_table(["preset", "sizes", "targets", "\\(N_A\\)", "\\(N_\\theta\\)", "trainable"],
                                   counts)}
    return tables, {"rank": lora.rank, "targets": list(lora.targets)}


# ---------------------------------------------------------------- gradient checks

def layer_gradcheck():
    """(table, values): one adapted layer against central differences of the fake loss."""
    ex, rng = tiny(), np.random.default_rng(SEED)
    x = rng.standard_normal((2, 3, ex.cfg.emb_dim))
    adapters = trained(init_adapters(param_shapes(ex.cfg), EXAMPLE_LORA, seed=SEED))
    w = Frozen(ex.params["b0.wq"].copy(), adapters["b0.wq.lora_a"], adapters["b0.wq.lora_b"], EXAMPLE_LORA.scale)
    b = ex.params["b0.bq"] + 0.1 * rng.standard_normal(ex.params["b0.bq"].shape)
    dy = rng.standard_normal((2, 3, w.shape[1]))
    dx, (da, dbm) = frozen_linear_backward(dy, frozen_linear_forward(x, w, b)[1])
    checks = [("dx", dx, x), ("da", da, w.a), ("dbm", dbm, w.bm)]
    rows = sections.gradcheck_rows(weighted_sum(dy, frozen_linear_forward, x, w, b), checks, H_STEP)
    return sections.gradcheck_table(rows), {"rank": EXAMPLE_LORA.rank, "shape": x.shape, "seed": SEED,
                                            "move": MOVE, "move_seed": SEED + 1}


def model_gradcheck():
    """(table, values): every adapter entry of the tiny model against central differences of the loss."""
    ex = tiny()
    cfg, params, lora = ex.cfg, ex.params, ALL_TARGETS
    ids, targets = np.array([TINY_IDS, TINY_IDS[::-1]]), np.array([TINY_TARGETS, TINY_TARGETS[::-1]])
    adapters = trained(init_adapters(param_shapes(cfg), lora, seed=SEED))
    _, grads = adapter_loss_and_grads(params, adapters, ids, targets, cfg, lora, LEARN_FROM)

    def loss():
        return adapter_loss_and_grads(params, adapters, ids, targets, cfg, lora, LEARN_FROM)[0]

    rows = sections.gradcheck_rows(loss, [(k, grads[k], adapters[k]) for k in adapters], H_STEP)
    table = sections.gradcheck_table(rows, differentiated="the mean cross-entropy over the counted positions, "
                                                          "[the loss over part of a window](#eq-time-range-loss)")
    return table, {"rank": lora.rank, "targets": list(lora.targets), "windows": len(ids), "learn_from": LEARN_FROM,
                   "entries": sum(a.size for a in adapters.values())}


def generate(context):
    picture, picture_values = figure()
    example_tables, example_values = _lora_example.tiny_example()
    ranks_table, ranks_values = _lora_example.ranks()
    target_tables, target_values = targets()
    checks_tables, checks_values = _lora_checks.checks()
    cli_tables, cli_values = _lora_cli.cli()
    layer_table, layer_values = layer_gradcheck()
    model_table, model_values = model_gradcheck()
    cfg = PRESETS["tiny"]
    sizes = {"n_v": cfg.vocab_size, "t_max": cfg.context_len, "d": cfg.emb_dim, "h": cfg.num_heads,
             "l": cfg.num_layers, "f": cfg.ff_dim}
    values = {"seed": SEED, "ids": TINY_IDS, "targets": TINY_TARGETS, "sizes": sizes, "figure": picture_values,
              "example": example_values, "ranks": ranks_values, "adapters": target_values, "checks": checks_values,
              "cli": cli_values, "gc_layer": layer_values, "gc_model": model_values}
    return {"values": values, "update.png": picture, **example_tables, "ranks": ranks_table, **target_tables,
            **checks_tables, **cli_tables, "symbols": symbols_md(), "gradcheck_layer": layer_table,
            "gradcheck": model_table}
