import numpy as np
import pytest

from transformer.data import (ByteTokenizer, CharTokenizer, eval_windows, load_corpus, make_tokenizer,
                              min_corpus_tokens, sample_batch, speeches, tokenizer_from_dict, train_val_split)
from transformer.errors import CorpusError, InputError


def test_char_tokenizer_round_trips_and_sorts_its_vocabulary():
    text = "hello, world\n"
    tok = CharTokenizer.from_text(text)
    assert tok.chars == "".join(sorted(set(text)))
    ids = tok.encode(text)
    assert ids.dtype == np.int64 and ids.min() >= 0 and ids.max() < tok.vocab_size
    assert tok.decode(ids) == text


def test_char_tokenizer_rejects_a_character_it_has_not_seen():
    tok = CharTokenizer.from_text("abc")
    with pytest.raises(InputError, match=r"'z' \(U\+007A\) is not in this tokenizer's vocabulary"):
        tok.encode("abz")


def test_byte_tokenizer_takes_any_text_and_has_256_ids():
    tok = ByteTokenizer()
    text = "naïve café, ∑ 日本"
    ids = tok.encode(text)
    assert tok.vocab_size == 256 and ids.max() < 256
    assert len(ids) == len(text.encode("utf-8"))  # multi-byte characters become several ids
    assert tok.decode(ids) == text


def test_byte_tokenizer_decodes_invalid_utf8_with_replacement_characters():
    assert ByteTokenizer().decode([0x61, 0xFF, 0x62]) == "a\ufffdb"


def test_tokenizers_survive_their_dict_form():
    for tok in (CharTokenizer.from_text("xyz"), ByteTokenizer()):
        again = tokenizer_from_dict(tok.to_dict())
        assert again.kind == tok.kind and again.vocab_size == tok.vocab_size
        assert again.decode(again.encode("zyx")) == "zyx"
    with pytest.raises(InputError, match="unknown tokenizer"):
        make_tokenizer("words", "abc")


def test_split_is_first_90_percent_then_last_10():
    ids = np.arange(1000)
    train, val = train_val_split(ids, seq_len=8)
    assert len(train) == 900 and len(val) == 100
    np.testing.assert_array_equal(np.concatenate([train, val]), ids)
    assert train[-1] == 899 and val[0] == 900


def test_split_refuses_a_corpus_too_short_for_one_window():
    need = min_corpus_tokens(16)
    train, val = train_val_split(np.arange(need), 16)  # exactly enough works
    assert len(train) >= 17 and len(val) >= 2
    with pytest.raises(CorpusError, match=f"has {need - 1} tokens; windows of 16 tokens need at least {need}"):
        train_val_split(np.arange(need - 1), 16)


def test_batches_are_windows_with_targets_shifted_by_one_and_seeded():
    data = np.arange(500) * 3
    x, y = sample_batch(data, 8, 10, np.random.default_rng(0))
    assert x.shape == y.shape == (8, 10)
    np.testing.assert_array_equal(y[:, :-1], x[:, 1:])  # each target is the next input
    np.testing.assert_array_equal(np.diff(x, axis=1), 3)  # contiguous windows of the data
    assert y.max() <= data[-1]
    x2, _ = sample_batch(data, 8, 10, np.random.default_rng(0))
    np.testing.assert_array_equal(x, x2)


def test_eval_windows_predict_every_token_after_the_first_exactly_once():
    data = np.arange(103)
    targets = np.concatenate([y for _, y in eval_windows(data, 10)])
    np.testing.assert_array_equal(targets, data[1:])
    for x, y in eval_windows(data, 10):
        np.testing.assert_array_equal(y, x + 1)


def test_load_corpus_reads_utf8(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("To be, or not — to be", encoding="utf-8")
    assert load_corpus(path) == "To be, or not — to be"


@pytest.mark.parametrize("content, message", [
    (None, "does not exist"),
    (b"", "is empty"),
    (b"good text \xff more", r"not UTF-8 text: byte 0xff at byte offset 10"),
])
def test_load_corpus_names_what_is_wrong(tmp_path, content, message):
    path = tmp_path / "corpus.txt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(CorpusError, match=message):
        load_corpus(path)


def test_load_corpus_refuses_a_directory(tmp_path):
    with pytest.raises(CorpusError, match="is a directory"):
        load_corpus(tmp_path)


def test_byte_tokenizer_keeps_undecodable_command_line_bytes():
    """A non-UTF-8 command-line argument arrives with surrogate escapes; its bytes come back."""
    text = b"a\xffb".decode("utf-8", errors="surrogateescape")
    np.testing.assert_array_equal(ByteTokenizer().encode(text), [0x61, 0xFF, 0x62])


def test_speeches_name_their_speaker_and_sit_where_the_script_has_them():
    script = ("First Citizen:\nBefore we proceed,\nhear me speak.\n\nAll:\nSpeak, speak.\n\n"
              "TITUS:\n\n\nEnter MARCIUS\nwith soldiers\n\nFirst Citizen:\nYou are all resolved.\n")
    found = speeches(script)
    assert [s.speaker for s in found] == ["First Citizen", "All", "First Citizen"]
    assert found[0].text == "First Citizen:\nBefore we proceed,\nhear me speak."
    assert found[2].text == "First Citizen:\nYou are all resolved."
    for s in found:
        assert script[s.start:s.start + len(s.text)] == s.text
    # A name with no lines after it, and a block whose first line is no name, are not speeches.
    assert not any(s.speaker == "TITUS" or "Enter" in s.text for s in found)
