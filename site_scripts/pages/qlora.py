"""Generator of the QLoRA page (docs/finetuning/qlora.md): its values and tables. The memory section and its
picture (site_scripts/pages/_qlora_memory.py), one NF4 layer of the tiny model, the checks (QLoRA's gradients
against LoRA's on the decoded base, what a few training steps leave of the base, the optimizer state, the
clipped norm, the quantized model's logits against the float one), the symbol table and the gradient check of
the frozen NF4 layer."""

import numpy as np

from transformer.data import make_tokenizer, sample_batch
from transformer.finetune import adapter_loss_and_grads, dense_base, frozen_params, quantize_base, weight_bytes
from transformer.finetune_run import FineTuneRun
from transformer.lora import TARGETS, Frozen, LoRAConfig, frozen_linear_backward, frozen_linear_forward, init_adapters
from transformer.model import forward, init_params, param_shapes
from transformer.nf4 import NF4Weight, dequantize, quantize
from transformer.optim import adamw_init, global_norm
from transformer.quantized_linear import ROWS
from transformer.step import train_step
from transformer.train_config import TrainConfig

from .. import sections
from ..common import md_table
from ..examples import H_STEP, SEED, TINY_IDS, default_note, default_run, tiny, weighted_sum
from . import _qlora_memory

CHECK_LORA = LoRAConfig(rank=4, alpha=8.0, targets=tuple(TARGETS))
TRAIN_STEPS = 5
GRAD_CLIP = 1e-3  # small, so that the clip acts on every step of the check
TRAIN_WIDTH = 8  # the training check's model: the tiny one, widened
NORM_TOL = 1e-5  # float32: the clip's norm against the float32 global norm of the same gradients
MOVE = 0.2  # trained(): how far the adapters move off their start, in standard normal units


def trained(adapters, seed=SEED + 2, size=MOVE):
    rng = np.random.default_rng(seed)
    return {k: size * rng.standard_normal(v.shape) for k, v in adapters.items()}


def symbols_md():
    ex, lora = default_run(), LoRAConfig()
    base = quantize_base(ex.params)
    adapters = init_adapters(param_shapes(ex.cfg), lora, seed=SEED)
    x, q = ex.trace["b0.ln1"], base["b0.wq"]
    w = Frozen(q, adapters["b0.wq.lora_a"], adapters["b0.wq.lora_b"], lora.scale)
    y, cache = frozen_linear_forward(x, w, base["b0.bq"])
    dx, _ = frozen_linear_backward(np.ones_like(y), cache)
    rows = [
        (r"A", "x", x.shape, "block 0's \\(U_1\\)"),
        (r"W", "params['b0.wq']", ex.params["b0.wq"].shape, f"{ex.params['b0.wq'].nbytes:,} bytes in float64"),
        (r"W_{\mathrm{NF4}}", "dequantize(w.base)", dequantize(q).shape,
         f"`b0.wq` as stored: an `NF4Weight` of {q.nbytes:,} bytes"),
        (r"W_A", "w.a", w.a.shape), (r"W_B", "w.bm", w.bm.shape),
        (r"Y", "y", y.shape), (r"\partial\ell/\partial A", "dx", dx.shape),
    ]
    return sections.symbols_md(rows, default_note() + f", adapters of rank {lora.rank} on q and v")


def example():
    """(tables, values): the tiny model's b0.wq stored in NF4 and decoded, and the layer's output against a dense
    layer holding the decoded weight and against the float layer."""
    ex = tiny()
    x, W, b = ex.trace["b0.ln1"][0], ex.params["b0.wq"], ex.params["b0.bq"]
    q = quantize(W)
    decoded = dequantize(q)
    y_nf4, _ = frozen_linear_forward(x, Frozen(q), b)
    y_dec = x @ decoded.astype(x.dtype) + b
    y_float = x @ W + b
    decoded_gap, float_gap = float(np.abs(y_nf4 - y_dec).max()), float(np.abs(y_nf4 - y_float).max())
    gaps = md_table(["", "largest gap"],
                    [["a dense layer holding \\(W_{\\mathrm{NF4}}\\)", sections.gap_text(decoded_gap)],
                     ["the float layer holding \\(W\\)", f"{float_gap:.4f}"]])
    tables = {"w": sections.array_md("W", W), "w_nf4": sections.array_md("W_NF4", decoded), "gaps": gaps}
    c = ex.cfg
    sizes = {"n_v": c.vocab_size, "t_max": c.context_len, "d": c.emb_dim, "h": c.num_heads, "l": c.num_layers,
             "f": c.ff_dim}
    return tables, {"seed": SEED, "ids": TINY_IDS, "sizes": sizes, "size": W.size, "block": q.block_size, "blocks": -(-W.size // q.block_size),
                    "packed": q.packed.nbytes, "codes8": q.absmax_codes.nbytes, "absmax2": q.absmax2.nbytes,
                    "nbytes": q.nbytes, "float32": W.astype(np.float32).nbytes,
                    "error": float(np.abs(decoded - W).max()), "rows": ROWS}


def gradients_row(ex, targets, adapters):
    base = quantize_base(ex.params)
    _, q_grads = adapter_loss_and_grads(base, adapters, ex.ids, targets, ex.cfg, CHECK_LORA)
    _, d_grads = adapter_loss_and_grads(dense_base(base), adapters, ex.ids, targets, ex.cfg, CHECK_LORA)
    found = [sections.agreement(q_grads[k], d_grads[k]) for k in adapters]
    gap = max(g for g, _ in found)
    verdict = "**FAIL**" if any(v == "**FAIL**" for _, v in found) else "pass"
    return ["QLoRA's adapter gradients = LoRA's on the decoded base (`dense_base`), every adapter",
            "largest gap", sections.gap_text(gap), verdict]


def logits_row(ex):
    adapters = init_adapters(param_shapes(ex.cfg), CHECK_LORA, seed=SEED)
    logits, _ = forward(frozen_params(quantize_base(ex.params), adapters, CHECK_LORA), ex.ids, ex.cfg)
    gap = float(np.abs(logits - ex.trace["logits"]).max())
    return ["QLoRA's logits at step 0 against the float64 model's", "largest gap, and the largest logit",
            f"{gap:.4f} of {float(np.abs(ex.trace['logits']).max()):.4f}", "measured (quantization error)"]


def stored_bytes(base):
    """Every array of the base as bytes: an NF4 weight's codes, scales and offset, or the array itself."""
    return {n: (p.packed.tobytes() + p.absmax_codes.tobytes() + p.absmax2.tobytes() + np.float32(p.offset).tobytes())
            if isinstance(p, NF4Weight) else p.tobytes() for n, p in base.items()}


def training_rows():
    """A few clipped AdamW steps of a FineTuneRun on an NF4 base: its bytes, its optimizer state, its norm."""
    ex = tiny()
    text = "to be or not to be, that is the question\n" * 40
    tokenizer = make_tokenizer("char", text)
    cfg = ex.cfg.with_(vocab_size=tokenizer.vocab_size, context_len=8, emb_dim=TRAIN_WIDTH, ff_dim=2 * TRAIN_WIDTH)
    base = quantize_base(init_params(cfg, seed=SEED, dtype=np.float32))
    before = stored_bytes(base)
    bytes_before = weight_bytes(base)
    lora = LoRAConfig(2, 4.0, ("q", "v", "ff2"))
    adapters = init_adapters(param_shapes(cfg), lora, seed=SEED, dtype=np.float32)
    tc = TrainConfig(steps=TRAIN_STEPS, batch_size=3, seq_len=8, warmup=1, grad_clip=GRAD_CLIP, dtype="float32")
    run = FineTuneRun(cfg, tc, tokenizer, adapters, adamw_init(adapters), np.random.default_rng(SEED), base=base,
                      lora=lora, quantize="nf4")
    ids, norm_gaps, clipped = tokenizer.encode(text), [], 0
    for _ in range(TRAIN_STEPS):
        replay = np.random.default_rng()
        replay.bit_generator.state = run.rng.bit_generator.state
        x, y = sample_batch(ids, tc.batch_size, tc.seq_len, replay)  # the batch this step will draw
        _, expected = adapter_loss_and_grads(base, run.params, x, y, cfg, lora)
        record = train_step(run, ids, tc.seq_len)
        norm_gaps.append(abs(record["grad_norm"] - global_norm(expected)) / global_norm(expected))
        clipped += record["grad_norm"] > GRAD_CLIP
    after = stored_bytes(base)
    changed = [n for n in before if before[n] != after[n]]
    state_keys = set(run.opt_state["m"]) | set(run.opt_state["v"])
    only = state_keys == set(adapters) and not state_keys & set(base)
    worst = max(norm_gaps)
    return [
        [f"the base's bytes after {TRAIN_STEPS} AdamW steps (every array, NF4 codes and scales included)",
         "arrays changed, of " + str(len(before)), str(len(changed)), "pass" if not changed else "**FAIL**"],
        ["the base's size after the steps (`weight_bytes`)", "bytes before → after", f"{bytes_before:,} → "
         f"{weight_bytes(base):,}", "pass" if bytes_before == weight_bytes(base) else "**FAIL**"],
        ["arrays with AdamW moments", "the adapters' names, and no base name", f"{len(state_keys)} of "
         f"{len(adapters)} adapters", "pass" if only else "**FAIL**"],
        ["the norm the clip measured = the adapters' global norm of the same batch", "largest relative gap, "
         "steps where it clipped", f"{worst:.1e}, {clipped} of {TRAIN_STEPS}",
         "pass" if worst < NORM_TOL and clipped == TRAIN_STEPS else "**FAIL**"],
    ]


def checks():
    """(table, values) of the checks."""
    ex = default_run()
    targets = np.random.default_rng(SEED + 1).integers(0, ex.cfg.vocab_size, ex.ids.shape)
    adapters = trained(init_adapters(param_shapes(ex.cfg), CHECK_LORA, seed=SEED))
    rows = [gradients_row(ex, targets, adapters), logits_row(ex)] + training_rows()
    return md_table(["Check", "Measured", "Value", "Result"], rows), {
        "rank": CHECK_LORA.rank, "seed": SEED + 2, "move": MOVE, "batch": int(ex.ids.shape[0]),
        "T": int(ex.ids.shape[1]), "width": TRAIN_WIDTH, "clip": GRAD_CLIP, "norm_tol": NORM_TOL}


def gradcheck():
    """(table, values): the frozen NF4 layer with adapters against central differences of the fake loss."""
    ex, rng = tiny(), np.random.default_rng(SEED)
    lora = LoRAConfig(rank=2, alpha=4.0, targets=("q",))
    adapters = trained(init_adapters(param_shapes(ex.cfg), lora, seed=SEED))
    w = Frozen(quantize(ex.params["b0.wq"]), adapters["b0.wq.lora_a"], adapters["b0.wq.lora_b"], lora.scale)
    b = ex.params["b0.bq"] + 0.1 * rng.standard_normal(ex.params["b0.bq"].shape)
    x = rng.standard_normal((2, 3, ex.cfg.emb_dim))
    dy = rng.standard_normal((2, 3, w.shape[1]))
    dx, (da, dbm) = frozen_linear_backward(dy, frozen_linear_forward(x, w, b)[1])
    rows = sections.gradcheck_rows(weighted_sum(dy, frozen_linear_forward, x, w, b),
                                   [("dx", dx, x), ("da", da, w.a), ("dbm", dbm, w.bm)], H_STEP)
    return sections.gradcheck_table(rows), {"rank": lora.rank, "shape": x.shape, "seed": SEED}


def generate(context):
    example_tables, example_values = example()
    checks_table, checks_values = checks()
    gradcheck_table, gradcheck_values = gradcheck()
    bytes_tables, bytes_values, found = _qlora_memory.bytes_held()
    steps_table, steps_values = _qlora_memory.steps()
    values = {"example": example_values, "checks": checks_values, "gc": gradcheck_values, "bytes": bytes_values,
              "steps": steps_values}
    return {"values": values, "memory.png": _qlora_memory.bytes_png(found), **example_tables,
            "checks": checks_table, **bytes_tables, "steps": steps_table, "symbols": symbols_md(),
            "gradcheck": gradcheck_table}
