"""GPT-2 checkpoints in and out (transformer/gpt2.py, transformer/gpt2_cli.py): folders that transformers
writes from small random configs, no network. Hugging Face -> ours -> Hugging Face gives every tensor back to
the bit, and a malformed checkpoint is refused in one line that names the tensor or the byte offset, with
nothing written."""

import json
import shutil

import numpy as np
import pytest

from transformer.cli import main
from transformer.errors import CheckpointError, ConfigError
from transformer.gpt2 import WEIGHTS_NAME, load_gpt2, read_safetensors, save_gpt2, write_safetensors

SIZES = {"vocab_size": 50257, "n_positions": 16, "n_embd": 16, "n_layer": 2, "n_head": 2}


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    """A GPT-2 that transformers made at random and saved (config.json, model.safetensors), and its state."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**SIZES, bos_token_id=50256, eos_token_id=50256))
    folder = tmp_path_factory.mktemp("hf")
    model.save_pretrained(folder)
    return folder, {k: v.numpy().copy() for k, v in model.state_dict().items()}


def corrupt(folder, tmp_path, change):
    """A copy of the checkpoint folder with its tensors changed by change(tensors)."""
    copy = tmp_path / "bad"
    shutil.copytree(folder, copy)
    tensors = dict(read_safetensors(copy / WEIGHTS_NAME))
    change(tensors)
    write_safetensors(copy / WEIGHTS_NAME, tensors)
    return copy


def test_hugging_face_to_ours_and_back_gives_every_tensor_to_the_bit(hf_folder, tmp_path):
    import torch
    import transformers

    folder, state = hf_folder
    params, cfg = load_gpt2(folder)
    assert (cfg.vocab_size, cfg.context_len, cfg.emb_dim, cfg.num_layers, cfg.num_heads) == tuple(SIZES.values())
    save_gpt2(tmp_path / "again", params, cfg)
    again = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "again").state_dict()
    assert set(again) == set(state)
    for name, array in state.items():
        assert again[name].dtype == torch.float32 and np.array_equal(again[name].numpy(), array), name


def test_our_safetensors_and_the_safetensors_package_read_each_others_files(tmp_path):
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    rng = np.random.default_rng(0)
    tensors = {"a": rng.standard_normal((3, 5)).astype(np.float32), "b": rng.standard_normal(7),
               "c": np.arange(6, dtype=np.float16).reshape(2, 3)}
    write_safetensors(tmp_path / "ours.safetensors", tensors)
    theirs = safetensors_numpy.load_file(tmp_path / "ours.safetensors")
    safetensors_numpy.save_file(tensors, tmp_path / "theirs.safetensors")
    ours = read_safetensors(tmp_path / "theirs.safetensors")
    for name, a in tensors.items():
        assert theirs[name].dtype == ours[name].dtype == a.dtype and np.array_equal(theirs[name], a)
        assert np.array_equal(ours[name], a)


@pytest.mark.parametrize("change, message", [
    (lambda t: t.pop("transformer.h.1.mlp.c_fc.bias"), "missing tensor h.1.mlp.c_fc.bias"),
    (lambda t: t.update({"transformer.h.0.attn.c_extra.weight": np.zeros(3, np.float32)}),
     "unexpected tensor h.0.attn.c_extra.weight"),
    (lambda t: t.update({"transformer.wpe.weight": np.zeros((17, 16), np.float32)}),
     r"tensor wpe.weight has shape \(17, 16\), the config needs \(16, 16\)"),
    (lambda t: t.update({"transformer.ln_f.bias": np.zeros(16, np.float64)}), "tensors of several dtypes"),
])
def test_a_checkpoint_that_does_not_fit_is_refused_by_the_tensors_name(hf_folder, tmp_path, change, message):
    with pytest.raises((CheckpointError, ConfigError), match=message):
        load_gpt2(corrupt(hf_folder[0], tmp_path, change))


def test_a_tensor_of_integers_is_refused_by_name(hf_folder, tmp_path):
    bad = corrupt(hf_folder[0], tmp_path, lambda t: None)
    data = (bad / WEIGHTS_NAME).read_bytes()
    size = int.from_bytes(data[:8], "little")
    header = data[8:8 + size].replace(b'"transformer.wte.weight":{"dtype":"F32"',
                                      b'"transformer.wte.weight":{"dtype":"I32"')
    (bad / WEIGHTS_NAME).write_bytes(data[:8] + header + data[8 + size:])
    with pytest.raises(CheckpointError, match="tensor transformer.wte.weight has dtype I32"):
        load_gpt2(bad)


@pytest.mark.parametrize("entry, message", [
    ('"transformer.wte.weight":7', "tensor transformer.wte.weight lacks its dtype, shape or data_offsets"),
    ('"transformer.wte.weight":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}', "not sizes"),
    ('"transformer.wte.weight":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}', "not sizes"),
    ('"transformer.wte.weight":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}', "has 8 bytes for shape \\(3,\\)"),
])
def test_a_header_entry_that_is_not_a_tensor_is_refused_by_name(tmp_path, entry, message):
    header = ("{" + entry + "}").encode()
    (tmp_path / "x.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + bytes(16))
    with pytest.raises(CheckpointError, match=message):
        read_safetensors(tmp_path / "x.safetensors")


def test_a_truncated_file_is_refused_with_the_byte_offsets(hf_folder, tmp_path):
    bad = corrupt(hf_folder[0], tmp_path, lambda t: None)
    data = (bad / WEIGHTS_NAME).read_bytes()
    (bad / WEIGHTS_NAME).write_bytes(data[:-100])
    with pytest.raises(CheckpointError, match=f"ends at byte {len(data)}, the file at byte {len(data) - 100}"):
        load_gpt2(bad)
    (bad / WEIGHTS_NAME).write_bytes(data[:5])
    with pytest.raises(CheckpointError, match="5 bytes, too short"):
        load_gpt2(bad)


def test_a_config_that_is_not_gpt2s_layout_is_refused(hf_folder, tmp_path):
    bad = corrupt(hf_folder[0], tmp_path, lambda t: None)
    config = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**config, "activation_function": "relu"}))
    with pytest.raises(ConfigError, match="not GPT-2's layout"):
        load_gpt2(bad)


@pytest.mark.parametrize("config, message", [
    ([1, 2], "not a JSON object"), ({"n_positions": 16}, "n_embd missing"), ({**SIZES, "n_embd": None}, "not a number"),
    ({**SIZES, "n_embd": "16"}, "emb_dim must be a positive integer"),
])
def test_a_config_json_without_gpt2s_sizes_is_refused(hf_folder, tmp_path, config, message):
    bad = corrupt(hf_folder[0], tmp_path, lambda t: None)
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises((CheckpointError, ConfigError), match=message):
        load_gpt2(bad)


def test_stored_causal_masks_are_checked_and_dropped(hf_folder, tmp_path):
    causal = np.tril(np.ones((16, 16), np.float32))[None, None]
    good = corrupt(hf_folder[0], tmp_path, lambda t: t.update({"transformer.h.0.attn.bias": causal}))
    params, _ = load_gpt2(good)
    assert "b0.wq" in params
    (tmp_path / "bad").rename(tmp_path / "good")
    for wrong in (np.ones_like(causal), np.ones(3, np.float32), np.ones((1, 1, 16, 4), np.float32)):
        bad = corrupt(hf_folder[0], tmp_path, lambda t: t.update({"transformer.h.1.attn.bias": wrong}))
        with pytest.raises(ConfigError, match="h.1.attn.bias is not the causal mask"):
            load_gpt2(bad)
        shutil.rmtree(bad)


# ---------------------------------------------------------------- the commands

def test_import_then_sample_then_export(hf_folder, tmp_path, capsys):
    pytest.importorskip("transformer.bpe").find_files()  # GPT-2's tokenizer files, from scripts/setup
    folder, state = hf_folder
    assert main(["import-gpt2", str(folder), "--out", str(tmp_path / "run")]) == 0
    assert main(["sample", "--checkpoint", str(tmp_path / "run" / "checkpoint.npz"), "--prompt", "To be",
                 "--tokens", "5", "--temperature", "0"]) == 0
    from transformer.bpe import GPT2Tokenizer
    from transformer.generate import generate

    params, cfg = load_gpt2(folder)
    tok = GPT2Tokenizer()
    expected = "To be" + tok.decode(generate(params, cfg, tok.encode("To be"), 5, temperature=0.0))
    assert capsys.readouterr().out.splitlines()[-1] == expected.splitlines()[-1]
    assert main(["export-gpt2", "--checkpoint", str(tmp_path / "run" / "checkpoint.npz"),
                 "--out", str(tmp_path / "out")]) == 0
    back = read_safetensors(tmp_path / "out" / WEIGHTS_NAME)
    assert all(np.array_equal(back[k], state[k]) for k in back) and len(back) == len(state) - 1  # lm_head: tied


def test_a_malformed_checkpoint_is_one_line_and_nothing_is_written(hf_folder, tmp_path, capsys):
    bad = corrupt(hf_folder[0], tmp_path, lambda t: t.pop("transformer.h.0.ln_1.weight"))
    assert main(["import-gpt2", str(bad), "--out", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err == "error: missing tensor h.0.ln_1.weight\n"
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


def test_an_existing_checkpoint_is_not_replaced_without_overwrite(hf_folder, tmp_path, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "checkpoint.npz").write_bytes(b"mine")
    assert main(["import-gpt2", str(hf_folder[0]), "--out", str(tmp_path / "run")]) == 2
    assert "exists; pass --overwrite" in capsys.readouterr().err
    assert (tmp_path / "run" / "checkpoint.npz").read_bytes() == b"mine"
