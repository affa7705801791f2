"""The training loop: steps until the last one or a stop request, validating and saving when due.

The pieces it runs: the settings (train_config.py), the run's state and its checkpoint (run_state.py), one
step and the validation loss (step.py), the run's folder with its lock and metrics file (run_folder.py).
What a caller may change in the loop is explicit: `Hooks`.
"""

import hashlib
import signal
import threading
import time
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Callable

import numpy as np

from .config import ModelConfig, is_finite_number
from .data import load_corpus, train_val_split
from .errors import ConfigError, NonFiniteError
from .run_folder import CHECKPOINT_NAME, RunFolder, check_out_dir
from .run_state import Run, new_run, resumed_run
from .step import evaluate, train_step
from .train_config import MAX_SKIPS_IN_A_ROW, TrainConfig


@dataclass(frozen=True)
class Hooks:
    """The moments of the loop a caller may act at, each optional: the seam a fault injector uses to kill a
    run at a chosen moment or to change a batch's gradients, with the loop itself unchanged.

    Parameters
    ----------
    step_taken : callable, optional
        Called as step_taken(step) when a step has been computed and committed, before its metrics line
        is written.
    validating : callable, optional
        Called as validating(step) just before the validation loss after that step is computed.
    write_checkpoint : callable, optional
        Called as write_checkpoint(step, f, arrays) to write the bytes of the run's file saved at that step
        into its open temporary file f (`checkpoint.write_npz` writes them all).
    gradients : callable, optional
        Called as gradients(grads) on the gradients of every batch as they leave the backward, skipped batches
        included, before any check; the step uses what it returns.
    """
    step_taken: Callable[[int], None] | None = None
    validating: Callable[[int], None] | None = None
    write_checkpoint: Callable[[int, object, dict], None] | None = None
    gradients: Callable[[dict], dict] | None = None


class StopRequest:
    """First Ctrl-C or SIGTERM (or --max-minutes) asks the loop to stop after the current
    step and write a checkpoint; a second one aborts at once (the previous
    checkpoint is still intact: checkpoints are written atomically).

    SIGTERM is what `timeout`, job schedulers and container runtimes send to stop a job; left to its default it
    would kill the run at once and lose every step since the last periodic checkpoint.

    Used as `with StopRequest() as stop:`, it is the SIGINT and SIGTERM handler inside the block and puts the
    previous handlers back after it. Only the main thread may set a handler; elsewhere both are left alone.
    """

    REASONS = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}

    def __init__(self):
        self.reason = None
        self.previous_handlers = {}
        self.in_main_thread = threading.current_thread() is threading.main_thread()

    def __call__(self, signum, frame):
        if self.reason is not None:
            raise KeyboardInterrupt
        self.reason = self.REASONS[signum]

    def __enter__(self):
        if self.in_main_thread:
            self.previous_handlers = {sig: signal.signal(sig, self) for sig in self.REASONS}
        return self

    def __exit__(self, *exc_info):
        for sig, handler in self.previous_handlers.items():
            signal.signal(sig, handler)


@dataclass
class Session:
    """One call of `train` (or of `finetune`): the run, the data it trains and validates on, its folder, its
    hooks and this call's clock."""

    run: Run  # new or resumed
    train_ids: np.ndarray  # the training split
    val_ids: np.ndarray  # the validation split
    seq_len: int  # tokens per window
    folder: RunFolder  # locked while this call writes there
    corpus_path: object  # the corpus file, recorded in checkpoints
    corpus_sha256: str  # hash of the corpus text, recorded in checkpoints
    max_minutes: float | None = None  # the time limit of this call
    hooks: Hooks = Hooks()
    val_loss: float | None = None  # the last validation loss of this call
    refused_in_a_row: int = 0  # steps refused (not finite) since the last good one
    t_start: float = field(default_factory=time.perf_counter)  # the clock of this call starts when it is made

    def run_time(self) -> float:
        """Wall time of the whole run, before its latest resume and since, in seconds."""
        return self.run.elapsed_s + time.perf_counter() - self.t_start

    def step(self) -> dict:
        """Take one training step and append its metrics record; a step that is not finite is refused (see
        `refuse`), and its record says which batch was skipped."""
        sampler_state = self.run.rng.bit_generator.state
        try:
            record = train_step(self.run, self.train_ids, self.seq_len, self.hooks.gradients)
            self.refused_in_a_row = 0
        except NonFiniteError as e:
            record = self.refuse(e, sampler_state)
        else:
            if self.hooks.step_taken is not None:
                self.hooks.step_taken(self.run.step)
        record["time_s"] = self.run_time()
        self.folder.log(record)
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
        self.folder.log({**record, "stopped": True, "time_s": self.run_time()})
        run.rng.bit_generator.state = sampler_state
        self.save()
        if run.train_cfg.on_nonfinite == "skip":
            why, hint = f" after {self.refused_in_a_row} such batches in a row", "lower --lr"
        else:
            why, hint = "", "lower --lr, or resume with --on-nonfinite skip to go on past such batches"
        raise NonFiniteError(f"{e}; stopped{why}, keeping the last good step, {run.step}, in "
                             f"{self.folder.checkpoint_path}; {hint}", e.name)

    def validate(self) -> float:
        """Compute the validation loss, append it to the metrics and return it."""
        if self.hooks.validating is not None:
            self.hooks.validating(self.run.step)
        self.val_loss = evaluate(self.run.model_params(), self.run.model_cfg, self.val_ids, self.seq_len,
                                 threads=self.run.train_cfg.threads)
        self.folder.log({"step": self.run.step, "val_loss": self.val_loss, "time_s": self.run_time()})
        return self.val_loss

    def save(self):
        """Write the run's checkpoint (atomically: a crash leaves the previous one intact)."""
        hook = self.hooks.write_checkpoint
        write = None if hook is None else partial(hook, self.run.step)
        self.run.save(self.folder.checkpoint_path, self.run_time(), self.corpus_path, self.corpus_sha256, write)

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
                "val_step": None if self.val_loss is None else self.folder.last_val_step(),
                "checkpoint": str(self.folder.checkpoint_path), "metrics": str(self.folder.metrics_path),
                "skipped": run.skipped, "time_s": self.run_time()}


def start_session(corpus_path, out_dir, resume, overwrite, max_minutes, new, resumed,
                  file_name=CHECKPOINT_NAME, on_nonfinite=None, hooks=None) -> Session:
    """Check train's arguments, load the corpus, make or restore the run, lock its folder and prepare it.

    The first five parameters, on_nonfinite and hooks are those of `train`, and so are the errors raised.
    `new(text)` makes a run, `resumed(path, corpus_sha256)` restores one from the file `file_name` of out_dir.
    The folder is locked before anything in it is written (truncated metrics, an overwritten run).

    Returns
    -------
    Session
        Ready for the training loop, holding the folder's lock; its clock starts now.
    """
    out_dir = Path(out_dir)
    if max_minutes is not None and not (is_finite_number(max_minutes) and max_minutes > 0):
        raise ConfigError(f"max_minutes must be a positive number, got {max_minutes!r}")
    check_out_dir(out_dir, resume, overwrite)
    text = load_corpus(corpus_path)
    corpus_sha256 = hashlib.sha256(text.encode("utf-8")).hexdigest()
    run = resumed(out_dir / file_name, corpus_sha256) if resume else new(text)
    if resume and on_nonfinite is not None:
        run.train_cfg = replace(run.train_cfg, on_nonfinite=on_nonfinite)
    seq_len = run.train_cfg.seq_len or run.model_cfg.context_len
    if seq_len > run.model_cfg.context_len:
        raise ConfigError(f"seq_len={seq_len} is longer than context_len={run.model_cfg.context_len}")
    train_ids, val_ids = train_val_split(run.tokenizer.encode(text), seq_len, source=f"corpus {corpus_path}")
    folder = RunFolder.open(out_dir, file_name, resume, run.step)
    return Session(run, train_ids, val_ids, seq_len, folder, corpus_path, corpus_sha256, max_minutes,
                   hooks or Hooks())


def train(corpus_path, out_dir, model_cfg: ModelConfig, train_cfg: TrainConfig, resume=False,
          overwrite=False, max_minutes=None, progress=None, on_step=None, on_nonfinite=None, hooks=None):
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
    hooks : Hooks, optional
        What the loop calls at its moments (see `Hooks`); none by default.

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
                            on_nonfinite=on_nonfinite, hooks=hooks)
    return run_session(session, progress, on_step, "train")


def run_session(session, progress, on_step, desc):
    """The training loop of one call of `train` or `finetune`, with its progress bar, Ctrl-C and metrics file."""
    from tqdm import tqdm  # imported here: the model itself needs numpy alone

    bar = tqdm(total=session.run.train_cfg.steps, initial=session.run.step, unit="step", desc=desc,
               disable=None if progress is None else not progress, dynamic_ncols=True)
    # Until the loop is over: the folder locked, metrics.jsonl open for appending, and Ctrl-C caught.
    with session.folder.writing(), StopRequest() as stop, bar:
        training_loop(session, stop, bar, on_step)
        session.finish(stop)
    return session.summary(stop.reason)


def training_loop(session, stop: StopRequest, bar, on_step=None):
    """Take steps until the last one or a stop request; validate and save when due, and show the progress.

    Parameters
    ----------
    session : Session
        The run and its files, with its folder's metrics open.
    stop : StopRequest
        Its reason, once set, ends the loop after the current step; the time limit sets it too.
    bar : tqdm.tqdm
        The progress bar.
    on_step : callable, optional
        See `train`.
    """
    run, tc, metrics = session.run, session.run.train_cfg, session.folder.metrics
    while run.step < tc.steps and stop.reason is None:
        record = session.step()
        if "skipped" in record:  # nothing changed but the batch: report it, then draw the next one
            bar.write(f"{record['skipped']}; skipped the batch ({run.skipped} so far)")
            metrics.flush()
            continue
        if is_due(run.step, tc.eval_every, tc.steps):
            val_loss = session.validate()
            bar.write(f"step {run.step}: train loss {record['loss']:.4f}, validation loss {val_loss:.4f}")
        metrics.flush()
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
