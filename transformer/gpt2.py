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

import numpy as np

from .config import ModelConfig
from .errors import ConfigError
from .model import param_shapes

QKV = ("q", "k", "v")  # the order of c_attn's three column blocks
BLOCK_NAMES = {  # Hugging Face's name within a block: ours (c_attn is split apart, see `block_from_hf`)
    "ln_1.weight": "ln1_g", "ln_1.bias": "ln1_b", "attn.c_proj.weight": "wo", "attn.c_proj.bias": "bo",
    "ln_2.weight": "ln2_g", "ln_2.bias": "ln2_b", "mlp.c_fc.weight": "ff1_w", "mlp.c_fc.bias": "ff1_b",
    "mlp.c_proj.weight": "ff2_w", "mlp.c_proj.bias": "ff2_b"}
TOP_NAMES = {"wte.weight": "tok_emb", "wpe.weight": "pos_emb", "ln_f.weight": "lnf_g", "ln_f.bias": "lnf_b"}
PREFIX = "transformer."


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


def to_hf(params: dict, cfg: ModelConfig, prefix=PREFIX) -> dict:
    """A GPT-2 state dictionary (`from_hf`'s inverse): q, k and v joined into c_attn, lm_head.weight left out
    (tied; `transformers` restores it from wte)."""
    check_gpt2_layout(cfg)
    return {prefix + hf: np.concatenate([params[n] for n in ours], axis=-1) if len(ours) > 1 else params[ours[0]]
            for hf, ours in hf_names(cfg).items()}
