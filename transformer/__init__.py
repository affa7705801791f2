"""A NumPy reference decoder-only transformer: forward, backward, training."""

from .config import PRESETS, ModelConfig
from .errors import CheckpointError, ConfigError, CorpusError, InputError, TransformerError
from .model import backward, forward, init_params, loss_and_grads, param_count

__all__ = [
    "ModelConfig", "PRESETS", "init_params", "param_count", "forward", "backward",
    "loss_and_grads", "TransformerError", "ConfigError", "InputError", "CorpusError",
    "CheckpointError",
]
