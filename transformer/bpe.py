"""GPT-2's tokenizer: byte-level byte-pair encoding (BPE), written out with the standard library alone.

```text
text  "Hello world"
  1. pre-tokenise     "Hello" | " world"              words: letters, numbers, other symbols, spaces
  2. UTF-8 bytes      H e l l o | ␣ w o r l d          every text is bytes, so no character is unknown
  3. merge by rank    Hello | ␣world                   the pair learned earliest (lowest rank) merges first
  4. look up ids      15496 | 995
```

Its two files come from GPT-2's release (set-up fetches them, pinned by hash; see tools/vendor.py):
`vocab.bpe`, the 50,000 merges in the order they were learned (its line number is a merge's rank), and
`encoder.json`, each token's id. Both write bytes as printable characters (`byte_to_char`), so that a space
is `Ġ` and a newline `Ċ`; this module turns them back into bytes once, at load, and works in bytes.

The pre-tokenising pattern of GPT-2 is a regular expression with Unicode classes (`\\p{L}` letters,
`\\p{N}` numbers) that Python's `re` lacks; `pre_tokenize` follows it character by character with
`unicodedata` instead of depending on the `regex` package. The tests compare it with `regex` and the whole
tokenizer with tiktoken and transformers.
"""

import json
import os
import unicodedata
from pathlib import Path

import numpy as np

from .config import checked_ids
from .errors import InputError

# The contractions GPT-2's pattern splits off first, and the only space that joins the word after it.
CONTRACTIONS = ("'s", "'t", "'re", "'ve", "'m", "'ll", "'d")
# Unicode's White_Space characters: what `\s` matches in GPT-2's pattern.
WHITESPACE = frozenset("\t\n\v\f\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000"
                       + "".join(map(chr, range(0x2000, 0x200B))))
FILES_ENV = "GPT2_TOKENIZER_DIR"  # where encoder.json and vocab.bpe are, if not in data/gpt2 of the project
END_OF_TEXT = "<|endoftext|>"  # the one token of encoder.json that is no byte string: id 50256


def byte_to_char():
    """GPT-2's printable stand-in for each byte: the bytes that print as themselves (! to ~, ¡ to ¬, ® to ÿ)
    keep their character; the other 68 (controls, space, and a few) become chr(256), chr(257), ... in order.

    Returns
    -------
    dict
        Byte (0 to 255) to a one-character string; 256 distinct characters.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + n) for n, b in enumerate(others)}}


def char_class(c):
    """The class of one character in GPT-2's pattern: "space", "letter", "number" or "other"."""
    if c in WHITESPACE:
        return "space"
    return {"L": "letter", "N": "number"}.get(unicodedata.category(c)[0], "other")


def pre_tokenize(text):
    """Split text into GPT-2's words, as its pattern does.

    The pattern `'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+` tries its
    alternatives in order at each position: a contraction; else one optional space and a run of letters, of
    numbers, or of other symbols; else a run of white space that leaves its last character to the word after
    it (which then starts with a space), or the whole run when nothing but white space follows.

    Parameters
    ----------
    text : str

    Returns
    -------
    list of str
        The words; joined, they give back text.
    """
    words, i, n = [], 0, len(text)
    while i < n:
        contraction = next((c for c in CONTRACTIONS if text.startswith(c, i)), None)
        if contraction:
            j = i + len(contraction)
        else:
            start = i + 1 if text[i] == " " and i + 1 < n and char_class(text[i + 1]) != "space" else i
            kind = char_class(text[start])
            j = start + 1
            if kind == "space":  # white space (a space followed by a word was taken into the word above)
                while j < n and char_class(text[j]) == "space":
                    j += 1
                if j < n and j - i > 1:
                    j -= 1  # leave the last one to the word that follows
            else:
                while j < n and char_class(text[j]) == kind:
                    j += 1
        words.append(text[i:j])
        i = j
    return words


def find_files(folder=None):
    """The folder holding encoder.json and vocab.bpe: the argument, else $GPT2_TOKENIZER_DIR, else data/gpt2 in
    the project (where `scripts/setup` puts them)."""
    folder = Path(folder or os.environ.get(FILES_ENV) or Path(__file__).resolve().parents[1] / "data" / "gpt2")
    missing = [name for name in ("encoder.json", "vocab.bpe") if not (folder / name).is_file()]
    if missing:
        raise InputError(f"GPT-2's tokenizer files are not in {folder}: {', '.join(missing)} missing "
                         f"(scripts/setup fetches them, or set {FILES_ENV})")
    return folder


class GPT2Tokenizer:
    """GPT-2's byte-level BPE tokenizer, read from its two files.

    Parameters
    ----------
    folder : str or Path, optional
        Where encoder.json and vocab.bpe are (see `find_files`).

    Raises
    ------
    InputError
        If a file is missing, or the two do not describe the same vocabulary.
    """

    kind = "gpt2"

    def __init__(self, folder=None):
        folder = find_files(folder)
        to_byte = {c: b for b, c in byte_to_char().items()}
        as_bytes = lambda token: bytes(to_byte[c] for c in token)  # noqa: E731
        encoder = json.loads((folder / "encoder.json").read_text(encoding="utf-8"))
        special = {token: i for token, i in encoder.items() if token == END_OF_TEXT}
        self.ids = {as_bytes(token): i for token, i in encoder.items() if token not in special}
        lines = (folder / "vocab.bpe").read_text(encoding="utf-8").splitlines()[1:]  # the first: "#version: 0.2"
        self.ranks = {tuple(map(as_bytes, line.split(" "))): rank for rank, line in enumerate(lines) if line}
        self.tokens = {i: token for token, i in self.ids.items()}
        self.special = special
        self.seen = {}  # word (bytes) -> its ids, filled by word_ids
        merged = {a + b for a, b in self.ranks}
        if len(self.ids) + len(special) != len(encoder) or not merged <= set(self.ids):
            raise InputError(f"{folder}: encoder.json and vocab.bpe do not describe the same vocabulary")

    @property
    def vocab_size(self) -> int:
        """n_V: the byte strings of encoder.json and its special tokens (50,257 for GPT-2's files)."""
        return len(self.ids) + len(self.special)

    def merge_steps(self, word: bytes):
        """BPE on one word, step by step: each step merges every occurrence of the adjacent pair of lowest rank.

        Returns
        -------
        list of (pair, rank, parts)
            The pair merged, its rank (line of vocab.bpe, from 0) and the word's parts after the merge; the
            first entry is (None, None, the single bytes).
        """
        parts = [bytes([b]) for b in word]
        steps = [(None, None, parts)]
        while len(parts) > 1:
            pairs = {(a, b) for a, b in zip(parts, parts[1:])}
            best = min(pairs, key=lambda p: self.ranks.get(p, float("inf")))
            if best not in self.ranks:
                break
            merged, i = [], 0
            while i < len(parts):
                if i + 1 < len(parts) and (parts[i], parts[i + 1]) == best:
                    merged.append(parts[i] + parts[i + 1])
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
            steps.append((best, self.ranks[best], parts))
        return steps

    def word_ids(self, word: bytes) -> tuple:
        """The ids of one pre-tokenised word's bytes after every merge (remembered: words repeat in text)."""
        if word not in self.seen:
            self.seen[word] = tuple(self.ids[part] for part in self.merge_steps(word)[-1][2])
        return self.seen[word]

    def encode(self, text: str) -> np.ndarray:
        """Turn text into GPT-2's token ids.

        A string that holds bytes which were not UTF-8 (Python's surrogate escapes, as a command-line argument
        may) gives those bytes back, so any byte string can be tokenized.

        Returns
        -------
        ndarray of shape (n,)
            The int64 ids.

        Raises
        ------
        InputError
            If text holds a lone surrogate that stands for no byte.
        """
        ids = []
        for word in pre_tokenize(text):
            try:
                ids += self.word_ids(word.encode("utf-8", errors="surrogateescape"))
            except UnicodeEncodeError as e:
                c = e.object[e.start]
                raise InputError(f"character U+{ord(c):04X} is a lone surrogate, which is neither text nor a "
                                 "byte: it cannot be tokenized") from None
        return np.array(ids, dtype=np.int64)

    def decode_bytes(self, ids) -> bytes:
        """The bytes the ids stand for, joined (the special token as its name)."""
        by_id = {**self.tokens, **{i: name.encode() for name, i in self.special.items()}}
        return b"".join(by_id[i] for i in checked_ids(ids, self.vocab_size))

    def decode(self, ids) -> str:
        """Turn ids back into text; bytes that are not valid UTF-8 (a token may end inside a character) show
        as U+FFFD."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def to_dict(self) -> dict:
        """Describe the tokenizer for a checkpoint: its kind (the files are found again where they are)."""
        return {"kind": self.kind}
