"""Model configuration: a frozen dataclass with a reason on each field.

Dimension legend used in every shape comment of the package:
B batch, T time (sequence length), d model width, H heads, dh head width (d/H),
F feed-forward width, n_V vocabulary size, L layers.
"""

import math
import sys
from dataclasses import asdict, dataclass, field, fields, replace

import numpy as np

from .errors import ConfigError, InputError

ACTIVATIONS = ("relu", "gelu", "gelu_tanh")
ATTENTIONS = ("materialized", "flash")


# The largest size a config takes: the flat index of an embedding entry, id * d + j, must fit 64 bits.
MAX_SIZE = 2**31 - 1


def check_size(name, value) -> int:
    """A size of the model as a plain int (a numpy integer becomes one), or a ConfigError naming it: a positive
    integer, at most MAX_SIZE."""
    if not (is_int(value) and value >= 1):
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    if value > MAX_SIZE:
        raise ConfigError(f"{name} must be at most {MAX_SIZE}, got {value!r}: no array that large could be indexed")
    return int(value)


def is_int(value) -> bool:
    """Tell whether value is an integer: a Python int or a numpy integer, and not a bool.

    bool is a subclass of int, so without the exclusion True would pass as 1. numpy's bool is not a
    numpy integer, so it is refused too. This is the one integer check of the package: the configs
    and the sampling settings all use it.

    Parameters
    ----------
    value : object
        Any value.

    Returns
    -------
    bool
        True for 3, np.int64(3); False for True, 3.0, "3".
    """
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def is_finite_number(value) -> bool:
    """Tell whether value is a finite Python int or float (numpy's float64 is one), and not a bool.

    An int too large for a float (10**400) is refused too: the arithmetic it goes into would overflow.

    Parameters
    ----------
    value : object
        Any value.

    Returns
    -------
    bool
        True for 3, 0.5, np.float64(2); False for True, nan, inf, 10**400, "3".
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return math.isfinite(value) if isinstance(value, float) else abs(value) <= sys.float_info.max


def checked_ids(ids, vocab_size) -> np.ndarray:
    """The ids as one flat integer array, refusing any id outside [0, vocab_size): a negative id would
    otherwise index from the end, and a byte id of 300 would wrap to 44."""
    flat = np.asarray(ids).reshape(-1)
    if flat.size == 0:
        return flat.astype(np.int64)
    if flat.dtype.kind not in "iu":
        raise InputError(f"token ids must be integers, got dtype {flat.dtype}")
    bad = flat[(flat < 0) | (flat >= vocab_size)]
    if bad.size:
        raise InputError(f"token ids must lie in [0, {vocab_size}), got {bad[0]}")
    return flat


@dataclass(frozen=True)
class ModelConfig:
    """Sizes and numerics of the model, checked when the config is made.

    Each field's meaning is its `help`, the one place it is written: `python -m transformer train --help`
    and the Configuration page of the site both read it from here.

    Raises
    ------
    ConfigError
        If a value is out of range or not one of the choices.
    """
    vocab_size: int = field(default=65, metadata={
        "help": "n_V: vocabulary size (65, the distinct characters of Tiny Shakespeare); training takes it "
                "from the tokenizer"})
    context_len: int = field(default=32, metadata={"help": "T_max: rows of the position table, the longest input"})
    emb_dim: int = field(default=32, metadata={"help": "d: width of the residual stream"})
    num_heads: int = field(default=4, metadata={"help": "H: attention heads, each of width d/H; must divide emb_dim"})
    num_layers: int = field(default=2, metadata={"help": "L: transformer blocks"})
    ff_dim: int = field(default=128, metadata={"help": "F: hidden width of the feed-forward network (usually 4d)"})
    ln_eps: float = field(default=1e-5, metadata={"help": "added to the variance inside the square root"})
    activation: str = field(default="relu", metadata={
        "help": "feed-forward non-linearity; gelu is the exact one, with erf; gelu_tanh its tanh approximation, "
                "which GPT-2 was trained with", "choices": list(ACTIVATIONS)})
    tied_head: bool = field(default=False, metadata={
        "help": "the output head is the token table's transpose, as in GPT-2: no head_w, and the head's gradient "
                "adds into tok_emb's"})
    head_bias: bool = field(default=True, metadata={"help": "the output head adds a bias head_b (GPT-2's has none)"})
    attention: str = field(default="materialized", metadata={
        "help": "how attention is computed: materialized keeps the (T, T) probabilities for the backward; "
                "flash walks the keys in tiles and keeps two numbers per row (same results, memory linear in T)",
        "choices": list(ATTENTIONS)})
    flash_tile: int = field(default=8, metadata={"help": "keys per tile of flash attention"})
    checkpoint_blocks: bool = field(default=False, metadata={
        "help": "keep only each block's input after the forward and replay the block in the backward "
                "(same gradients, less memory, one more block forward per block)"})

    def __post_init__(self):
        for name in ("vocab_size", "context_len", "emb_dim", "num_heads", "num_layers", "ff_dim", "flash_tile"):
            object.__setattr__(self, name, check_size(name, getattr(self, name)))
        if self.emb_dim % self.num_heads:
            raise ConfigError(
                f"num_heads={self.num_heads} does not divide emb_dim={self.emb_dim}: "
                "each head needs an equal share d/H of the width"
            )
        if not (is_finite_number(self.ln_eps) and self.ln_eps > 0):
            raise ConfigError(f"ln_eps must be a positive finite number, got {self.ln_eps!r}")
        if not (isinstance(self.activation, str) and self.activation in ACTIVATIONS):
            raise ConfigError(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        if not (isinstance(self.attention, str) and self.attention in ATTENTIONS):
            raise ConfigError(f"attention must be one of {ATTENTIONS}, got {self.attention!r}")
        for name in ("tied_head", "head_bias", "checkpoint_blocks"):
            value = getattr(self, name)
            if not isinstance(value, (bool, np.bool_)):
                raise ConfigError(f"{name} must be True or False, got {value!r}")
            object.__setattr__(self, name, bool(value))

    @property
    def head_dim(self) -> int:
        """dh = d / H, the width of one attention head."""
        return self.emb_dim // self.num_heads

    def to_dict(self) -> dict:
        """Return the fields as a plain dictionary.

        Returns
        -------
        dict
            Field name to value; `from_dict` turns it back into a config.
        """
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "ModelConfig":
        """Make a config from a dictionary of fields, such as `to_dict` returns.

        Parameters
        ----------
        values : dict
            Field name to value; fields left out take their defaults.

        Returns
        -------
        ModelConfig
            The validated config.

        Raises
        ------
        ConfigError
            If a key is not a field of ModelConfig, or a value is invalid.
        """
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown model configuration keys: {', '.join(unknown)}")
        return cls(**values)

    def with_(self, **changes) -> "ModelConfig":
        """Return a copy with some fields changed, validated again.

        Parameters
        ----------
        **changes
            New values, by field name.

        Returns
        -------
        ModelConfig
            The changed copy.

        Raises
        ------
        ConfigError
            If the changed config is invalid.
        """
        return replace(self, **changes)


# GPT-2's layout: the tanh GELU, the head tied to the token table, no head bias. Its other choices (learned
# positions, LayerNorm before each sublayer, biases on q, k, v, o and the feed-forward layers, eps 1e-5) are
# this model's own.
GPT2_LAYOUT = {"activation": "gelu_tanh", "tied_head": True, "head_bias": False}

# Named presets. The default is the explained model the pages use; A and B are for benchmarks and the Tiny
# Shakespeare run (see the README); gpt2 is GPT-2 small (124M), and gpt2-tiny a GPT-2-shaped model for tests.
PRESETS = {
    "default": ModelConfig(),
    "A": ModelConfig(vocab_size=65, context_len=64, emb_dim=64, num_heads=4, num_layers=3, ff_dim=256),
    "B": ModelConfig(vocab_size=65, context_len=64, emb_dim=128, num_heads=4, num_layers=4, ff_dim=512),
    "tiny": ModelConfig(vocab_size=5, context_len=4, emb_dim=4, num_heads=2, num_layers=2, ff_dim=6),
    "gpt2": ModelConfig(vocab_size=50257, context_len=1024, emb_dim=768, num_heads=12, num_layers=12, ff_dim=3072,
                        **GPT2_LAYOUT),
    "gpt2-tiny": ModelConfig(vocab_size=11, context_len=8, emb_dim=8, num_heads=2, num_layers=2, ff_dim=32,
                             **GPT2_LAYOUT),
}


def preset(name: str) -> ModelConfig:
    """Look up a named configuration.

    Parameters
    ----------
    name : str
        A key of PRESETS.

    Returns
    -------
    ModelConfig
        The preset's config.

    Raises
    ------
    ConfigError
        If no preset has that name.
    """
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}") from None
