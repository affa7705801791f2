"""Text in, token ids out: corpus loading, three tokenizers, the split, batches.

A tokenizer turns text into integer ids in [0, n_V) and back:

- CharTokenizer: one id per distinct character of the corpus (n_V = 65 for
  Tiny Shakespeare). The vocabulary is saved with each checkpoint.
- ByteTokenizer: one id per UTF-8 byte, n_V = 256, works for any text.
- GPT2Tokenizer (transformer/bpe.py): GPT-2's byte-level BPE, n_V = 50257.

`speeches` cuts a play script (Tiny Shakespeare's layout) into who says what.
"""

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .bpe import GPT2Tokenizer
from .config import checked_ids
from .errors import CorpusError, InputError

TRAIN_FRACTION = 0.9  # the standard split: first 90% train, last 10% validation


def load_corpus(path) -> str:
    """Read a UTF-8 text file.

    Parameters
    ----------
    path : str or Path
        The corpus file.

    Returns
    -------
    str
        Its text.

    Raises
    ------
    CorpusError
        If the file is missing, a directory, unreadable, empty or not UTF-8; the message says which.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise CorpusError(f"corpus {path} does not exist") from None
    except IsADirectoryError:
        raise CorpusError(f"corpus {path} is a directory, not a text file") from None
    except OSError as e:
        raise CorpusError(f"corpus {path} cannot be read: {e.strerror}") from None
    if not raw:
        raise CorpusError(f"corpus {path} is empty")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CorpusError(
            f"corpus {path} is not UTF-8 text: byte 0x{raw[e.start]:02x} at byte offset {e.start} "
            f"cannot be decoded ({e.reason})"
        ) from None


class CharTokenizer:
    """Character-level tokenizer: the vocabulary is the sorted set of characters seen.

    Parameters
    ----------
    chars : str
        The vocabulary, one character per id.

    Raises
    ------
    InputError
        If chars is empty or repeats a character.
    """

    kind = "char"

    def __init__(self, chars: str):
        if not chars or len(set(chars)) != len(chars):
            raise InputError("a character vocabulary must be non-empty and without repeats")
        self.chars = chars
        self._index = {c: i for i, c in enumerate(chars)}

    @classmethod
    def from_text(cls, text: str) -> "CharTokenizer":
        """Make the tokenizer whose vocabulary is the characters of a text.

        Parameters
        ----------
        text : str
            The corpus.

        Returns
        -------
        CharTokenizer
            The tokenizer, its characters sorted.
        """
        return cls("".join(sorted(set(text))))

    @property
    def vocab_size(self) -> int:
        """n_V, the number of characters in the vocabulary."""
        return len(self.chars)

    def encode(self, text: str) -> np.ndarray:
        """Turn text into token ids, one per character.

        Parameters
        ----------
        text : str
            The text.

        Returns
        -------
        ndarray of shape (n,)
            The int64 ids.

        Raises
        ------
        InputError
            If a character is not in the vocabulary.
        """
        try:
            return np.array([self._index[c] for c in text], dtype=np.int64)
        except KeyError as e:
            c = e.args[0]
            raise InputError(
                f"character {c!r} (U+{ord(c):04X}) is not in this tokenizer's vocabulary "
                f"of {self.vocab_size} characters"
            ) from None

    def decode(self, ids) -> str:
        """Turn token ids back into text.

        Parameters
        ----------
        ids : array_like
            Token ids, of any shape; read in order.

        Returns
        -------
        str
            The text.

        Raises
        ------
        InputError
            If an id is not an integer in [0, vocab_size).
        """
        return "".join(self.chars[i] for i in checked_ids(ids, self.vocab_size))

    def to_dict(self) -> dict:
        """Describe the tokenizer for a checkpoint; `tokenizer_from_dict` rebuilds it.

        Returns
        -------
        dict
            The kind and the vocabulary.
        """
        return {"kind": self.kind, "chars": self.chars}


class ByteTokenizer:
    """Byte-level tokenizer: the UTF-8 bytes of the text, n_V = 256."""

    kind = "byte"
    vocab_size = 256

    def encode(self, text: str) -> np.ndarray:
        """Turn text into token ids, one per UTF-8 byte.

        Text that came from bytes that are not UTF-8 (surrogate escapes) gives back those raw bytes.

        Parameters
        ----------
        text : str
            The text.

        Returns
        -------
        ndarray of shape (n,)
            The int64 ids.
        """
        # surrogateescape gives back the raw bytes of text that came from
        # undecodable bytes (a command-line argument that is not UTF-8).
        return np.frombuffer(text.encode("utf-8", errors="surrogateescape"), dtype=np.uint8).astype(np.int64)

    def decode(self, ids) -> str:
        """Turn byte ids back into text; bytes that are not valid UTF-8 show as U+FFFD.

        Parameters
        ----------
        ids : array_like
            Token ids, of any shape; read in order.

        Returns
        -------
        str
            The text.

        Raises
        ------
        InputError
            If an id is not an integer in [0, 256).
        """
        # A sampled byte sequence need not be valid UTF-8: show U+FFFD there.
        return bytes(checked_ids(ids, self.vocab_size).astype(np.uint8)).decode("utf-8", errors="replace")

    def to_dict(self) -> dict:
        """Describe the tokenizer for a checkpoint; `tokenizer_from_dict` rebuilds it.

        Returns
        -------
        dict
            The kind.
        """
        return {"kind": self.kind}


TOKENIZERS = ("char", "byte", "gpt2")


def make_tokenizer(kind: str, text: str):
    """Make a tokenizer of the given kind for a corpus.

    Parameters
    ----------
    kind : str
        "char", "byte" or "gpt2" (see TOKENIZERS).
    text : str
        The corpus; the character tokenizer takes its vocabulary from it.

    Returns
    -------
    CharTokenizer, ByteTokenizer or GPT2Tokenizer
        The tokenizer.

    Raises
    ------
    InputError
        If the kind is unknown.
    """
    if kind == "char":
        return CharTokenizer.from_text(text)
    if kind == "byte":
        return ByteTokenizer()
    if kind == "gpt2":
        return GPT2Tokenizer()
    raise InputError(f"unknown tokenizer {kind!r}; choose one of {', '.join(TOKENIZERS)}")


def tokenizer_from_dict(d: dict):
    """Rebuild a tokenizer from the description its `to_dict` wrote.

    Parameters
    ----------
    d : dict
        The description.

    Returns
    -------
    CharTokenizer, ByteTokenizer or GPT2Tokenizer
        The tokenizer (GPT-2's read again from its files, see `bpe.find_files`).

    Raises
    ------
    InputError
        If d is not a mapping or does not describe a known tokenizer.
    """
    if not isinstance(d, dict):
        raise InputError(f"a tokenizer description must be a mapping, got {d!r}")
    kind = d.get("kind")
    if kind == "char" and isinstance(d.get("chars"), str):
        return CharTokenizer(d["chars"])
    if kind == "byte":
        return ByteTokenizer()
    if kind == "gpt2":
        return GPT2Tokenizer()
    raise InputError(f"unknown tokenizer description {d!r}")


def min_corpus_tokens(seq_len: int) -> int:
    """Fewest tokens a corpus needs to be split for windows of seq_len tokens.

    With that many, the training split holds one window of seq_len + 1 tokens (the inputs and their
    next-token targets) and the validation split holds two tokens.

    Parameters
    ----------
    seq_len : int
        Tokens per window.

    Returns
    -------
    int
        The smallest usable number of tokens.
    """
    n = seq_len + 3
    while int(n * TRAIN_FRACTION) < seq_len + 1 or n - int(n * TRAIN_FRACTION) < 2:
        n += 1
    return n


def train_val_split(ids: np.ndarray, seq_len: int, source="corpus"):
    """Split token ids: the first 90% for training, the last 10% for validation.

    Parameters
    ----------
    ids : ndarray of shape (n,)
        The corpus as token ids.
    seq_len : int
        Tokens per window.
    source : str
        What the ids came from, for the error message.

    Returns
    -------
    train : ndarray
        The first 90% of the ids.
    val : ndarray
        The last 10%.

    Raises
    ------
    CorpusError
        If there are fewer than `min_corpus_tokens(seq_len)` ids.
    """
    need = min_corpus_tokens(seq_len)
    if len(ids) < need:
        raise CorpusError(
            f"{source} has {len(ids)} tokens; windows of {seq_len} tokens need at least {need} "
            f"(the {TRAIN_FRACTION:.0%} training split must hold {seq_len + 1})"
        )
    cut = int(len(ids) * TRAIN_FRACTION)  # eq:train-split
    return ids[:cut], ids[cut:]  # eq:train-split


def sample_batch(data: np.ndarray, batch_size: int, seq_len: int, rng: np.random.Generator):
    """Draw batch_size random windows and their next-token targets.

    Parameters
    ----------
    data : ndarray of shape (n,)
        Token ids to draw from.
    batch_size : int
        B, the number of windows.
    seq_len : int
        T, tokens per window.
    rng : numpy.random.Generator
        Chooses the window starts.

    Returns
    -------
    x : ndarray of shape (B, T)
        The inputs.
    y : ndarray of shape (B, T)
        The targets: x shifted by one token.
    """
    starts = rng.integers(0, len(data) - seq_len, size=batch_size)  # eq:next-token
    offsets = np.arange(seq_len)
    x = data[starts[:, None] + offsets]  # eq:next-token  (B, T)
    y = data[starts[:, None] + offsets + 1]  # eq:next-token  (B, T) the next token of each input
    return x, y


def eval_windows(data: np.ndarray, seq_len: int):
    """Consecutive windows that cover every token of data once as a target.

    Parameters
    ----------
    data : ndarray of shape (n,)
        Token ids.
    seq_len : int
        Tokens per window.

    Yields
    ------
    x : ndarray
        The inputs of one window: seq_len tokens, except possibly in the last window.
    y : ndarray
        Its targets, x shifted by one token.
    """
    for start in range(0, len(data) - 1, seq_len):
        end = min(start + seq_len, len(data) - 1)
        yield data[start:end], data[start + 1:end + 1]


@dataclass(frozen=True)
class Speech:
    """One speech of a play script.

    Attributes
    ----------
    speaker : str
        The name on the speech's first line, without its colon.
    start : int
        Where the speech begins in the script (its name line), in characters.
    text : str
        The speech as the script writes it: the line "NAME:" and the lines spoken, without the blank line after.
    """
    speaker: str
    start: int
    text: str


BLOCK = re.compile(r"[^\n]+(?:\n[^\n]+)*")  # lines that are not empty, up to the next empty line


def speeches(script: str) -> list:
    """The speeches of a script laid out as Tiny Shakespeare is: a line "NAME:", then the lines spoken, and an
    empty line between speeches.

    A block of lines whose first line does not end in a colon, or with nothing after its name line, is not a
    speech and is left out (the corpus holds a few names with no lines after them).

    Parameters
    ----------
    script : str
        The text.

    Returns
    -------
    list of Speech
        In the order of the script.
    """
    found = []
    for block in BLOCK.finditer(script):
        name, _, spoken = block.group().partition("\n")
        if name.endswith(":") and len(name) > 1 and spoken:
            found.append(Speech(name[:-1], block.start(), block.group()))
    return found
