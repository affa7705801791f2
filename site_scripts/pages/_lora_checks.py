"""The LoRA page's checks, on the default config in float64: the adapted model at step 0 against the base, the
merged model against the adapted one, the adapters' gradients against the dense model's by the chain rule, and
the loss over part of a window (its logit gradient zero outside the range, the context's targets ignored).

Each check prints its verdict from the numbers it computed; a failed one prints **FAIL**."""

import numpy as np

from transformer.finetune import adapter_loss_and_grads, frozen_params
from transformer.lora import TARGETS, LoRAConfig, init_adapters, merge
from transformer.model import forward, loss_and_grads, param_shapes
from transformer.softmax import cross_entropy_time_range_backward, cross_entropy_time_range_forward

from .. import sections
from ..common import md_table
from ..examples import SEED, default_note, default_run

CHECK_LORA = LoRAConfig(rank=4, alpha=8.0, targets=tuple(TARGETS))  # every target, so every path is checked


def setting():
    """The default run's parameters and ids, next-token targets, and adapters as training leaves them."""
    ex = default_run()
    targets = np.random.default_rng(SEED + 1).integers(0, ex.cfg.vocab_size, ex.ids.shape)
    rng = np.random.default_rng(SEED + 2)
    adapters = {k: 0.2 * rng.standard_normal(v.shape)
                for k, v in init_adapters(param_shapes(ex.cfg), CHECK_LORA, seed=SEED).items()}
    return ex, targets, adapters


def step0_row(ex):
    """At step 0 (W_B = 0): the adapted logits against the frozen model without adapters (must be equal) and
    against the base model (q, k, v fused there, so equal to rounding)."""
    adapters = init_adapters(param_shapes(ex.cfg), CHECK_LORA, seed=SEED)
    adapted, _ = forward(frozen_params(ex.params, adapters, CHECK_LORA), ex.ids, ex.cfg)
    frozen, _ = forward(frozen_params(ex.params, {}, CHECK_LORA), ex.ids, ex.cfg)
    equal = bool(np.array_equal(adapted, frozen))
    gap, verdict = sections.agreement(adapted, ex.trace["logits"])
    return [["step-0 logits = the frozen base's, no adapters", "`np.array_equal`", str(equal),
             "pass" if equal else "**FAIL**"],
            ["step-0 logits = the base model's `forward`", "largest gap", sections.gap_text(gap), verdict]]


def merge_row(ex, adapters):
    adapted, _ = forward(frozen_params(ex.params, adapters, CHECK_LORA), ex.ids, ex.cfg)
    merged, _ = forward(merge(ex.params, adapters, CHECK_LORA), ex.ids, ex.cfg)
    moved = float(np.abs(adapted - ex.trace["logits"]).max())
    gap, verdict = sections.agreement(merged, adapted)
    return [["merged model's logits = the adapted model's", "largest gap", sections.gap_text(gap),
             verdict if moved > 1e-3 else "**FAIL** (the adapters changed nothing)"]], moved


def chain_rows(ex, targets, adapters):
    """Per adapted weight: the gaps of dA against s G B^T and of dB against s A^T G, G the merged model's
    gradient of that weight."""
    loss, grads = adapter_loss_and_grads(ex.params, adapters, ex.ids, targets, ex.cfg, CHECK_LORA)
    merged_loss, dense = loss_and_grads(merge(ex.params, adapters, CHECK_LORA), ex.ids, targets, ex.cfg)
    s, rows = CHECK_LORA.scale, []
    for weight in (k[: -len(".lora_a")] for k in adapters if k.endswith(".lora_a")):
        a, bm, G = adapters[f"{weight}.lora_a"], adapters[f"{weight}.lora_b"], dense[weight]
        gap_a, ok_a = sections.agreement(grads[f"{weight}.lora_a"], s * G @ bm.T)
        gap_b, ok_b = sections.agreement(grads[f"{weight}.lora_b"], s * a.T @ G)
        rows.append([f"`{weight}`", sections.gap_text(gap_a), ok_a, sections.gap_text(gap_b), ok_b])
    return rows, abs(loss - merged_loss)


def time_range_rows(ex, targets, adapters):
    """The loss from t_from on: its logit gradient outside the range, and the adapters' gradients when the
    context positions' targets change."""
    T = ex.ids.shape[1]
    learn_from = T // 2
    logits = ex.trace["logits"]
    _, cache = cross_entropy_time_range_forward(logits, targets, learn_from, T - learn_from)
    dlogits = cross_entropy_time_range_backward(1.0, cache)
    outside, inside = dlogits[:, :learn_from], dlogits[:, learn_from:]
    nonzero_out = int(np.count_nonzero(outside))
    _, grads = adapter_loss_and_grads(ex.params, adapters, ex.ids, targets, ex.cfg, CHECK_LORA, learn_from)
    other = targets.copy()
    other[:, :learn_from] = (other[:, :learn_from] + 1) % ex.cfg.vocab_size
    _, grads2 = adapter_loss_and_grads(ex.params, adapters, ex.ids, other, ex.cfg, CHECK_LORA, learn_from)
    same = all(np.array_equal(grads[k], grads2[k]) for k in grads)
    return learn_from, [
        [f"logit gradient at positions 0 to {learn_from - 1} (outside)", "nonzero entries, of "
         f"{outside.size:,}", str(nonzero_out), "pass" if nonzero_out == 0 else "**FAIL**"],
        [f"logit gradient at positions {learn_from} to {T - 1} (inside)", "nonzero entries, of "
         f"{inside.size:,}", f"{np.count_nonzero(inside):,}",
         "pass" if np.count_nonzero(inside) == inside.size else "**FAIL**"],
        ["adapter gradients with the context's targets changed", "`np.array_equal` to the unchanged ones",
         str(same), "pass" if same else "**FAIL**"],
    ]


def checks_md():
    ex, targets, adapters = setting()
    rows = step0_row(ex)
    merged, moved = merge_row(ex, adapters)
    rows += merged
    learn_from, time_rows = time_range_rows(ex, targets, adapters)
    rows += time_rows
    chain, loss_gap = chain_rows(ex, targets, adapters)
    return (f"On {default_note()}, float64, adapters of rank {CHECK_LORA.rank} on every target "
            f"(\\(\\alpha_{{\\mathrm{{LoRA}}}}\\) = {CHECK_LORA.alpha:g}); where the adapters must have moved, "
            f"\\(W_B\\) is drawn off zero (seed {SEED + 2}), as training leaves it (the largest logit it moves is "
            f"{moved:.3f}). A *largest gap* passes by the gradient checks' rule (relative gap below their "
            "tolerance, or the gap below their absolute floor).\n\n"
            + md_table(["Check", "Measured", "Value", "Result"], rows)
            + "\nAt step 0 the frozen layers compute \\(q\\), \\(k\\) and \\(v\\) one by one, the base model in one "
              "fused matrix: the same sums, which may round apart, so the second row allows rounding. The loss over "
              f"part of a window counts positions {learn_from} to {ex.ids.shape[1] - 1}: "
              "[its gradient](#eq-time-range-grad) outside them is exactly zero.\n\n"
              "**The chain rule, weight by weight.** The adapters' gradients from the frozen layers "
              "(`adapter_loss_and_grads`) against \\(s_{\\mathrm{LoRA}}\\, G\\, W_B^\\top\\) and "
              "\\(s_{\\mathrm{LoRA}}\\, W_A^\\top G\\), where \\(G = \\partial\\ell/\\partial W_{\\mathrm{merged}}\\) "
              "comes from the dense model's `loss_and_grads` on the merged parameters (which never sees an adapter). "
              f"The two losses differ by {sections.gap_text(loss_gap)}.\n\n"
              + md_table(["weight", "\\(\\partial\\ell/\\partial W_A\\): largest gap", "result",
                          "\\(\\partial\\ell/\\partial W_B\\): largest gap", "result"], chain)
            + "\n" + verdict_note(rows, chain))


def verdict_note(rows, chain):
    failed = sum("**FAIL**" in " ".join(r) for r in rows + chain)
    return ("Every check above passed.\n" if failed == 0 else
            f"**{failed} of the {len(rows) + len(chain)} checks above failed.**\n")
