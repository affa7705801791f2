"""A run's state: what it carries from step to step, and saves in its checkpoint to resume from.

Resuming restores the parameters, the AdamW moments, the step and the batch sampler's random state, so a
resumed run computes the same losses as one that never stopped.
"""

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .autograd_model import loss_and_grads as autograd_loss_and_grads
from .checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from .config import ModelConfig, is_finite_number, is_int
from .data import make_tokenizer
from .errors import CheckpointError, ConfigError, TransformerError
from .model import init_params, loss_and_grads
from .optim import adamw_init
from .parallel import sharded
from .train_config import DTYPES, TrainConfig


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
        Wall time this run spent before its latest resume (in the processes that trained it earlier), in seconds.
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
    elapsed_s: float = 0.0  # wall time before the latest resume
    skipped: int = 0  # batches skipped because their step was not finite

    def loss_and_grads(self, x, y):
        """The loss of a batch and the gradients of what this run trains: every parameter, computed in
        shards at once (`--threads`; transformer/parallel.py)."""
        compute = autograd_loss_and_grads if self.train_cfg.engine == "autograd" else loss_and_grads
        return sharded(self.train_cfg.threads)(compute, self.params, x, y, self.model_cfg)

    def model_params(self):
        """The parameters the forward runs (fine-tuning adds its frozen base to what it trains)."""
        return self.params

    def save(self, path, elapsed_s, corpus_path, corpus_sha256, write=None):
        """Write the run's checkpoint (atomically: a crash leaves the previous one intact); `write`, when
        given, writes its bytes into the temporary file (see `checkpoint.write_npz_atomically`)."""
        save_checkpoint(path, self.checkpoint(elapsed_s, corpus_path, corpus_sha256), write)

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
