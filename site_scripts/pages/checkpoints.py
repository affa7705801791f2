"""Generator of the Checkpoints page's fragments: a real save and load, and the refusals."""

import hashlib
import json
import tempfile
from pathlib import Path

import numpy as np

from transformer.checkpoint import FORMAT, VERSION, load_checkpoint, save_checkpoint
from transformer.config import PRESETS
from transformer.data import train_val_split
from transformer.errors import CheckpointError
from transformer.model import init_params
from transformer.run_state import new_run
from transformer.step import train_step
from transformer.train_config import TrainConfig

from .. import sections
from ..examples import SEED, collapsed

TEXT = "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n" * 4
STEPS = 3


def make(folder):
    """A checkpoint as `train` writes it, in folder: a small run on TEXT, after STEPS real training steps."""
    tc = TrainConfig(steps=STEPS, batch_size=2, seq_len=8, warmup=1, dtype="float64", seed=SEED)
    run = new_run(TEXT, PRESETS["tiny"].with_(context_len=8), tc)
    train_ids, _ = train_val_split(run.tokenizer.encode(TEXT), tc.seq_len)
    for _ in range(STEPS):
        train_step(run, train_ids, tc.seq_len)
    ckpt = run.checkpoint(0.0, "corpus.txt", hashlib.sha256(TEXT.encode()).hexdigest())
    return save_checkpoint(folder / "checkpoint.npz", ckpt), ckpt


def layout_md(path, ckpt):
    with np.load(path, allow_pickle=False) as npz:
        entries = [[f"`{k}`", sections.shape_text(npz[k].shape), str(npz[k].dtype)] for k in npz.files]
        meta = json.loads(str(npz["meta"]))
    loaded = load_checkpoint(path)
    same = all(np.array_equal(loaded.params[k], v) for k, v in ckpt.params.items()) and all(
        np.array_equal(loaded.opt_state[g][k], ckpt.opt_state[g][k]) for g in ("m", "v") for k in ckpt.params)
    return (f"The checkpoint of a small run written at build time ({STEPS} training steps of the tiny model's sizes "
            f"on a two-line text, seed {SEED}; the elapsed time is set to 0 so that the page is the same on every "
            f"machine) holds {len(entries)} arrays:\n\n"
            + collapsed("Every entry of the file", sections.md_table(["Entry", "Shape", "dtype"], entries)) + "\n"
            + "Its `meta` entry, as JSON:\n\n```json\n" + json.dumps(meta, indent=2) + "\n```\n\n"
            + f"Loading it back with `load_checkpoint` gives every parameter and moment bit for bit: "
              f"**{'yes' if same else 'NO'}**.\n")


def refusals_md(path):
    """What `load_checkpoint` says to files it must refuse, written beside the good checkpoint at path."""
    folder, good = path.parent, path.read_bytes()
    (folder / "truncated.npz").write_bytes(good[: len(good) // 2])
    (folder / "notes.txt").write_text("not a checkpoint")
    np.savez(folder / "foreign.npz", weights=np.zeros(3))
    other = init_params(PRESETS["tiny"].with_(emb_dim=6, num_heads=2), seed=SEED)
    bad = {"format": FORMAT, "version": VERSION, "config": PRESETS["tiny"].to_dict(),
           "tokenizer": {"kind": "char", "chars": "abcde"}, "step": 0, "adam_step": None, "extra": {}}
    np.savez(folder / "wrong-shapes.npz", meta=np.array(json.dumps(bad)), **{f"param/{k}": v for k, v in other.items()})
    np.savez(folder / "pickled.npz", meta=np.array([{"a": 1}], dtype=object))
    cases = []
    for label, name in [("a file that does not exist", "missing.npz"),
                        ("half of a real checkpoint", "truncated.npz"),
                        ("a text file", "notes.txt"),
                        ("another program's .npz", "foreign.npz"),
                        ("parameters of another size", "wrong-shapes.npz"),
                        ("an object array (needs pickle)", "pickled.npz")]:
        try:
            load_checkpoint(folder / name)
            message = "**loaded without error**"
        except CheckpointError as e:
            message = "`" + str(e).replace(str(folder) + "/", "") + "`"
        cases.append([label, message])
    return ("Each of these was written and then loaded at build time; the message is the real one (with the "
            "temporary folder's name removed):\n\n" + sections.md_table(["Given", "`load_checkpoint` says"], cases))


def generate(context):
    with tempfile.TemporaryDirectory() as folder:
        path, ckpt = make(Path(folder))
        return {"layout": layout_md(path, ckpt), "refusals": refusals_md(path)}
