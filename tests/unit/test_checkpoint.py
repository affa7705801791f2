import json
import zipfile

import numpy as np
import pytest

from transformer.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from transformer.config import PRESETS
from transformer.data import ByteTokenizer, CharTokenizer
from transformer.errors import CheckpointError
from transformer.model import forward, init_params
from transformer.optim import adamw_init

CFG = PRESETS["tiny"]


def make_checkpoint(dtype=np.float64):
    params = init_params(CFG, seed=3, dtype=dtype)
    state = adamw_init(params)
    rng = np.random.default_rng(0)
    for group in ("m", "v"):
        for v in state[group].values():
            v += rng.random(v.shape)
    state["step"] = 7
    return Checkpoint(params, CFG, CharTokenizer("abcde"), step=7, opt_state=state,
                      extra={"train": {"lr": 0.01}, "note": "ünïcode"})


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_round_trip_gives_identical_logits_and_state(tmp_path, dtype):
    ckpt = make_checkpoint(dtype)
    path = save_checkpoint(tmp_path / "c.npz", ckpt)
    back = load_checkpoint(path)
    ids = np.array([[2, 0, 2, 4]])
    logits_before, _ = forward(ckpt.params, ids, CFG)
    logits_after, _ = forward(back.params, ids, back.cfg)
    np.testing.assert_array_equal(logits_after, logits_before)  # bit for bit
    assert back.cfg == CFG and back.step == 7 and back.tokenizer.chars == "abcde"
    assert back.params["tok_emb"].dtype == dtype
    assert back.opt_state["step"] == 7
    for group in ("m", "v"):
        for name, value in ckpt.opt_state[group].items():
            np.testing.assert_array_equal(back.opt_state[group][name], value)
    assert back.extra == {"train": {"lr": 0.01}, "note": "ünïcode"}


def test_a_params_only_checkpoint_loads_without_optimizer_state(tmp_path):
    ckpt = make_checkpoint()
    ckpt.opt_state = None
    ckpt.tokenizer = ByteTokenizer()
    ckpt.cfg = CFG.with_(vocab_size=256)
    ckpt.params = init_params(ckpt.cfg)
    back = load_checkpoint(save_checkpoint(tmp_path / "p.npz", ckpt))
    assert back.opt_state is None and back.tokenizer.kind == "byte"


def test_a_failed_write_leaves_the_previous_checkpoint_intact(tmp_path):
    path = tmp_path / "c.npz"
    save_checkpoint(path, make_checkpoint())
    before = path.read_bytes()

    def crash(f, arrays):
        raise OSError("disk full (simulated)")

    with pytest.raises(OSError, match="simulated"):
        save_checkpoint(path, make_checkpoint(), write=crash)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["c.npz"]  # no temporary file left behind


def test_missing_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nothing.npz")


def test_truncated_checkpoint(tmp_path):
    path = save_checkpoint(tmp_path / "c.npz", make_checkpoint())
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or not an .npz file"):
        load_checkpoint(path)


def test_text_file_is_not_a_checkpoint(tmp_path):
    path = tmp_path / "notes.npz"
    path.write_text("just some words")
    with pytest.raises(CheckpointError, match="truncated or not an .npz file"):
        load_checkpoint(path)


def test_foreign_npz_is_refused(tmp_path):
    path = tmp_path / "foreign.npz"
    np.savez(path, weights=np.zeros(3))
    with pytest.raises(CheckpointError, match="not a checkpoint of this project"):
        load_checkpoint(path)


def test_other_format_name_or_version_is_refused(tmp_path):
    for meta, message in [({"format": "someone-else"}, "not a checkpoint of this project"),
                          ({"format": "numpy-transformer-checkpoint", "version": 99}, "version 99")]:
        path = tmp_path / "x.npz"
        np.savez(path, meta=np.array(json.dumps(meta)))
        with pytest.raises(CheckpointError, match=message):
            load_checkpoint(path)


def test_pickled_objects_are_refused_not_executed(tmp_path):
    path = tmp_path / "evil.npz"
    np.savez(path, meta=np.array([{"format": "numpy-transformer-checkpoint"}], dtype=object))
    with pytest.raises(CheckpointError, match="pickled objects"):
        load_checkpoint(path)


def test_parameters_that_do_not_match_the_config_are_refused(tmp_path):
    path = save_checkpoint(tmp_path / "c.npz", make_checkpoint())
    with np.load(path) as npz:
        arrays = {k: npz[k] for k in npz.files}
    wrong_shape = dict(arrays, **{"param/head_w": np.zeros((3, 3))})
    np.savez(tmp_path / "shape.npz", **wrong_shape)
    with pytest.raises(CheckpointError, match=r"param/head_w has shape \(3, 3\), its config needs \(4, 5\)"):
        load_checkpoint(tmp_path / "shape.npz")
    missing = {k: v for k, v in arrays.items() if k != "param/b1.wq"}
    np.savez(tmp_path / "missing.npz", **missing)
    with pytest.raises(CheckpointError, match="missing b1.wq"):
        load_checkpoint(tmp_path / "missing.npz")
    meta = json.loads(str(arrays["meta"]))
    meta["config"]["vocab_size"] = 6  # the tokenizer still has 5 symbols
    np.savez(tmp_path / "vocab.npz", **dict(arrays, meta=np.array(json.dumps(meta))))
    with pytest.raises(CheckpointError, match="tokenizer has 5 symbols, model expects 6"):
        load_checkpoint(tmp_path / "vocab.npz")


def test_checkpoint_is_a_plain_zip_of_arrays(tmp_path):
    path = save_checkpoint(tmp_path / "c.npz", make_checkpoint())
    names = zipfile.ZipFile(path).namelist()
    assert "meta.npy" in names and "param/tok_emb.npy" in names and "adam_m/head_b.npy" in names


@pytest.mark.parametrize("meta, message", [
    (["format"], "not a checkpoint of this project"),
    ({"format": "numpy-transformer-checkpoint", "version": 1, "config": {}, "tokenizer": "char", "step": 0},
     "invalid description"),
    ({"format": "numpy-transformer-checkpoint", "version": 1, "config": {"vocab_size": 5},
      "tokenizer": {"kind": "char", "chars": "abcde"}}, "invalid description"),
    ({"format": "numpy-transformer-checkpoint", "version": 1, "config": {"vocab_size": 5},
      "tokenizer": {"kind": "char", "chars": "abcde"}, "step": 0, "adam_step": "x"}, "invalid description"),
])
def test_a_malformed_description_is_a_checkpoint_error(tmp_path, meta, message):
    path = tmp_path / "bad.npz"
    np.savez(path, meta=np.array(json.dumps(meta)))
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(path)


def test_a_directory_is_not_a_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="is a directory, not a file$"):
        load_checkpoint(tmp_path)


def test_a_runs_folder_given_for_its_checkpoint_is_refused_naming_the_file_it_holds(tmp_path):
    save_checkpoint(tmp_path / "checkpoint.npz", make_checkpoint())
    with pytest.raises(CheckpointError) as refused:
        load_checkpoint(tmp_path)
    assert str(refused.value) == (f"checkpoint {tmp_path} is a directory, not a file; "
                                  f"it holds {tmp_path / 'checkpoint.npz'}")
    for name in ("a", "b", "c", "d"):
        (tmp_path / f"{name}.npz").write_bytes(b"")
    with pytest.raises(CheckpointError, match=rf"; it holds {tmp_path / 'a.npz'}, {tmp_path / 'b.npz'}, "
                                              rf"{tmp_path / 'c.npz'} and 2 more .npz files$"):
        load_checkpoint(tmp_path)


def test_checkpoint_files_get_the_usual_permissions(tmp_path):
    import os
    mask = os.umask(0o022)
    try:
        path = save_checkpoint(tmp_path / "c.npz", make_checkpoint())
    finally:
        os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o644
