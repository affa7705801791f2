"""A run's folder: the files a run writes into it, its lock, and its metrics file.

A run writes into its output folder:

- checkpoint.npz (train, full fine-tuning) or adapter.npz (LoRA fine-tuning): the run's latest state, written
  atomically (every --ckpt-every steps, at the end, and when stopped by Ctrl-C or --max-minutes);
- metrics.jsonl: one JSON object a line: training steps, validation losses, refused steps;
- run.lock: held while a run writes into the folder, so that a second run is refused (see runlock.py).
"""

import json
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError
from .runlock import FolderLock

CHECKPOINT_NAME = "checkpoint.npz"
ADAPTER_NAME = "adapter.npz"
RUN_FILES = (CHECKPOINT_NAME, ADAPTER_NAME)  # what marks a folder as holding a run: train's, or finetune's
METRICS_NAME = "metrics.jsonl"


def check_out_dir(out_dir: Path, resume, overwrite):
    """Refuse an out_dir that is a file, and a new run over an old one unless overwrite is given.

    Raises
    ------
    ConfigError
        Naming the folder and what to do instead.
    """
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"{out_dir} is a file; --out must name a folder (new or holding a run)")
    if not resume and not overwrite and any((out_dir / name).exists() for name in RUN_FILES):
        raise ConfigError(f"{out_dir} already holds a run; continue it with --resume, "
                          "start again with --overwrite, or choose another --out")


@dataclass
class RunFolder:
    """The folder a run writes into, locked by this process from `open` until `writing` ends.

    Parameters
    ----------
    path : Path
        The folder.
    checkpoint_name : str
        The run's file in it: CHECKPOINT_NAME, or ADAPTER_NAME for LoRA fine-tuning.
    lock : FolderLock
        Held on the folder.
    """
    path: Path
    checkpoint_name: str
    lock: FolderLock
    metrics: object = None  # metrics.jsonl, open for appending inside `writing`

    @property
    def checkpoint_path(self) -> Path:
        return self.path / self.checkpoint_name

    @property
    def metrics_path(self) -> Path:
        return self.path / METRICS_NAME

    @classmethod
    def open(cls, path, checkpoint_name, resume, step) -> "RunFolder":
        """Make the folder if needed, lock it, and only then prepare it (see `prepare`) for a run at `step`.

        Raises
        ------
        RunLockedError
            If another live run holds the folder; nothing in it was changed.
        """
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        folder = cls(path, checkpoint_name, FolderLock(path).acquire())
        try:
            folder.prepare(resume, step)
        except BaseException:
            folder.lock.release()
            raise
        return folder

    def prepare(self, resume, step):
        """Remove the temporary files of a save that was killed halfway; a resumed run drops the metrics of the
        steps after `step`, which it will redo; a new run removes any old run's files and starts an empty
        metrics file."""
        for name in RUN_FILES:  # what a write killed halfway left (write_npz_atomically): no live run owns it
            for stale in self.path.glob(f"{name}.*.tmp"):
                stale.unlink()
        if resume:
            truncate_metrics(self.metrics_path, step)
            return
        # With overwrite, the old run's checkpoint goes with its metrics: were it kept, a new run that
        # fails before its first checkpoint would leave it beside the new metrics, and --resume would mix both.
        for name in RUN_FILES:
            (self.path / name).unlink(missing_ok=True)
        self.metrics_path.write_text("")

    @contextmanager
    def writing(self):
        """Inside the block metrics.jsonl is open for appending (`log`); after it, the lock is released, however
        the block ends."""
        try:
            with open(self.metrics_path, "a") as self.metrics:
                yield self
        finally:
            self.metrics = None
            self.lock.release()

    def log(self, record: dict):
        """Append one record to metrics.jsonl (flushed by the loop, with the records of the same step)."""
        self.metrics.write(json.dumps(record) + "\n")

    def last_val_step(self):
        """The step of the last validation loss in metrics.jsonl; None if there is none."""
        return max((r["step"] for r in read_metrics(self.metrics_path) if "val_loss" in r), default=None)


def read_metrics(metrics_path) -> list:
    """The records of a metrics file (none if it is missing), one dict a line; a line torn by a crash mid-write
    is skipped."""
    records = []
    for line in metrics_path.read_text().splitlines() if metrics_path.exists() else []:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def truncate_metrics(metrics_path, step):
    """Drop metric lines after `step`: the steps a resumed run will redo."""
    kept = [r for r in read_metrics(metrics_path) if r.get("step", 0) <= step]
    metrics_path.write_text("".join(json.dumps(r) + "\n" for r in kept))
