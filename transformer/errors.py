"""Errors the library raises for bad input.

Every error is a ``ValueError`` subclass, so a caller can catch one type, and
the command line can print its message as one line instead of a traceback.
We never use bare ``assert`` for input checks: ``python -O`` removes them.
"""


class TransformerError(ValueError):
    """Base class: the message names the problem and the offending value."""


class ConfigError(TransformerError):
    """A model or training configuration is impossible (e.g. H does not divide d)."""


class InputError(TransformerError):
    """Token ids or targets that the model cannot take (wrong dtype, shape, range)."""


class CorpusError(TransformerError):
    """A corpus file that is missing, empty, too short or not UTF-8."""


class CheckpointError(TransformerError):
    """A checkpoint that is missing, truncated, foreign or does not match."""
