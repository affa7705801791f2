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


class MaskedRowError(InputError):
    """A softmax row whose every score is -inf: every entry masked, so no probability can be given."""


class NonFiniteError(TransformerError):
    """A training step whose loss, a gradient or an update is not finite; nothing of the step was committed.

    Attributes
    ----------
    name : str
        What was not finite first: "loss", or the name of a parameter.
    """

    def __init__(self, message, name):
        super().__init__(message)
        self.name = name


class RunLockedError(TransformerError):
    """An output folder that another live run is writing into."""
