"""The training loop: batches, AdamW, evaluation, metrics, checkpoints, resume.

A run writes into its output folder:

- checkpoint.npz: the latest checkpoint (every --ckpt-every steps, at the end,
  and when stopped by Ctrl-C or --max-minutes);
- metrics.jsonl: one JSON object a line: training steps, validation losses, refused steps;
- run.lock: held while a run writes into the folder, so that a second run is refused (see runlock.py).

A step whose loss, a gradient or an update is not finite commits nothing (no parameter, no AdamW moment,
no step count); the run then stops with a checkpoint of its last good step, or skips the batch
(TrainConfig.on_nonfinite).

Resuming restores the parameters, the AdamW moments, the step and the batch
sampler's random state, so a resumed run computes the same losses as one that
never stopped.
"""

import json
import math
import signal
import threading
import time
import hashlib
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import numpy as np

from .autograd_model import loss_and_grads as autograd_loss_and_grads
from .checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from .config import ModelConfig, is_finite_number, is_int
from .data import TOKENIZERS, eval_windows, load_corpus, make_tokenizer, sample_batch, train_val_split
from .errors import CheckpointError, ConfigError, MaskedRowError, NonFiniteError, TransformerError
from .model import forward, init_params, loss_and_grads
from .optim import AdamWConfig, adamw_init, adamw_update, clip_grads, lr_at
from .parallel import sharded
from .runlock import FolderLock
from .softmax import cross_entropy_forward

CHECKPOINT_NAME = "checkpoint.npz"
RUN_FILES = (CHECKPOINT_NAME, "adapter.npz")  # what marks a folder as holding a run: train's, or finetune's
METRICS_NAME = "metrics.jsonl"
DTYPES = {"float32": np.float32, "float64": np.float64}
ENGINES = ("handwritten", "autograd")
# The counts and the seed of a run fit an int64, as numpy takes them; a larger one (10**400) would overflow the
# float arithmetic of the learning-rate schedule.
MAX_COUNT = 2**63 - 1
NONFINITE_POLICIES = ("stop", "skip")
MAX_SKIPS_IN_A_ROW = 20  # skip mode stops after this many refused batches in a row: the model itself is broken


@dataclass(frozen=True)
class TrainConfig:
    """Settings of a training run, checked when the config is made.

    Each field's meaning is its `help`, the one place it is written: `python -m transformer train --help`
    and the Configuration page of the site both read it from here.

    Raises
    ------
    ConfigError
        If a value is out of range or not one of the choices.
    """
    steps: int = field(default=2000, metadata={"help": "optimizer steps in the whole run"})
    batch_size: int = field(default=32, metadata={"help": "windows per step"})
    seq_len: int = field(default=0, metadata={"help": "tokens per window; 0 means the model's context_len"})
    lr: float = field(default=3e-3, metadata={"help": "peak learning rate, reached at the end of warm-up"})
    min_lr: float = field(default=3e-4, metadata={"help": "learning rate at the end of the cosine decay"})
    warmup: int = field(default=100, metadata={"help": "steps of linear warm-up"})
    weight_decay: float = field(default=0.1, metadata={"help": "AdamW decoupled decay, of the weight matrices and "
                                                               "embedding tables only"})
    beta1: float = field(default=0.9, metadata={"help": "AdamW decay of the running mean of gradients"})
    beta2: float = field(default=0.99, metadata={"help": "AdamW decay of the running mean of squared gradients"})
    grad_clip: float = field(default=1.0, metadata={"help": "max global gradient norm; 0 disables clipping"})
    eval_every: int = field(default=500, metadata={"help": "steps between validation losses (whole split)"})
    ckpt_every: int = field(default=1000, metadata={"help": "steps between checkpoints"})
    seed: int = field(default=0, metadata={"help": "parameter initialisation and batch sampling"})
    dtype: str = field(default="float32", metadata={"help": "arithmetic of training", "choices": list(DTYPES)})
    tokenizer: str = field(default="char", metadata={"help": "char: vocabulary from the corpus; byte: n_V = 256",
                                                      "choices": list(TOKENIZERS)})
    engine: str = field(default="handwritten", metadata={
        "help": "how the gradients are computed: handwritten, by the backward functions of each step; autograd, "
                "by the tape of transformer/autograd.py (the same gradients, more memory, slower)",
        "choices": list(ENGINES)})
    threads: int = field(default=0, metadata={
        "help": "how many shards each batch is cut into (by its windows), all computed at once: by worker "
                "processes on Linux (fine-tuning: threads), by threads elsewhere, with the same bits "
                "(transformer/parallel.py); 0: one per core. The numbers depend on it only through rounding"})
    on_nonfinite: str = field(default="stop", metadata={
        "help": "a step whose loss or a gradient is not finite changes nothing; stop: end the run with a "
                f"checkpoint of the last good step; skip: go on with the next batch (counted in metrics.jsonl; "
                f"{MAX_SKIPS_IN_A_ROW} in a row stop the run)", "choices": list(NONFINITE_POLICIES)})

    def __post_init__(self):
        for name in ("steps", "batch_size", "eval_every", "ckpt_every"):
            value = getattr(self, name)
            if not (is_int(value) and value >= 1):
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
            if value > MAX_COUNT:
                raise ConfigError(f"{name} must be below 2**63, got {value!r}")
            object.__setattr__(self, name, int(value))  # numpy integers become plain ints (checkpoints are JSON)
        for name in ("seq_len", "warmup", "seed", "threads"):
            value = getattr(self, name)
            if not (is_int(value) and value >= 0):
                raise ConfigError(f"{name} must be a non-negative integer, got {value!r}")
            if value > MAX_COUNT:
                raise ConfigError(f"{name} must be below 2**63, got {value!r}")
            object.__setattr__(self, name, int(value))
        for name in ("lr", "min_lr", "weight_decay", "grad_clip"):
            value = getattr(self, name)
            if not (is_finite_number(value) and value >= 0):
                raise ConfigError(f"{name} must be a finite number >= 0, got {value!r}")
        for name in ("beta1", "beta2"):
            value = getattr(self, name)
            if not (is_finite_number(value) and 0 <= value < 1):
                raise ConfigError(f"{name} must lie in [0, 1), got {value!r}")
        if not (isinstance(self.dtype, str) and self.dtype in DTYPES):
            raise ConfigError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if not (isinstance(self.tokenizer, str) and self.tokenizer in TOKENIZERS):
            raise ConfigError(f"tokenizer must be one of {', '.join(TOKENIZERS)}, got {self.tokenizer!r}")
        if not (isinstance(self.engine, str) and self.engine in ENGINES):
            raise ConfigError(f"engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        if not (isinstance(self.on_nonfinite, str) and self.on_nonfinite in NONFINITE_POLICIES):
            raise ConfigError(f"on_nonfinite must be one of {', '.join(NONFINITE_POLICIES)}, "
                              f"got {self.on_nonfinite!r}")

    def adamw(self) -> AdamWConfig:
        """The AdamW hyperparameters of this run.

        Returns
        -------
        AdamWConfig
            lr, betas and weight decay from this config; eps keeps its default.
        """
        return AdamWConfig(lr=self.lr, beta1=self.beta1, beta2=self.beta2, weight_decay=self.weight_decay)

    @classmethod
    def from_dict(cls, values: dict) -> "TrainConfig":
        """Make a config from a dictionary, such as a checkpoint stores; keys that are not fields are ignored.

        Parameters
        ----------
        values : dict
            Field name to value.

        Returns
        -------
        TrainConfig
            The validated config.

        Raises
        ------
        ConfigError
            If a value is invalid.
        """
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})


def evaluate(params, cfg: ModelConfig, data, seq_len, batch_size=64, threads=1) -> float:
    """Mean cross-entropy over every token of data, each predicted once.

    Parameters
    ----------
    params : dict
        Parameter name to array.
    cfg : ModelConfig
        The model configuration.
    data : ndarray of shape (n,)
        Token ids.
    seq_len : int
        Tokens per window.
    batch_size : int
        Windows per forward pass.
    threads : int
        Forward passes computed at once (0: one per core).

    Returns
    -------
    float
        The mean loss.
    """
    windows = list(eval_windows(data, seq_len))
    full = [w for w in windows if len(w[0]) == seq_len]
    batches = [(np.stack([w[0] for w in full[i:i + batch_size]]), np.stack([w[1] for w in full[i:i + batch_size]]))
               for i in range(0, len(full), batch_size)] + windows[len(full):]  # and the shorter tail window, if any
    sums = sharded(threads).map(lambda xy: _sum_loss(params, *xy, cfg), batches)
    return sum(sums) / sum(y.size for _, y in batches)


def _sum_loss(params, x, y, cfg):
    logits, _ = forward(params, x, cfg)
    mean, _ = cross_entropy_forward(logits, y)
    return mean * y.size


class StopRequest:
    """First Ctrl-C (or --max-minutes) asks the loop to stop after the current
    step and write a checkpoint; a second Ctrl-C aborts at once (the previous
    checkpoint is still intact: checkpoints are written atomically).

    Used as `with StopRequest() as stop:`, it is the SIGINT handler inside the block and puts the
    previous handler back after it. Only the main thread may set a handler; elsewhere Ctrl-C is left alone.
    """

    def __init__(self):
        self.reason = None
        self.previous_handler = None
        self.in_main_thread = threading.current_thread() is threading.main_thread()

    def __call__(self, signum, frame):
        if self.reason is not None:
            raise KeyboardInterrupt
        self.reason = "interrupted"

    def __enter__(self):
        if self.in_main_thread:
            self.previous_handler = signal.signal(signal.SIGINT, self)
        return self

    def __exit__(self, *exc_info):
        if self.in_main_thread:
            signal.signal(signal.SIGINT, self.previous_handler)


@dataclass
class Run:
    """Everything a run carries from step to step, and saves in its checkpoint.

    Parameters
    ----------
    model_cfg : ModelConfig
        The model configuration.
    train_cfg : TrainConfig
        The training configuration.
    tokenizer : CharTokenizer or ByteTokenizer
        The tokenizer of the corpus.
    params : dict
        Parameter name to array.
    opt_state : dict
        The AdamW state.
    rng : numpy.random.Generator
        Draws the training batches.
    step : int
        Steps taken so far.
    elapsed_s : float
        Wall time of the earlier sessions of this run, in seconds.
    skipped : int
        Batches skipped so far because a step was not finite (on_nonfinite="skip").
    """

    model_cfg: ModelConfig
    train_cfg: TrainConfig
    tokenizer: object
    params: dict
    opt_state: dict
    rng: np.random.Generator  # draws the training batches
    step: int = 0
    elapsed_s: float = 0.0  # wall time of earlier sessions of this run
    skipped: int = 0  # batches skipped because their step was not finite

    file_name = CHECKPOINT_NAME  # what the run saves into its folder

    def loss_and_grads(self, x, y):
        """The loss of a batch and the gradients of what this run trains: every parameter, computed in
        shards at once (`--threads`; transformer/parallel.py)."""
        compute = autograd_loss_and_grads if self.train_cfg.engine == "autograd" else loss_and_grads
        return sharded(self.train_cfg.threads)(compute, self.params, x, y, self.model_cfg)

    def model_params(self):
        """The parameters the forward runs (fine-tuning adds its frozen base to what it trains)."""
        return self.params

    def save(self, path, elapsed_s, corpus_path, corpus_sha256):
        """Write the run's checkpoint (atomically: a crash leaves the previous one intact)."""
        save_checkpoint(path, self.checkpoint(elapsed_s, corpus_path, corpus_sha256))

    def checkpoint(self, elapsed_s, corpus_path, corpus_sha256) -> Checkpoint:
        """The run's current state as a Checkpoint.

        Parameters
        ----------
        elapsed_s : float
            Wall time of the run so far, in seconds.
        corpus_path : str or Path
            The corpus file, recorded for messages.
        corpus_sha256 : str
            Hash of the corpus text; resuming checks it.

        Returns
        -------
        Checkpoint
            Parameters, AdamW state, step, training config and sampler state.
        """
        extra = self.extra(elapsed_s, corpus_path, corpus_sha256)
        return Checkpoint(self.params, self.model_cfg, self.tokenizer, self.step, self.opt_state, extra)

    def extra(self, elapsed_s, corpus_path, corpus_sha256) -> dict:
        """What a saved run records besides its arrays: its settings, where its sampler is, its clock and corpus."""
        return {"train": asdict(self.train_cfg), "sampler_state": self.rng.bit_generator.state,
                "elapsed_s": elapsed_s, "corpus": str(corpus_path), "corpus_sha256": corpus_sha256,
                "skipped_batches": self.skipped}


def new_run(text, model_cfg: ModelConfig, train_cfg: TrainConfig) -> Run:
    """Start a run: a tokenizer from the text, fresh parameters and a fresh optimizer state.

    Parameters
    ----------
    text : str
        The corpus.
    model_cfg : ModelConfig
        The model configuration; its vocab_size is replaced by the tokenizer's.
    train_cfg : TrainConfig
        The training configuration.

    Returns
    -------
    Run
        The run at step 0.
    """
    tokenizer = make_tokenizer(train_cfg.tokenizer, text)
    model_cfg = model_cfg.with_(vocab_size=tokenizer.vocab_size)
    params = init_params(model_cfg, seed=train_cfg.seed, dtype=DTYPES[train_cfg.dtype])
    return Run(model_cfg, train_cfg, tokenizer, params, adamw_init(params), np.random.default_rng(train_cfg.seed))


def resumed_run(ckpt_path, corpus_sha256) -> Run:
    """Restore a run from its checkpoint, to continue training.

    Parameters
    ----------
    ckpt_path : Path
        The run's checkpoint.
    corpus_sha256 : str
        Hash of the corpus text, compared with that of the corpus the run was trained on.

    Returns
    -------
    Run
        The run at the checkpoint's step, with its sampler state restored.

    Raises
    ------
    CheckpointError
        If the checkpoint cannot be read, or its training settings or sampler state are invalid.
    ConfigError
        If the corpus differs, the checkpoint holds no optimizer or sampler state, or the run has
        already finished.
    """
    ckpt = load_checkpoint(ckpt_path)
    train_cfg, rng = restored_state(ckpt.extra, ckpt.opt_state, ckpt.step, ckpt_path, corpus_sha256)
    return Run(ckpt.cfg, train_cfg, ckpt.tokenizer, ckpt.params, ckpt.opt_state, rng, ckpt.step,
               ckpt.extra.get("elapsed_s", 0.0), int(ckpt.extra.get("skipped_batches", 0)))


def restored_state(extra, opt_state, step, path, corpus_sha256, what="checkpoint"):
    """The training config and the batch sampler a saved run resumes with, after checking that it can resume:
    the same corpus, an optimizer and sampler state, valid settings, steps left. Shared by `resumed_run` and
    fine-tuning's resume.

    Returns
    -------
    (TrainConfig, numpy.random.Generator)

    Raises
    ------
    ConfigError
        If the corpus differs, the file holds no optimizer or sampler state, or the run has already finished.
    CheckpointError
        If its training settings or sampler state are invalid.
    """
    saved = extra.get("corpus_sha256")
    if saved is not None and saved != corpus_sha256:
        raise ConfigError(f"the corpus differs from the one this run was trained on "
                          f"({extra.get('corpus')}); resume with that file")
    if opt_state is None or "train" not in extra or "sampler_state" not in extra:
        raise ConfigError(f"{path} holds no optimizer or sampler state; it cannot be resumed")
    try:  # loading checks the model's part of the description; these parts are the run's
        train_cfg = TrainConfig.from_dict(extra["train"])
        rng = np.random.default_rng()
        rng.bit_generator.state = extra["sampler_state"]
    except (TransformerError, AttributeError, KeyError, TypeError, ValueError, OverflowError) as e:
        raise CheckpointError(f"{what} {path} holds an invalid training state: {e!r}") from None
    elapsed = extra.get("elapsed_s", 0.0)
    if not (is_finite_number(elapsed) and elapsed >= 0):
        raise CheckpointError(f"{what} {path} holds an invalid training time elapsed_s={elapsed!r}")
    skipped = extra.get("skipped_batches", 0)
    if not (is_int(skipped) and skipped >= 0):
        raise CheckpointError(f"{what} {path} holds an invalid count of skipped batches {skipped!r}")
    if step >= train_cfg.steps:
        raise ConfigError(f"the run in {Path(path).parent} already finished ({step} of {train_cfg.steps} "
                          "steps); there is nothing to resume")
    return train_cfg, rng


def train(corpus_path, out_dir, model_cfg: ModelConfig, train_cfg: TrainConfig, resume=False,
          overwrite=False, max_minutes=None, progress=None, on_step=None, on_nonfinite=None):
    """Train a model, writing checkpoints and metrics into out_dir.

    Parameters
    ----------
    corpus_path : str or Path
        The UTF-8 text to train on.
    out_dir : str or Path
        The run's folder.
    model_cfg : ModelConfig
        The model configuration; ignored with resume=True.
    train_cfg : TrainConfig
        The training configuration; ignored with resume=True.
    resume : bool
        Continue the run in out_dir, taking the model and training configuration from its checkpoint.
    overwrite : bool
        Let a new run replace one already in out_dir; without it such an out_dir is refused.
    max_minutes : float, optional
        Stop, with a checkpoint, after this much time in this call.
    progress : bool, optional
        True shows a progress bar, False hides it, None shows it on a terminal only.
    on_step : callable, optional
        Called as on_step(step, stop_request) after every step (the tests use it to stop a run).
    on_nonfinite : str, optional
        With resume=True, replaces the run's saved TrainConfig.on_nonfinite ("stop" or "skip"): a run that
        stopped at a batch whose step was not finite can go on past it.

    Returns
    -------
    dict
        A summary: the step reached, why the run stopped, the last validation loss and its step, the
        checkpoint and metrics paths, the batches skipped, and the run time.

    Raises
    ------
    ConfigError
        If max_minutes is not positive, out_dir is a file or already holds a run, seq_len exceeds context_len, or
        the run cannot be resumed.
    CorpusError
        If the corpus cannot be read or is too short.
    CheckpointError
        If the checkpoint to resume from cannot be read.
    RunLockedError
        If another live run is writing into out_dir.
    NonFiniteError
        If a step is not finite and the run stops there (on_nonfinite="stop", or too many skips in a row); the
        checkpoint then holds the last good step.
    """
    session = start_session(corpus_path, out_dir, resume, overwrite, max_minutes,
                            new=lambda text: new_run(text, model_cfg, train_cfg), resumed=resumed_run,
                            on_nonfinite=on_nonfinite)
    return run_session(session, progress, on_step, "train")


def run_session(session, progress, on_step, desc):
    """The training loop of a session, with its progress bar, Ctrl-C and metrics file (see `train`)."""
    from tqdm import tqdm  # imported here: the model itself needs numpy alone

    bar = tqdm(total=session.run.train_cfg.steps, initial=session.run.step, unit="step", desc=desc,
               disable=None if progress is None else not progress, dynamic_ncols=True)
    # Ctrl-C is caught, and metrics.jsonl open for appending, until the loop is over; the folder is locked until then.
    try:
        with StopRequest() as stop, bar, open(session.metrics_path, "a") as metrics:
            session.metrics = metrics
            training_loop(session, stop, bar, on_step)
            session.finish(stop)
    finally:
        session.lock.release()
    return session.summary(stop.reason)


def training_loop(session, stop: StopRequest, bar, on_step=None):
    """Take steps until the last one or a stop request; validate and save when due, and show the progress.

    Parameters
    ----------
    session : Session
        The run and its files, with session.metrics open.
    stop : StopRequest
        Its reason, once set, ends the loop after the current step; the time limit sets it too.
    bar : tqdm.tqdm
        The progress bar.
    on_step : callable, optional
        See `train`.
    """
    run, tc = session.run, session.run.train_cfg
    while run.step < tc.steps and stop.reason is None:
        record = session.step()
        if "skipped" in record:  # nothing changed but the batch: report it, then draw the next one
            bar.write(f"{record['skipped']}; skipped the batch ({run.skipped} so far)")
            session.metrics.flush()
            continue
        if is_due(run.step, tc.eval_every, tc.steps):
            val_loss = session.validate()
            bar.write(f"step {run.step}: train loss {record['loss']:.4f}, validation loss {val_loss:.4f}")
        session.metrics.flush()
        if is_due(run.step, tc.ckpt_every, tc.steps):
            session.save()
        if session.out_of_time():
            stop.reason = "time limit"
        bar.set_postfix(loss=f"{record['loss']:.3f}", tok_s=f"{record['tokens_per_s']:.0f}", refresh=False)
        bar.update(1)
        if on_step is not None:
            on_step(run.step, stop)


def is_due(step, every, steps) -> bool:
    """Whether a periodic task (validation, checkpoint) runs after this step: every `every` steps and after the last."""
    return step % every == 0 or step == steps


@dataclass
class Session:
    """One call of `train`: the run, the data it trains and validates on, the files it writes, and this call's clock.

    Parameters
    ----------
    run : Run
        The run, new or resumed.
    train_ids, val_ids : ndarray of shape (n,)
        The training and validation splits.
    seq_len : int
        Tokens per window.
    out_dir : Path
        The run's folder.
    corpus_path : str or Path
        The corpus file, recorded in checkpoints.
    corpus_sha256 : str
        Hash of the corpus text, recorded in checkpoints.
    max_minutes : float or None
        The time limit of this call.
    lock : FolderLock
        Held on out_dir while this call writes there.
    """

    run: Run
    train_ids: np.ndarray
    val_ids: np.ndarray
    seq_len: int
    out_dir: Path
    corpus_path: object
    corpus_sha256: str
    max_minutes: float | None = None
    lock: FolderLock | None = None
    val_loss: float | None = None  # the last validation loss of this call
    refused_in_a_row: int = 0  # steps refused (not finite) since the last good one
    metrics: object = None  # metrics.jsonl, open for appending while the loop runs
    t_start: float = field(default_factory=time.perf_counter)  # the clock of this call starts when it is made

    @property
    def ckpt_path(self) -> Path:
        return self.out_dir / self.run.file_name

    @property
    def metrics_path(self) -> Path:
        return self.out_dir / METRICS_NAME

    def run_time(self) -> float:
        """Wall time of the whole run: the earlier sessions' and this one's, in seconds."""
        return self.run.elapsed_s + time.perf_counter() - self.t_start

    def step(self) -> dict:
        """Take one training step and append its metrics record; a step that is not finite is refused (see
        `refuse`), and its record says which batch was skipped."""
        sampler_state = self.run.rng.bit_generator.state
        try:
            record = train_step(self.run, self.train_ids, self.seq_len)
            self.refused_in_a_row = 0
        except NonFiniteError as e:
            record = self.refuse(e, sampler_state)
        record["time_s"] = self.run_time()
        self.metrics.write(json.dumps(record) + "\n")
        return record

    def refuse(self, e: NonFiniteError, sampler_state) -> dict:
        """A step that was not finite, and committed nothing: skip its batch, or stop with a checkpoint.

        Under on_nonfinite="skip" (and fewer than MAX_SKIPS_IN_A_ROW in a row) the batch counts as skipped and
        its record is returned. Otherwise the sampler goes back to before the batch, so that the checkpoint
        written is exactly the last good step, and the run stops.

        Raises
        ------
        NonFiniteError
            When the run stops; the message says which checkpoint holds the last good step.
        """
        run = self.run
        self.refused_in_a_row += 1
        record = {"step": run.step + 1, "nonfinite": e.name}
        if run.train_cfg.on_nonfinite == "skip" and self.refused_in_a_row < MAX_SKIPS_IN_A_ROW:
            run.skipped += 1
            return {**record, "skipped": str(e), "skipped_batches": run.skipped}
        self.metrics.write(json.dumps({**record, "stopped": True, "time_s": self.run_time()}) + "\n")
        run.rng.bit_generator.state = sampler_state
        self.save()
        if run.train_cfg.on_nonfinite == "skip":
            why, hint = f" after {self.refused_in_a_row} such batches in a row", "lower --lr"
        else:
            why, hint = "", "lower --lr, or resume with --on-nonfinite skip to go on past such batches"
        raise NonFiniteError(f"{e}; stopped{why}, keeping the last good step, {run.step}, in {self.ckpt_path}; "
                             f"{hint}", e.name)

    def validate(self) -> float:
        """Compute the validation loss, append it to the metrics and return it."""
        self.val_loss = evaluate(self.run.model_params(), self.run.model_cfg, self.val_ids, self.seq_len,
                                 threads=self.run.train_cfg.threads)
        self.metrics.write(json.dumps({"step": self.run.step, "val_loss": self.val_loss, "time_s": self.run_time()})
                           + "\n")
        return self.val_loss

    def save(self):
        """Write the run's checkpoint (atomically: a crash leaves the previous one intact)."""
        self.run.save(self.ckpt_path, self.run_time(), self.corpus_path, self.corpus_sha256)

    def out_of_time(self) -> bool:
        """Whether this call has used up max_minutes."""
        return self.max_minutes is not None and time.perf_counter() - self.t_start > 60 * self.max_minutes

    def finish(self, stop: StopRequest):
        """After the loop: a run stopped before its last step saves where it got to (validated, after a time limit)."""
        if self.run.step == self.run.train_cfg.steps:
            stop.reason = None  # stopped on the last step: that is simply the end of the run
        if stop.reason is not None:
            if stop.reason == "time limit" and self.run.step % self.run.train_cfg.eval_every:  # report where it got to
                self.validate()
            self.save()

    def summary(self, stopped) -> dict:
        """What `train` returns: see there."""
        run = self.run
        return {"step": run.step, "steps": run.train_cfg.steps, "stopped": stopped, "val_loss": self.val_loss,
                "val_step": None if self.val_loss is None else _last_val_step(self.metrics_path),
                "checkpoint": str(self.ckpt_path), "metrics": str(self.metrics_path), "skipped": run.skipped,
                "time_s": self.run_time()}


def start_session(corpus_path, out_dir, resume, overwrite, max_minutes, new, resumed,
                  file_name=CHECKPOINT_NAME, on_nonfinite=None) -> Session:
    """Check train's arguments, load the corpus, make or restore the run, lock its folder and prepare it.

    The first five parameters and on_nonfinite are those of `train`, and so are the errors raised. `new(text)`
    makes a run, `resumed(path, corpus_sha256)` restores one from the file `file_name` of out_dir. The folder
    is locked before anything in it is written (truncated metrics, an overwritten run).

    Returns
    -------
    Session
        Ready for the training loop, holding the folder's lock; its clock starts now.
    """
    out_dir = Path(out_dir)
    _check_out_dir(out_dir, resume, overwrite, max_minutes)
    text = load_corpus(corpus_path)
    corpus_sha256 = hashlib.sha256(text.encode("utf-8")).hexdigest()
    ckpt_path, metrics_path = out_dir / file_name, out_dir / METRICS_NAME
    run = resumed(ckpt_path, corpus_sha256) if resume else new(text)
    if resume and on_nonfinite is not None:
        run.train_cfg = replace(run.train_cfg, on_nonfinite=on_nonfinite)
    seq_len = run.train_cfg.seq_len or run.model_cfg.context_len
    if seq_len > run.model_cfg.context_len:
        raise ConfigError(f"seq_len={seq_len} is longer than context_len={run.model_cfg.context_len}")
    train_ids, val_ids = train_val_split(run.tokenizer.encode(text), seq_len, source=f"corpus {corpus_path}")
    out_dir.mkdir(parents=True, exist_ok=True)
    lock = FolderLock(out_dir).acquire()
    try:
        prepare_out_dir(out_dir, resume, run.step, metrics_path)
    except BaseException:
        lock.release()
        raise
    return Session(run, train_ids, val_ids, seq_len, out_dir, corpus_path, corpus_sha256, max_minutes, lock)


def prepare_out_dir(out_dir, resume, step, metrics_path):
    """Make the locked folder ready: remove the temporary files of a save that was killed halfway; a resumed
    run drops the metrics of the steps it will redo; a new run removes any old run's files (with overwrite) and
    starts an empty metrics file."""
    for name in RUN_FILES:  # what a write killed halfway left (write_npz_atomically): no live run owns it
        for stale in out_dir.glob(f"{name}.*.tmp"):
            stale.unlink()
    if resume:
        _truncate_metrics(metrics_path, step)
        return
    # With overwrite, the old run's checkpoint goes with its metrics: were it kept, a new run that
    # fails before its first checkpoint would leave it beside the new metrics, and --resume would mix both.
    for name in RUN_FILES:
        (out_dir / name).unlink(missing_ok=True)
    metrics_path.write_text("")


def _check_out_dir(out_dir, resume, overwrite, max_minutes):
    """Refuse a bad time limit, an out_dir that is a file, and a new run over an old one (see `train`)."""
    if max_minutes is not None and not (is_finite_number(max_minutes) and max_minutes > 0):
        raise ConfigError(f"max_minutes must be a positive number, got {max_minutes!r}")
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"{out_dir} is a file; --out must name a folder (new or holding a run)")
    if not resume and not overwrite and any((out_dir / name).exists() for name in RUN_FILES):
        raise ConfigError(f"{out_dir} already holds a run; continue it with --resume, "
                          "start again with --overwrite, or choose another --out")


def train_step(run: Run, train_ids, seq_len) -> dict:
    """Take one optimizer step on a fresh random batch, all or nothing.

    Parameters
    ----------
    run : Run
        The run; its parameters, optimizer state, sampler and step are updated in place.
    train_ids : ndarray of shape (n,)
        The training split.
    seq_len : int
        Tokens per window.

    Returns
    -------
    dict
        The step's metrics record: step, loss, lr, grad_norm and tokens_per_s.

    Raises
    ------
    NonFiniteError
        If the loss, a gradient or the update is not finite. Then no parameter, no moment and not the step
        count changed; only the sampler has moved past the batch. The message names the step and what was
        not finite first (the loss, or the first parameter in the model's order).
    """
    tc = run.train_cfg
    t0 = time.perf_counter()
    lr = lr_at(run.step, tc.lr, tc.warmup, tc.steps, tc.min_lr)
    x, y = sample_batch(train_ids, tc.batch_size, seq_len, run.rng)
    where = f"step {run.step + 1}"
    with np.errstate(over="ignore", invalid="ignore"):  # what is not finite is reported below
        loss, grads = finite_loss_and_grads(run, x, y, where)
        grads, norm = clip_grads(grads, tc.grad_clip or None)
        try:
            adamw_update(run.params, grads, run.opt_state, lr, tc.adamw())
        except NonFiniteError as e:
            raise NonFiniteError(f"{where}: {e} (loss {loss:.4f})", e.name) from None
    run.step += 1
    return {"step": run.step, "loss": loss, "lr": lr, "grad_norm": norm,
            "tokens_per_s": x.size / (time.perf_counter() - t0)}


def finite_loss_and_grads(run: Run, x, y, where):
    """The run's loss and gradients on a batch, refused unless the loss is finite.

    Raises
    ------
    NonFiniteError
        Naming `where` (the step), when the loss is not finite.
    """
    try:
        loss, grads = run.loss_and_grads(x, y)
    except MaskedRowError as e:  # scores that overflowed to -inf: a diverged model, not a bad input
        raise NonFiniteError(f"{where}: the loss is not finite ({e}); training diverged", "loss") from None
    if not math.isfinite(loss):
        hint = "" if run.train_cfg.grad_clip else " (--grad-clip, e.g. 1.0, bounds each step)"
        raise NonFiniteError(f"{where}: the loss became {loss}: training diverged{hint}", "loss")
    return loss, grads  # a gradient that is not finite is refused by adamw_update, which names the first


def _read_metrics(metrics_path):
    """The metric records; a line torn by a crash mid-write is skipped."""
    records = []
    for line in metrics_path.read_text().splitlines() if metrics_path.exists() else []:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def _truncate_metrics(metrics_path, step):
    """Drop metric lines after `step`: the steps a resumed run will redo."""
    kept = [r for r in _read_metrics(metrics_path) if r.get("step", 0) <= step]
    metrics_path.write_text("".join(json.dumps(r) + "\n" for r in kept))


def _last_val_step(metrics_path):
    return max((r["step"] for r in _read_metrics(metrics_path) if "val_loss" in r), default=None)
