"""The older GPT-2 checkpoint, pytorch_model.bin, read without torch and without running its pickle
(transformer/torch_zip.py): the same parameters as from model.safetensors, tensors that are windows of a shared
storage read as torch reads them, and a pickle that asks for anything but tensors refused before it runs."""

import json
import os
import pickle
import shutil
import zipfile

import numpy as np
import pytest

from transformer.errors import CheckpointError
from transformer.gpt2 import TORCH_WEIGHTS_NAME, WEIGHTS_NAME, load_gpt2
from transformer.torch_zip import read_torch_zip, rebuild_tensor

torch = pytest.importorskip("torch")

SIZES = {"vocab_size": 50257, "n_positions": 16, "n_embd": 16, "n_layer": 2, "n_head": 2}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Two folders of one random GPT-2: model.safetensors (transformers' save_pretrained), and pytorch_model.bin
    (torch.save of a GPT2Model's state, without the prefix, with the causal masks old checkpoints stored)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**SIZES, bos_token_id=50256, eos_token_id=50256))
    safe, old = tmp_path_factory.mktemp("safe"), tmp_path_factory.mktemp("old")
    model.save_pretrained(safe)
    shutil.copy(safe / "config.json", old / "config.json")
    state = {k.removeprefix("transformer."): v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    for l in range(SIZES["n_layer"]):
        state[f"h.{l}.attn.bias"] = torch.tril(torch.ones(16, 16, dtype=torch.bool))[None, None]
        state[f"h.{l}.attn.masked_bias"] = torch.tensor(-1e4)
    torch.save(state, old / TORCH_WEIGHTS_NAME)
    return safe, old


def test_pytorch_model_bin_gives_the_same_parameters_as_safetensors(folders):
    safe, old = folders
    (ours, cfg), (again, cfg_again) = load_gpt2(safe), load_gpt2(old)
    assert cfg == cfg_again and list(ours) == list(again)
    assert all(again[k].dtype == np.float32 and np.array_equal(again[k], ours[k]) for k in ours)


def test_windows_of_a_shared_storage_are_read_as_torch_reads_them(tmp_path):
    base = torch.arange(24, dtype=torch.float64).reshape(4, 6)
    tensors = {"whole": base, "transposed": base.t(), "columns": base[:, 1:4], "offset": base[2:, ::2],
               "half": torch.linspace(-2, 2, 5, dtype=torch.float16), "empty": torch.zeros(0, 3)}
    torch.save(tensors, tmp_path / "t.bin")
    read = read_torch_zip(tmp_path / "t.bin")
    assert list(read) == list(tensors)
    for name, tensor in tensors.items():
        assert read[name].dtype == tensor.numpy().dtype and np.array_equal(read[name], tensor.numpy()), name


class RunsCode:
    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def archive_with(path, data_pkl, storages=()):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", data_pkl)
        for key, data in storages:
            z.writestr(f"archive/data/{key}", data)


def test_a_pickle_that_asks_for_a_function_is_refused_before_it_runs(tmp_path):
    payload = RunsCode()
    payload.marker = tmp_path / "ran"
    archive_with(tmp_path / "evil.bin", pickle.dumps({"w": payload}, protocol=2))
    with pytest.raises(CheckpointError, match=r"asks for (posix|os|nt)\.system.*refused"):
        read_torch_zip(tmp_path / "evil.bin")
    assert not payload.marker.exists()
    payload.marker = tmp_path / "control"
    pickle.loads(pickle.dumps(payload, protocol=2))  # the negative control: plain pickle does run it
    assert payload.marker.exists()


def test_damaged_archives_are_refused_by_name(tmp_path):
    torch.save({"w": torch.ones(3, 4)}, tmp_path / "good.bin")
    data = (tmp_path / "good.bin").read_bytes()
    (tmp_path / "cut.bin").write_bytes(data[:len(data) // 2])
    with pytest.raises(CheckpointError, match="cut.bin: not a whole zip archive"):
        read_torch_zip(tmp_path / "cut.bin")
    with zipfile.ZipFile(tmp_path / "good.bin") as z:
        pkl = next(z.read(n) for n in z.namelist() if n.endswith("/data.pkl"))
    archive_with(tmp_path / "lost.bin", pkl)
    with pytest.raises(CheckpointError, match="storage 0 is not in the archive"):
        read_torch_zip(tmp_path / "lost.bin")
    archive_with(tmp_path / "short.bin", pkl, [("0", bytes(20))])
    with pytest.raises(CheckpointError, match="storage 0 holds 20 bytes, 12 elements of FloatStorage need 48"):
        read_torch_zip(tmp_path / "short.bin")
    torch.save({"w": torch.ones(3, dtype=torch.bfloat16)}, tmp_path / "bf16.bin")
    with pytest.raises(CheckpointError, match="BFloat16Storage, which numpy does not hold"):
        read_torch_zip(tmp_path / "bf16.bin")


def test_a_window_past_its_storage_is_refused():
    assert np.array_equal(rebuild_tensor(np.arange(6.0), 1, (2, 2), (3, 1)), [[1, 2], [4, 5]])
    with pytest.raises(CheckpointError, match="reaches element 6 of a storage of 6"):
        rebuild_tensor(np.arange(6.0), 2, (2, 2), (3, 1))
    with pytest.raises(CheckpointError, match="not a window"):
        rebuild_tensor(np.arange(6.0), 0, (2,), (-1,))


def test_a_weight_that_is_not_a_float_is_refused_by_name(folders, tmp_path):
    _, old = folders
    bad = tmp_path / "bad"
    shutil.copytree(old, bad)
    state = read_torch_zip(bad / TORCH_WEIGHTS_NAME)
    state["wpe.weight"] = state["wpe.weight"].astype(np.int64)
    torch.save({k: torch.from_numpy(np.array(v)) for k, v in state.items()}, bad / TORCH_WEIGHTS_NAME)
    with pytest.raises(CheckpointError, match="tensor wpe.weight has dtype int64"):
        load_gpt2(bad)
    assert json.loads((bad / "config.json").read_text())["n_embd"] == 16
    (bad / TORCH_WEIGHTS_NAME).unlink()
    with pytest.raises(CheckpointError, match=f"{WEIGHTS_NAME} \\(or {TORCH_WEIGHTS_NAME}\\) missing"):
        load_gpt2(bad)
