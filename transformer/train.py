"""The training loop: batches, AdamW, evaluation, metrics, checkpoints, resume.

A run writes into its output folder:
    checkpoint.npz   the latest checkpoint (every --ckpt-every steps, at the end,
                     and when stopped by Ctrl-C or --max-minutes)
    metrics.jsonl    one JSON object a line: training steps, validation losses
Resuming restores the parameters, the AdamW moments, the step and the batch
sampler's random state, so a resumed run computes the same losses as one that
never stopped.
"""

import json
import math
import signal
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

from .checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from .config import ModelConfig
from .data import eval_windows, load_corpus, make_tokenizer, sample_batch, train_val_split
from .errors import ConfigError
from .model import forward, init_params, loss_and_grads
from .optim import AdamWConfig, adamw_init, adamw_update, clip_grads, lr_at
from .softmax import cross_entropy_forward

CHECKPOINT_NAME = "checkpoint.npz"
METRICS_NAME = "metrics.jsonl"
DTYPES = {"float32": np.float32, "float64": np.float64}


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 2000  # optimizer steps in the whole run
    batch_size: int = 32  # windows per step
    seq_len: int = 0  # tokens per window; 0 means the model's context_len
    lr: float = 3e-3  # peak learning rate
    min_lr: float = 3e-4  # learning rate at the end of the cosine decay
    warmup: int = 100  # steps of linear warm-up
    weight_decay: float = 0.1  # AdamW decoupled decay (matrices only)
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0  # max global gradient norm; 0 disables clipping
    eval_every: int = 500  # steps between validation losses (whole split)
    ckpt_every: int = 1000  # steps between checkpoints
    seed: int = 0  # parameter initialisation and batch sampling
    dtype: str = "float32"  # arithmetic of training; float64 for exactness
    tokenizer: str = "char"  # "char" (vocabulary from the corpus) or "byte"

    def __post_init__(self):
        for name in ("steps", "batch_size", "eval_every", "ckpt_every"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ConfigError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        for name in ("seq_len", "warmup", "seed"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise ConfigError(f"{name} must be a non-negative integer, got {getattr(self, name)!r}")
        for name in ("lr", "min_lr", "weight_decay", "grad_clip"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ConfigError(f"{name} must be a finite number >= 0, got {value!r}")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ConfigError(f"{name} must lie in [0, 1), got {getattr(self, name)!r}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")

    def adamw(self) -> AdamWConfig:
        return AdamWConfig(lr=self.lr, beta1=self.beta1, beta2=self.beta2, weight_decay=self.weight_decay)

    @classmethod
    def from_dict(cls, values: dict) -> "TrainConfig":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})


def evaluate(params, cfg: ModelConfig, data, seq_len, batch_size=64) -> float:
    """Mean cross-entropy over every token of `data` (each predicted once)."""
    windows = list(eval_windows(data, seq_len))
    full = [w for w in windows if len(w[0]) == seq_len]
    total, count = 0.0, 0
    for i in range(0, len(full), batch_size):
        x = np.stack([w[0] for w in full[i:i + batch_size]])
        y = np.stack([w[1] for w in full[i:i + batch_size]])
        total += _sum_loss(params, x, y, cfg)
        count += y.size
    for x, y in windows[len(full):]:  # the one shorter tail window, if any
        total += _sum_loss(params, x, y, cfg)
        count += y.size
    return total / count


def _sum_loss(params, x, y, cfg):
    logits, _ = forward(params, x, cfg)
    mean, _ = cross_entropy_forward(logits, y)
    return mean * y.size


class StopRequest:
    """First Ctrl-C (or --max-minutes) asks the loop to stop after the current
    step and write a checkpoint; a second Ctrl-C aborts at once (the previous
    checkpoint is still intact: checkpoints are written atomically)."""

    def __init__(self):
        self.reason = None

    def __call__(self, signum, frame):
        if self.reason is not None:
            raise KeyboardInterrupt
        self.reason = "interrupted"


def train(corpus_path, out_dir, model_cfg: ModelConfig, train_cfg: TrainConfig, resume=False,
          max_minutes=None, progress=None, on_step=None):
    """Train, writing checkpoints and metrics into out_dir. Returns a summary dict.

    With resume=True the model and training configuration come from the
    checkpoint in out_dir, and model_cfg / train_cfg are ignored.
    """
    out_dir = Path(out_dir)
    ckpt_path, metrics_path = out_dir / CHECKPOINT_NAME, out_dir / METRICS_NAME
    text = load_corpus(corpus_path)
    if resume:
        ckpt = load_checkpoint(ckpt_path)
        if ckpt.opt_state is None or "train" not in ckpt.extra:
            raise ConfigError(f"{ckpt_path} holds no optimizer state; it cannot be resumed")
        model_cfg, train_cfg, tokenizer = ckpt.cfg, TrainConfig.from_dict(ckpt.extra["train"]), ckpt.tokenizer
        params, opt_state, start = ckpt.params, ckpt.opt_state, ckpt.step
        rng = np.random.default_rng()
        rng.bit_generator.state = ckpt.extra["sampler_state"]
        elapsed = ckpt.extra.get("elapsed_s", 0.0)
        _truncate_metrics(metrics_path, start)
    else:
        tokenizer = make_tokenizer(train_cfg.tokenizer, text)
        model_cfg = model_cfg.with_(vocab_size=tokenizer.vocab_size)
        params = init_params(model_cfg, seed=train_cfg.seed, dtype=DTYPES[train_cfg.dtype])
        opt_state, start, elapsed = adamw_init(params), 0, 0.0
        rng = np.random.default_rng(train_cfg.seed)
        out_dir.mkdir(parents=True, exist_ok=True)
        metrics_path.write_text("")
    seq_len = train_cfg.seq_len or model_cfg.context_len
    if seq_len > model_cfg.context_len:
        raise ConfigError(f"seq_len={seq_len} is longer than context_len={model_cfg.context_len}")
    train_ids, val_ids = train_val_split(tokenizer.encode(text), seq_len, source=f"corpus {corpus_path}")
    opt = train_cfg.adamw()

    def save(step):
        extra = {"train": asdict(train_cfg), "sampler_state": rng.bit_generator.state,
                 "elapsed_s": elapsed + time.perf_counter() - t_start, "corpus": str(corpus_path)}
        save_checkpoint(ckpt_path, Checkpoint(params, model_cfg, tokenizer, step, opt_state, extra))

    from tqdm import tqdm  # imported here: the model itself needs numpy alone

    stop = StopRequest()
    previous_handler = signal.signal(signal.SIGINT, stop)
    t_start = time.perf_counter()
    step, val_loss = start, None
    # progress: True shows the bar, False hides it, None shows it on a terminal only.
    bar = tqdm(total=train_cfg.steps, initial=start, disable=None if progress is None else not progress,
               dynamic_ncols=True, unit="step", desc="train")
    try:
        with open(metrics_path, "a") as metrics:
            while step < train_cfg.steps and stop.reason is None:
                t0 = time.perf_counter()
                lr = lr_at(step, train_cfg.lr, train_cfg.warmup, train_cfg.steps, train_cfg.min_lr)
                x, y = sample_batch(train_ids, train_cfg.batch_size, seq_len, rng)
                with np.errstate(over="ignore", invalid="ignore"):  # a diverging run is reported below
                    loss, grads = loss_and_grads(params, x, y, model_cfg)
                grads, norm = clip_grads(grads, train_cfg.grad_clip or None)
                adamw_update(params, grads, opt_state, lr, opt)
                step += 1
                now = time.perf_counter()
                record = {"step": step, "loss": loss, "lr": lr, "grad_norm": norm,
                          "tokens_per_s": x.size / (now - t0), "time_s": elapsed + now - t_start}
                metrics.write(json.dumps(record) + "\n")
                if not math.isfinite(loss):
                    raise ConfigError(f"the loss became {loss} at step {step}; lower --lr or enable --grad-clip")
                if step % train_cfg.eval_every == 0 or step == train_cfg.steps:
                    val_loss = evaluate(params, model_cfg, val_ids, seq_len)
                    metrics.write(json.dumps({"step": step, "val_loss": val_loss,
                                              "time_s": elapsed + time.perf_counter() - t_start}) + "\n")
                    bar.write(f"step {step}: train loss {loss:.4f}, validation loss {val_loss:.4f}")
                metrics.flush()
                if step % train_cfg.ckpt_every == 0 or step == train_cfg.steps:
                    save(step)
                if max_minutes is not None and elapsed + now - t_start > 60 * max_minutes:
                    stop.reason = "time limit"
                bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{record['tokens_per_s']:.0f}", refresh=False)
                bar.update(1)
                if on_step is not None:
                    on_step(step, stop)
            if stop.reason is not None:
                if stop.reason == "time limit" and step % train_cfg.eval_every:  # report where it got to
                    val_loss = evaluate(params, model_cfg, val_ids, seq_len)
                    metrics.write(json.dumps({"step": step, "val_loss": val_loss,
                                              "time_s": elapsed + time.perf_counter() - t_start}) + "\n")
                save(step)
    finally:
        bar.close()
        signal.signal(signal.SIGINT, previous_handler)
    return {"step": step, "steps": train_cfg.steps, "stopped": stop.reason, "val_loss": val_loss,
            "checkpoint": str(ckpt_path), "metrics": str(metrics_path),
            "time_s": elapsed + time.perf_counter() - t_start}


def _truncate_metrics(metrics_path, step):
    """Drop metric lines after `step`: the steps a resumed run will redo."""
    if not metrics_path.exists():
        return
    kept = [line for line in metrics_path.read_text().splitlines()
            if line.strip() and json.loads(line)["step"] <= step]
    metrics_path.write_text("".join(line + "\n" for line in kept))
