"""The settings of a training run: `TrainConfig`, each field with its help, checked when it is made.

A run saves its TrainConfig in its checkpoint and resumes with it; only `on_nonfinite` may change on resume.
"""

from dataclasses import dataclass, field, fields

import numpy as np

from .config import is_finite_number, is_int
from .data import TOKENIZERS
from .errors import ConfigError
from .optim import AdamWConfig

DTYPES = {"float32": np.float32, "float64": np.float64}
ENGINES = ("handwritten", "autograd")
# The counts and the seed of a run fit an int64, as numpy takes them; a larger one (10**400) would overflow the
# float arithmetic of the learning-rate schedule.
MAX_COUNT = 2**63 - 1
NONFINITE_POLICIES = ("stop", "skip")
MAX_SKIPS_IN_A_ROW = 20  # skip mode stops after this many refused batches in a row: the model itself is broken
POSITIVE_COUNTS = ("steps", "batch_size", "eval_every", "ckpt_every")
COUNTS = ("seq_len", "warmup", "seed", "threads")  # zero allowed


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
    tokenizer: str = field(default="char", metadata={
        "help": "char: vocabulary from the corpus; byte: n_V = 256; gpt2: GPT-2's BPE, n_V = 50257 (its files "
                "come with scripts/setup)", "choices": list(TOKENIZERS)})
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
        for name in POSITIVE_COUNTS + COUNTS:
            value, least = getattr(self, name), 1 if name in POSITIVE_COUNTS else 0
            if not (is_int(value) and value >= least):
                kind = "a positive" if least else "a non-negative"
                raise ConfigError(f"{name} must be {kind} integer, got {value!r}")
            if value > MAX_COUNT:
                raise ConfigError(f"{name} must be below 2**63, got {value!r}")
            object.__setattr__(self, name, int(value))  # numpy integers become plain ints (checkpoints are JSON)
        for name in ("lr", "min_lr", "weight_decay", "grad_clip"):
            value = getattr(self, name)
            if not (is_finite_number(value) and value >= 0):
                raise ConfigError(f"{name} must be a finite number >= 0, got {value!r}")
        for name in ("beta1", "beta2"):
            value = getattr(self, name)
            if not (is_finite_number(value) and 0 <= value < 1):
                raise ConfigError(f"{name} must lie in [0, 1), got {value!r}")
        for name, choices in (("dtype", DTYPES), ("tokenizer", TOKENIZERS), ("engine", ENGINES),
                              ("on_nonfinite", NONFINITE_POLICIES)):
            value = getattr(self, name)
            if not (isinstance(value, str) and value in choices):
                raise ConfigError(f"{name} must be one of {', '.join(choices)}, got {value!r}")

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
