"""GPT-2's tokenizer (transformer/bpe.py) against two implementations nobody here wrote, tiktoken and
transformers' GPT2Tokenizer, both given the same local files: the same ids on the whole of Tiny Shakespeare
and on strings chosen to be awkward, and decode(encode(s)) == s.

The files come from `scripts/setup` (tools/vendor.py, their SHA-256 checked against tiktoken's published
hashes); the tests that need them skip, saying so, where set-up has not been run.
"""

import json
import unicodedata

import numpy as np
import pytest

from transformer.bpe import GPT2Tokenizer, byte_to_char, find_files, pre_tokenize
from transformer.errors import InputError

# tiktoken's published SHA-256 of GPT-2's two files (tiktoken_ext/openai_public.py, gpt2()).
VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"
# GPT-2's pattern as the original encoder.py wrote it (the `regex` package reads \p{L} and \p{N}).
PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
AWKWARD = [
    "", "Hello world", " Hello world", "I'll don't we're they've I'm he'd 'S 's'", "O'Neil's",
    "👍🏽 family 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵",  # emoji, modifiers, zero-width joiners, regional indicators
    "e\u0301 cafe\u0301 café n\u0303 \u0301alone",  # combining marks, composed and not
    "日本語のテキスト、中文。한국어 ไทย",  # CJK and other scripts without spaces
    "\x00\x01\x07\x1b\x1c\x1f\x7f\x80\x9f",  # control characters (\x1c to \x1f are not white space)
    "a   b\n\n\n  c \n\t \r\n   ", "    ", "\n", " ", "x \n", "\t\t\tindented\n",  # runs of white space
    "\u00a0\u2003\u3000x\u2028y\x85z\u200b",  # white space that is not ASCII, and a zero-width space
    "123 4.5 1,000,000 ١٢٣ ½ Ⅻ 2²", "!!?? ...--- (a) [b] {c} <|endoftext|>",
]


@pytest.fixture(scope="module")
def files():
    try:
        return find_files()
    except InputError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def ours(files):
    return GPT2Tokenizer(files)


@pytest.fixture(scope="module")
def tiktoken_encoding(files):
    tiktoken = pytest.importorskip("tiktoken")
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks

    ranks = data_gym_to_mergeable_bpe_ranks(str(files / "vocab.bpe"), str(files / "encoder.json"),
                                            VOCAB_BPE_SHA256, ENCODER_JSON_SHA256)
    # tiktoken's own pattern for GPT-2 (possessive, the same words as PATTERN)
    pattern = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
    return tiktoken.Encoding("gpt2-local", pat_str=pattern, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": 50256})


@pytest.fixture(scope="module")
def hf_tokenizer(files):
    transformers = pytest.importorskip("transformers")
    vocab = json.loads((files / "encoder.json").read_text(encoding="utf-8"))
    merges = [tuple(line.split(" ")) for line in (files / "vocab.bpe").read_text(encoding="utf-8").splitlines()[1:]]
    # split_special_tokens: "<|endoftext|>" in a text is text, as in tiktoken's encode_ordinary and in ours
    return transformers.GPT2Tokenizer(vocab=vocab, merges=merges, split_special_tokens=True)


# ---------------------------------------------------------------- the pieces

def test_each_byte_has_its_own_printable_character_and_the_printable_ones_keep_theirs():
    table = byte_to_char()
    assert sorted(table) == list(range(256)) and len(set(table.values())) == 256
    assert all(table[b] == chr(b) for b in b"!~az09\xa1\xac\xae\xff")
    assert table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ"  # how vocab.bpe writes a space and a newline
    assert all(unicodedata.category(c)[0] in "LNPS" for c in table.values())  # none is a control or a space


@pytest.mark.parametrize("text, words", [
    ("Hello world", ["Hello", " world"]),
    ("I'll  go!\n\n", ["I", "'ll", " ", " go", "!", "\n\n"]),
    ("a \nb", ["a", " ", "\n", "b"]),
    ("x1 22!? 'S", ["x", "1", " 22", "!?", " '", "S"]),
])
def test_pre_tokenize_splits_as_the_pattern_says(text, words):
    assert pre_tokenize(text) == words


def test_pre_tokenize_agrees_with_the_pattern_on_every_assigned_character():
    """Every code point that Python's Unicode tables assign (or reserve for private use), each alone between
    spaces and all of them run together, split by the `regex` package's reading of GPT-2's pattern."""
    regex = pytest.importorskip("regex")
    chars = [chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000 and unicodedata.category(chr(c)) != "Cn"]
    text = " ".join(chars) + "".join(chars) + " \n\n x  "
    assert pre_tokenize(text) == regex.findall(PATTERN, text)


def test_the_files_are_the_ones_tiktoken_publishes_the_hashes_of(files):
    import hashlib

    assert hashlib.sha256((files / "vocab.bpe").read_bytes()).hexdigest() == VOCAB_BPE_SHA256
    assert hashlib.sha256((files / "encoder.json").read_bytes()).hexdigest() == ENCODER_JSON_SHA256


def test_merges_apply_in_rising_rank_and_end_at_the_words_tokens(ours):
    """A pair can only be learned after both its halves exist, so each merge's rank is above the last."""
    for word in (" tokenization", "Shakespeare", " 1234567", "👨‍👩‍👧"):
        steps = ours.merge_steps(word.encode())
        ranks = [rank for _, rank, _ in steps[1:]]
        assert ranks == sorted(ranks) and len(set(ranks)) == len(ranks)
        assert b"".join(steps[-1][2]) == word.encode() and all(p in ours.ids for p in steps[-1][2])


def test_gpt2s_best_known_ids(ours):
    """The ids of "Hello world" and " Hello world" as transformers' GPT-2 documentation shows them."""
    assert ours.encode("Hello world").tolist() == [15496, 995]
    assert ours.encode(" Hello world").tolist() == [18435, 995]
    assert ours.vocab_size == 50257


# ---------------------------------------------------------------- against tiktoken and transformers

def test_the_whole_corpus_gives_tiktokens_and_transformers_ids(ours, tiktoken_encoding, hf_tokenizer, corpus):
    text = corpus.read_text(encoding="utf-8")
    ids = ours.encode(text).tolist()
    assert ids == tiktoken_encoding.encode_ordinary(text)
    assert ids == hf_tokenizer.encode(text)
    assert ours.decode(ids) == text


@pytest.mark.parametrize("text", AWKWARD)
def test_awkward_strings_give_the_same_ids_and_come_back(ours, tiktoken_encoding, hf_tokenizer, text):
    ids = ours.encode(text).tolist()
    assert ids == tiktoken_encoding.encode_ordinary(text)
    assert ids == hf_tokenizer.encode(text)
    assert ours.decode(ids) == text


def test_bytes_that_are_not_utf8_are_tokenized_as_tiktoken_tokenizes_bytes(ours, tiktoken_encoding):
    """Text read with surrogate escapes (bytes that are not UTF-8, as a command-line argument may hold) is
    tokenized as those bytes; tiktoken's byte-level entry point agrees, and the bytes come back exactly."""
    raw = b"ok \xff\xfe then \x80 and \xed\xa0\x80 and \xc3"
    text = raw.decode("utf-8", errors="surrogateescape")
    ids = ours.encode(text)
    assert ids.tolist() == tiktoken_encoding._encode_bytes(raw)
    assert ours.decode_bytes(ids) == raw
    assert "\ufffd" in ours.decode(ids)  # shown as replacement characters, never as surrogates


def test_a_lone_surrogate_that_stands_for_no_byte_is_refused_by_name(ours):
    with pytest.raises(InputError, match=r"U\+D800 is a lone surrogate"):
        ours.encode("a\ud800b")


def test_ids_outside_the_vocabulary_are_refused(ours):
    with pytest.raises(InputError, match=r"token ids must lie in \[0, 50257\), got 50257"):
        ours.decode([1, 50257])
    assert ours.decode(np.array([50256])) == "<|endoftext|>"


# ---------------------------------------------------------------- the files

def test_missing_files_are_named(tmp_path):
    (tmp_path / "encoder.json").write_text("{}")
    with pytest.raises(InputError, match=f"not in {tmp_path}: vocab.bpe missing"):
        GPT2Tokenizer(tmp_path)


def test_files_that_do_not_fit_each_other_are_refused(tmp_path):
    (tmp_path / "encoder.json").write_text(json.dumps({"a": 0, "b": 1}))
    (tmp_path / "vocab.bpe").write_text("#version: 0.2\na b\n")  # merges into "ab", which has no id
    with pytest.raises(InputError, match="do not describe the same vocabulary"):
        GPT2Tokenizer(tmp_path)
