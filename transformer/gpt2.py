"""GPT-2's checkpoints in this model's names: Hugging Face's tensor names and layout mapped to the parameter
dictionary, and back.

```text
Hugging Face (GPT2LMHeadModel)               here
wte.weight (n_V, d), wpe.weight (T_max, d)   tok_emb, pos_emb
h.{l}.ln_1.weight / .bias                    b{l}.ln1_g / b{l}.ln1_b
h.{l}.attn.c_attn.weight (d, 3d) / .bias     b{l}.wq | wk | wv (d, d) each / b{l}.bq | bk | bv: split in that order
h.{l}.attn.c_proj.weight / .bias             b{l}.wo / b{l}.bo
h.{l}.ln_2.weight / .bias                    b{l}.ln2_g / b{l}.ln2_b
h.{l}.mlp.c_fc.weight (d, F) / .bias         b{l}.ff1_w / b{l}.ff1_b
h.{l}.mlp.c_proj.weight (F, d) / .bias       b{l}.ff2_w / b{l}.ff2_b
ln_f.weight / .bias                          lnf_g / lnf_b
lm_head.weight                               none: tied to wte (the config's tied_head)
```

GPT-2's linear layers are "Conv1D" modules that store their weight (in, out), as this model does, so no
matrix is transposed; only q, k and v, fused into one c_attn, are split. The names may carry the prefix
`transformer.` (a GPT2LMHeadModel's state) or not (a GPT2Model's, as in the original checkpoint).
"""

import json
import math
from pathlib import Path

import numpy as np

from .checkpoint import write_npz_atomically
from .config import GPT2_LAYOUT, ModelConfig, is_int
from .errors import ConfigError
from .model import param_shapes
from .torch_zip import read_torch_zip

QKV = ("q", "k", "v")  # the order of c_attn's three column blocks
BLOCK_NAMES = {  # Hugging Face's name within a block: ours (c_attn is split apart, see `block_from_hf`)
    "ln_1.weight": "ln1_g", "ln_1.bias": "ln1_b", "attn.c_proj.weight": "wo", "attn.c_proj.bias": "bo",
    "ln_2.weight": "ln2_g", "ln_2.bias": "ln2_b", "mlp.c_fc.weight": "ff1_w", "mlp.c_fc.bias": "ff1_b",
    "mlp.c_proj.weight": "ff2_w", "mlp.c_proj.bias": "ff2_b"}
TOP_NAMES = {"wte.weight": "tok_emb", "wpe.weight": "pos_emb", "ln_f.weight": "lnf_g", "ln_f.bias": "lnf_b"}
PREFIX = "transformer."
END_OF_TEXT_ID = 50256  # GPT-2's <|endoftext|>, its last id


def check_gpt2_layout(cfg: ModelConfig):
    """Refuse a config whose head or activation a GPT-2 checkpoint cannot hold."""
    wrong = {name: getattr(cfg, name) for name, want in
             (("tied_head", True), ("head_bias", False), ("activation", "gelu_tanh")) if getattr(cfg, name) != want}
    if wrong:
        raise ConfigError("GPT-2's layout needs tied_head=True, head_bias=False, activation='gelu_tanh'; got "
                          + ", ".join(f"{k}={v!r}" for k, v in wrong.items()))


def hf_names(cfg: ModelConfig) -> dict:
    """Each Hugging Face tensor name (without the prefix) of a GPT-2 of this config: the parameter names it
    holds, in c_attn's order."""
    names = {hf: [ours] for hf, ours in TOP_NAMES.items()}
    for l in range(cfg.num_layers):
        names.update({f"h.{l}.{hf}": [f"b{l}.{ours}"] for hf, ours in BLOCK_NAMES.items()})
        names[f"h.{l}.attn.c_attn.weight"] = [f"b{l}.w{x}" for x in QKV]
        names[f"h.{l}.attn.c_attn.bias"] = [f"b{l}.b{x}" for x in QKV]
    return names


def from_hf(state: dict, cfg: ModelConfig) -> dict:
    """This model's parameters from a GPT-2 state dictionary of numpy arrays.

    Parameters
    ----------
    state : dict
        Hugging Face tensor name to array, with or without the `transformer.` prefix; lm_head.weight, if
        there, must equal wte.weight (GPT-2 ties them).
    cfg : ModelConfig
        The model's sizes, in GPT-2's layout.

    Returns
    -------
    dict
        Parameter name to array (views of the state's arrays where no split is needed), in `param_shapes` order.

    Raises
    ------
    ConfigError
        If the config is not GPT-2's layout, a tensor is missing or extra, or a shape does not fit the config.
    """
    check_gpt2_layout(cfg)
    state = {name.removeprefix(PREFIX): array for name, array in state.items()}
    drop_mask_buffers(state, cfg)
    head = state.pop("lm_head.weight", None)
    if head is not None and not np.array_equal(head, state.get("wte.weight")):
        raise ConfigError("lm_head.weight differs from wte.weight: this model's head is tied to the token table")
    names, shapes = hf_names(cfg), param_shapes(cfg)
    missing, extra = sorted(set(names) - set(state)), sorted(set(state) - set(names))
    if missing or extra:
        raise ConfigError("; ".join(f"{what} tensor{'s' * (len(n) > 1)} {', '.join(n)}"
                                    for what, n in (("missing", missing), ("unexpected", extra)) if n))
    params = {}
    for hf, ours in names.items():
        array = state[hf]
        want = shapes[ours[0]][:-1] + (shapes[ours[0]][-1] * len(ours),)
        if np.shape(array) != want:
            raise ConfigError(f"tensor {hf} has shape {np.shape(array)}, the config needs {want}")
        params.update(zip(ours, np.split(array, len(ours), axis=-1)))  # c_attn: q, k, v side by side
    return {name: params[name] for name in shapes}


def drop_mask_buffers(state, cfg: ModelConfig):
    """Take out the causal masks that older GPT-2 checkpoints store beside the weights (`h.{l}.attn.bias`, ones
    on and below the diagonal, and `h.{l}.attn.masked_bias`, the number written into masked scores): this model
    builds its mask itself, so a stored one is only checked to be the same causal mask."""
    for l in range(cfg.num_layers):
        state.pop(f"h.{l}.attn.masked_bias", None)
        mask = state.pop(f"h.{l}.attn.bias", None)
        if mask is None:
            continue
        square = np.shape(mask)[-2:]
        if np.ndim(mask) < 2 or not np.array_equal(np.reshape(mask, square), np.tril(np.ones(square))):
            raise ConfigError(f"tensor h.{l}.attn.bias is not the causal mask this model applies")


def to_hf(params: dict, cfg: ModelConfig, prefix=PREFIX) -> dict:
    """A GPT-2 state dictionary (`from_hf`'s inverse): q, k and v joined into c_attn, lm_head.weight left out
    (tied; `transformers` restores it from wte)."""
    check_gpt2_layout(cfg)
    return {prefix + hf: np.concatenate([params[n] for n in ours], axis=-1) if len(ours) > 1 else params[ours[0]]
            for hf, ours in hf_names(cfg).items()}


# ---------------------------------------------------------------- safetensors, read and written with numpy

DTYPES = {"F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2")}  # the float types numpy holds
CONFIG_NAME, WEIGHTS_NAME = "config.json", "model.safetensors"
TORCH_WEIGHTS_NAME = "pytorch_model.bin"  # the older format, read when there is no model.safetensors


def read_safetensors(path) -> dict:
    """The tensors of a .safetensors file: 8 bytes (little-endian) giving the header's length, a JSON header
    naming each tensor's dtype, shape and byte range, then the bytes of every tensor, back to back.

    Parameters
    ----------
    path : str or Path

    Returns
    -------
    dict
        Tensor name to array (read-only views of the file's bytes, in the header's order).

    Raises
    ------
    CheckpointError
        If the file is truncated or its header is not valid: the message names the tensor or the byte offset.
    """
    from .errors import CheckpointError

    data = Path(path).read_bytes()
    if len(data) < 8:
        raise CheckpointError(f"{path}: {len(data)} bytes, too short for a safetensors header's length")
    size = int.from_bytes(data[:8], "little")
    if 8 + size > len(data):
        raise CheckpointError(f"{path}: the header claims bytes 8 to {8 + size}, the file ends at byte {len(data)}")
    try:
        header = json.loads(data[8:8 + size])
    except ValueError as e:
        raise CheckpointError(f"{path}: the header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: the header is not a JSON object")
    body, tensors = memoryview(data)[8 + size:], {}
    for name, info in header.items():
        if name != "__metadata__":
            dtype, shape, begin, stop = tensor_entry(path, name, info)
            if stop > len(body):
                raise CheckpointError(f"{path}: tensor {name} ends at byte {8 + size + stop}, the file at byte {len(data)}")
            tensors[name] = np.frombuffer(body[begin:stop], dtype=dtype).reshape(shape)
    return tensors


def tensor_entry(path, name, info):
    """(dtype, shape, begin, end) of one tensor's header entry, each checked; a CheckpointError names the tensor."""
    from .errors import CheckpointError

    if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= set(info):
        raise CheckpointError(f"{path}: tensor {name} lacks its dtype, shape or data_offsets")
    dtype = DTYPES.get(info["dtype"]) if isinstance(info["dtype"], str) else None
    if dtype is None:
        raise CheckpointError(f"{path}: tensor {name} has dtype {info['dtype']}; a GPT-2 checkpoint holds floats "
                              f"({', '.join(DTYPES)})")
    shape, offsets = info["shape"], info["data_offsets"]
    whole = lambda values, n: isinstance(values, list) and (n is None or len(values) == n) and all(  # noqa: E731
        is_int(v) and v >= 0 for v in values)
    if not (whole(shape, None) and whole(offsets, 2) and offsets[0] <= offsets[1]):
        raise CheckpointError(f"{path}: tensor {name} has shape {shape} and data_offsets {offsets}: not sizes")
    if offsets[1] - offsets[0] != dtype.itemsize * math.prod(shape):
        raise CheckpointError(f"{path}: tensor {name} has {offsets[1] - offsets[0]} bytes for shape {tuple(shape)} "
                              f"of {info['dtype']}")
    return dtype, tuple(shape), offsets[0], offsets[1]


def write_safetensors(path, tensors: dict, metadata=None):
    """Write tensors as a .safetensors file (`read_safetensors`'s layout; the header padded with spaces to a
    multiple of 8 bytes, as the format asks), atomically, as checkpoints are written."""
    header, offset = {}, 0
    if metadata:
        header["__metadata__"] = metadata
    arrays = {name: np.ascontiguousarray(a, dtype=np.asarray(a).dtype.newbyteorder("<")) for name, a in tensors.items()}
    for name, a in arrays.items():
        kind = next(k for k, d in DTYPES.items() if d == a.dtype)
        header[name] = {"dtype": kind, "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    write_bytes(path, [len(text).to_bytes(8, "little"), text, *(a.tobytes() for a in arrays.values())])


def write_bytes(path, chunks):
    """Write byte chunks to path through checkpoint's atomic writer (a temporary file, fsync, a rename)."""
    write_npz_atomically(path, chunks, write=lambda f, parts: f.writelines(parts))


# ---------------------------------------------------------------- a Hugging Face GPT-2 folder

def config_from_hf(hf: dict) -> ModelConfig:
    """A ModelConfig from a GPT-2 config.json; a config that is not GPT-2's layout is refused."""
    if hf.get("activation_function", "gelu_new") != "gelu_new" or not hf.get("tie_word_embeddings", True):
        raise ConfigError("config.json is not GPT-2's layout: it needs activation_function gelu_new and tied "
                          "word embeddings")
    d = hf["n_embd"]
    return ModelConfig(vocab_size=hf["vocab_size"], context_len=hf["n_positions"], emb_dim=d,
                       num_heads=hf["n_head"], num_layers=hf["n_layer"], ff_dim=hf.get("n_inner") or 4 * d,
                       ln_eps=hf.get("layer_norm_epsilon", 1e-5), **GPT2_LAYOUT)


def config_to_hf(cfg: ModelConfig) -> dict:
    """config.json for a GPT-2 of this config (`config_from_hf`'s inverse), as transformers reads it. The
    begin and end ids are GPT-2's <|endoftext|> where the vocabulary holds it, else none."""
    check_gpt2_layout(cfg)
    end = END_OF_TEXT_ID if cfg.vocab_size > END_OF_TEXT_ID else None
    return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": cfg.vocab_size,
            "n_positions": cfg.context_len, "n_embd": cfg.emb_dim, "n_head": cfg.num_heads, "n_layer": cfg.num_layers,
            "n_inner": cfg.ff_dim, "layer_norm_epsilon": cfg.ln_eps, "activation_function": "gelu_new",
            "tie_word_embeddings": True, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
            "bos_token_id": end, "eos_token_id": end}


def load_gpt2(folder):
    """Read a Hugging Face GPT-2 folder (config.json and model.safetensors, or the older pytorch_model.bin, read
    without running its pickle: transformer/torch_zip.py) as (params, cfg).

    Raises
    ------
    CheckpointError, ConfigError
        If a file is missing or malformed, or a tensor is missing, extra or of the wrong shape or dtype.
    """
    from .errors import CheckpointError

    folder = Path(folder)
    weights = next((folder / n for n in (WEIGHTS_NAME, TORCH_WEIGHTS_NAME) if (folder / n).is_file()), None)
    missing = [CONFIG_NAME] * (not (folder / CONFIG_NAME).is_file()) + \
        [f"{WEIGHTS_NAME} (or {TORCH_WEIGHTS_NAME})"] * (weights is None)
    if missing:
        raise CheckpointError(f"{folder}: {', '.join(missing)} missing")
    try:
        hf = json.loads((folder / CONFIG_NAME).read_text())
    except ValueError as e:
        raise CheckpointError(f"{folder / CONFIG_NAME}: not JSON ({e})") from None
    if not isinstance(hf, dict):
        raise CheckpointError(f"{folder / CONFIG_NAME}: not a JSON object")
    try:
        cfg = config_from_hf(hf)
    except KeyError as e:
        raise CheckpointError(f"{folder / CONFIG_NAME}: {e.args[0]} missing") from None
    except TypeError:  # n_embd not a number, say
        raise CheckpointError(f"{folder / CONFIG_NAME}: a size is not a number") from None
    state = read_safetensors(weights) if weights.name == WEIGHTS_NAME else read_torch_zip(weights)
    state = {name.removeprefix(PREFIX): array for name, array in state.items()}
    drop_mask_buffers(state, cfg)  # an old checkpoint's masks may be stored as bytes or booleans
    for name, array in state.items():
        if array.dtype not in DTYPES.values():
            raise CheckpointError(f"{weights}: tensor {name} has dtype {array.dtype}; a GPT-2 checkpoint holds floats")
    dtypes = {a.dtype for a in state.values()}
    if len(dtypes) > 1:
        raise CheckpointError(f"{weights}: tensors of several dtypes ({', '.join(map(str, dtypes))})")
    return from_hf(state, cfg), cfg


def save_gpt2(folder, params, cfg: ModelConfig):
    """Write params as a Hugging Face GPT-2 folder that transformers' `GPT2LMHeadModel.from_pretrained` reads."""
    folder = Path(folder)
    state = to_hf(params, cfg)
    write_safetensors(folder / WEIGHTS_NAME, state, {"format": "pt"})
    write_bytes(folder / CONFIG_NAME, [json.dumps(config_to_hf(cfg), indent=2).encode() + b"\n"])
