"""Generator of the Training loop & data page's fragments."""

import contextlib
import io
import json
import tempfile
from pathlib import Path

import numpy as np

from transformer.config import PRESETS
from transformer.data import TRAIN_FRACTION, CharTokenizer, sample_batch, train_val_split
from transformer.model import forward, init_params, loss_and_grads
from transformer.parallel import Sharded, shard_rows
from transformer.run_state import new_run
from transformer.train import train
from transformer.train_config import TrainConfig

from .. import memory, sections
from ..examples import SEED

TEXT = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"
        "First Citizen:\nYou are all resolved rather to die than to famish?\n\nAll:\nResolved. resolved.\n") * 8
STEPS = 60
WINDOW = 16


def example_md():
    tok = CharTokenizer.from_text(TEXT)
    ids = tok.encode(TEXT)
    train_ids, val_ids = train_val_split(ids, WINDOW)
    x, y = sample_batch(train_ids, 2, WINDOW, np.random.default_rng(SEED))
    starts = np.random.default_rng(SEED).integers(0, len(train_ids) - WINDOW, size=2)  # sample_batch's own draw
    if not np.array_equal(x, train_ids[starts[:, None] + np.arange(WINDOW)]):
        raise RuntimeError("the starts shown are not those sample_batch drew")
    rows = [[w, starts[w], f"`{tok.decode(x[w])!r}`", f"`{tok.decode(y[w])!r}`"] for w in range(2)]
    return (f"A corpus of \\(N_c\\) = {len(ids)} characters (the opening of Tiny Shakespeare's first speech, "
            f"repeated; \\(n_V\\) = {tok.vocab_size}) splits at \\(\\lfloor {TRAIN_FRACTION} N_c \\rfloor\\) = "
            f"{len(train_ids)} (`TRAIN_FRACTION` = {TRAIN_FRACTION} in `transformer/data.py`) into {len(train_ids)} "
            f"training and {len(val_ids)} validation tokens. `sample_batch(train, 2, {WINDOW}, rng)` with seed "
            f"{SEED} draws starts \\(s_w\\) from 0 to {len(train_ids) - WINDOW - 1}:\n\n"
            + sections.md_table(["window \\(w\\)", "start \\(s_w\\)", "inputs \\(\\mathrm{id}_w\\)",
                                 "targets \\(y_w\\)"], rows)
            + "\nEach target is the input shifted left by one character: at every position the model is asked "
              "for the next character.\n")


def run_config():
    cfg = PRESETS["tiny"].with_(vocab_size=len(set(TEXT)), context_len=WINDOW, emb_dim=16, ff_dim=64)
    tc = TrainConfig(steps=STEPS, batch_size=8, lr=1e-2, warmup=5, eval_every=20, ckpt_every=STEPS, seed=SEED,
                     dtype="float64")
    return cfg, tc


def first_batch_loss_parts(cfg, tc):
    """The first step's loss recomputed from what `train` starts with (the same parameters, the same sampler),
    split as log n_V + spread − lead: spread = mean over positions of log((1/n_V) Σ_j exp(z_j − z̄)) ≥ 0, and
    lead = mean of z_y − z̄, the target's logit above its row's mean. Also the logits' spread σ within a row."""
    run = new_run(TEXT, cfg, tc)
    train_ids, _ = train_val_split(run.tokenizer.encode(TEXT), cfg.context_len)
    x, y = sample_batch(train_ids, tc.batch_size, cfg.context_len, run.rng)
    z = forward(run.params, x, run.model_cfg)[0].reshape(-1, run.model_cfg.vocab_size)
    centred = z - z.mean(axis=-1, keepdims=True)
    spread = float(np.log(np.exp(centred).mean(axis=-1)).mean())
    lead = float(centred[np.arange(len(z)), y.reshape(-1)].mean())
    sigma = float(np.sqrt(centred.var(axis=-1).mean()))
    return np.log(run.model_cfg.vocab_size) + spread - lead, spread, lead, sigma


def initial_loss_md(cfg, tc, first_loss):
    loss, spread, lead, sigma = first_batch_loss_parts(cfg, tc)
    log_v = np.log(cfg.vocab_size)
    above = first_loss > log_v
    balance = (f"that spread costs more than the targets' logits gain by standing {abs(lead):.4f} "
               f"{'above' if lead > 0 else 'below'} their rows' means" if above else
               f"the targets' logits, {lead:.4f} above their rows' means, gain more than the spread costs")
    return (f"The first step's loss, {first_loss:.4f}, is {'above' if above else 'below'} \\(\\log n_V\\) = "
            f"{log_v:.4f}, the loss of a uniform guess. The same loss, recomputed from the parameters and the first "
            f"batch `train` starts with (difference to `metrics.jsonl`: {abs(loss - first_loss):.1e}), splits exactly "
            "into \\(\\log n_V + \\text{spread} - \\text{lead}\\). The spread, the mean over positions of "
            "\\(\\log \\frac{1}{n_V}\\sum_j e^{z_j - \\bar z}\\) (\\(\\bar z\\) the mean of the row \\(z\\)), is never "
            "negative (Jensen's inequality) and is zero only when all the logits of a row are equal; the lead, the "
            "mean of \\(z_y - \\bar z\\), is how far the target's logit stands above its row's mean. Here the spread "
            f"is {spread:.4f} and the lead {lead:.4f}, so the loss is {spread - lead:+.4f} from \\(\\log n_V\\). The "
            f"untrained model's logits are not equal: they vary with a standard deviation of {sigma:.3f} within a row "
            f"(the spread is close to half their variance, {sigma ** 2 / 2:.4f}), and {balance}; nothing has yet "
            "trained them to favour the target.\n")


def run_md():
    cfg, tc = run_config()
    with tempfile.TemporaryDirectory() as folder:
        corpus = Path(folder) / "corpus.txt"
        corpus.write_text(TEXT)
        with contextlib.redirect_stdout(io.StringIO()):  # its progress lines belong to a terminal, not the build
            train(corpus, Path(folder) / "run", cfg, tc, progress=False)
        records = [json.loads(line) for line in (Path(folder) / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    evals = [r for r in records if "val_loss" in r]
    shown = [steps[0], *steps[9::10]]
    rows = [[r["step"], r["step"] - 1, f"{r['loss']:.4f}", f"{r['lr']:.5f}", f"{r['grad_norm']:.3f}",
             "yes" if r["grad_norm"] > tc.grad_clip else "no"] for r in shown]
    val_rows = [[r["step"], f"{r['val_loss']:.4f}"] for r in evals]
    clipped = sum(r["grad_norm"] > tc.grad_clip for r in steps)
    return (f"A real call of `train` at build time: {STEPS} steps of a small model (\\(d\\) = {cfg.emb_dim}, "
            f"\\(L\\) = {cfg.num_layers}, \\(T\\) = {cfg.context_len}, \\(n_V\\) = {cfg.vocab_size}) on the corpus "
            f"above, \\(B\\) = {tc.batch_size}, learning rate rising linearly over \\(N_w\\) = {tc.warmup} warm-up "
            f"steps to \\(\\eta_{{\\max}}\\) = {tc.lr:g} and then decaying to \\(\\eta_{{\\min}}\\) = "
            f"{tc.min_lr:g} along a cosine, clipping at \\(\\rho\\) = {tc.grad_clip:g}, float64, seed {SEED}. "
            "Rows from its `metrics.jsonl` (times are left out so the page is the same on every machine). Its "
            "`step` counts the updates made, so the row of `step` k used the learning rate \\(\\eta_s\\) of "
            "\\(s = k - 1\\); `grad_norm` is \\(\\lVert g \\rVert\\) before clipping:\n\n"
            + sections.md_table(["`step`", "\\(s\\)", "training loss", "\\(\\eta_s\\)", "\\(\\lVert g \\rVert\\)",
                                 "clipped?"], rows)
            + f"\nOf all {len(steps)} steps, {clipped} had \\(\\lVert g \\rVert > \\rho\\) and were clipped. "
              "Validation loss over the whole validation split:\n\n"
            + sections.md_table(["`step`", "validation loss"], val_rows)
            + "\n" + initial_loss_md(cfg, tc, steps[0]["loss"])
            + "\nA corpus this small and repetitive is learned quickly; the real Tiny Shakespeare run is the README's "
              "`scripts/demo`.\n")


def symbols_md():
    cfg = PRESETS["default"]
    tc = TrainConfig()
    data = np.arange(10_000)
    x, y = sample_batch(data, tc.batch_size, cfg.context_len, np.random.default_rng(SEED))
    rows = [
        (r"c", "data, train_ids", data.shape, "the training split `sample_batch` draws from"),
        (r"N_c", "len(ids)", f"{len(data)}"),
        (r"B", "batch_size", f"{tc.batch_size}"),
        (r"T", "seq_len", f"{cfg.context_len}"),
        (r"w", "x[w]", "index"),
        (r"s_w", "starts", (tc.batch_size,)),
        (r"\mathrm{id}", "x", x.shape, "a batch of input windows"),
        (r"y", "y", y.shape, "their targets, each window shifted by one"),
    ]
    return sections.symbols_md(rows, f"`sample_batch` on 10000 ids with B = {tc.batch_size}, T = {cfg.context_len}")


POLICY_LENGTHS = (64, 256)  # measured by the quick and the full build alike, so this page is the same in both


def policies_md():
    """The step peaks of the four memory policies at two lengths (bytes: the same on every run)."""
    if not set(POLICY_LENGTHS) <= set(memory.QUICK_LENGTHS) & set(memory.tool.LENGTHS):
        raise RuntimeError(f"{POLICY_LENGTHS} must be measured in both builds")
    found, cfg = memory.measurements(), memory.tool.CONFIG
    rows = [[T] + [memory.mib(found[policy, T].step_peak) for policy in memory.tool.POLICIES] for T in POLICY_LENGTHS]
    lo, hi = POLICY_LENGTHS
    gain = lambda policy, T: found["materialized", T].step_peak / found[policy, T].step_peak  # noqa: E731
    return ("Peak memory of one training step (MiB above the parameters and AdamW's moments), measured with "
            f"tracemalloc by `tools/memory_policies.py` on \\(B\\) = {memory.tool.BATCH} windows of a model with "
            f"\\(d\\) = {cfg.emb_dim}, \\(L\\) = {cfg.num_layers}, float32:\n\n"
            + sections.md_table(["\\(T\\)", *(f"`{p}`" for p in memory.tool.POLICIES)], rows)
            + "\nThe materialized step's peak divided by each policy's, at " + f"\\(T\\) = {lo} and {hi}: "
            + "; ".join(f"`{p}` {gain(p, lo):.1f} and {gain(p, hi):.1f}" for p in list(memory.tool.POLICIES)[1:])
            + ".\n")


SHARD_BATCH = 7  # windows of the shards example: 7 does not split evenly, so the weights differ


def shards_md():
    """One pass over a batch against the same batch in 2 and 3 shards, float64: the weights and the gaps, and
    what equal weights would get wrong."""
    cfg = PRESETS["tiny"]
    params = init_params(cfg, seed=SEED)
    x, y = np.random.default_rng(SEED).integers(0, cfg.vocab_size, (2, SHARD_BATCH, cfg.context_len))
    loss, grads = loss_and_grads(params, x, y, cfg)
    rows, same_bits = [], []
    for n in (2, 3):
        shard_loss, shard_grads = Sharded(n, processes=False)(loss_and_grads, params, x, y, cfg)
        in_processes = Sharded(n, processes=True)  # the same shards in worker processes: the very same bits?
        if in_processes.processes:  # where workers can run (Linux, threadpoolctl)
            process_loss, process_grads = in_processes(loss_and_grads, params, x, y, cfg)
            if in_processes.workers is None:
                raise RuntimeError("the shards meant for worker processes ran in threads")
            same_bits.append(process_loss == shard_loss
                             and all(np.array_equal(process_grads[k], g) for k, g in shard_grads.items()))
            in_processes.close()
        # b_k's gradient is zero in exact arithmetic (its entries are rounding noise), so it is left out
        gap = max(np.abs(shard_grads[k] - g).max() / np.abs(g).max() for k, g in grads.items() if not k.endswith(".bk"))
        parts = shard_rows(SHARD_BATCH, n)
        plain = np.mean([loss_and_grads(params, x[a:b], y[a:b], cfg)[0] for a, b in parts])  # equal weights
        rel, plain_rel = abs(shard_loss - loss) / loss, abs(plain - loss) / loss
        if gap > 1e-12 or rel > 1e-12 or plain_rel < 1e-6:
            raise RuntimeError(f"{n} shards differ from one pass by more than rounding, or equal weights do not")
        rows.append([n, " + ".join(f"{b - a}/{SHARD_BATCH}" for a, b in parts), f"{rel:.1e}", f"{gap:.1e}",
                     f"{plain_rel:.1e}"])
    return (f"A batch of \\(B\\) = {SHARD_BATCH} windows of the tiny model, its loss {loss:.6f} in one pass:\n\n"
            + sections.md_table(["\\(n_{\\mathrm{sh}}\\)", "weights \\(N^{(\\xi)}/N\\)",
                                 "relative gap of \\(\\mathcal{L}\\)", "largest relative gap of a gradient",
                                 "relative gap with equal weights"], rows)
            + "\nThe gaps of the weighted sums are rounding (the gradient of \\(b_k\\), zero in exact arithmetic, is "
              "left out); the last column is what a plain mean of the shards' losses would get wrong.\n"
            + processes_md(same_bits))


def processes_md(same_bits):
    """What worker processes gave, against threads, for the shards above."""
    if not same_bits:
        return ("\nWorker processes are not available where this page was built, so the shards above ran as threads "
                "only.\n")
    if not all(same_bits):
        raise RuntimeError("shards computed by worker processes differ from the same shards computed by threads")
    return ("\nComputed by worker processes instead of threads, the same shards gave the same loss and the same "
            "gradients, bit for bit, for both \\(n_{\\mathrm{sh}}\\).\n")


def generate(context):
    from transformer.data import TRAIN_FRACTION

    return {"values": {"train_share": TRAIN_FRACTION, "val_share": 1 - TRAIN_FRACTION}, "symbols": symbols_md(), "example": example_md(), "run": run_md(), "policies": policies_md(),
            "shards": shards_md()}
