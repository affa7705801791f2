"""The Tokenizer and Checkpoints pages: the sentences their prose writes around the values hold for those values
(the round trip, the refusal, a failed write leaving the previous checkpoint), and each check can fail."""

import dataclasses

from site_scripts.pages import checkpoints, tokenizer
from transformer.data import CharTokenizer


def test_the_tokenizer_example_round_trips_and_refuses_the_character_its_text_lacks():
    tables, values = tokenizer.char_values()
    assert values["decoded"] == repr(tokenizer.TEXT)  # "gives back ...: the text it started from"
    assert "'?'" in values["refusal"]  # the page's sentence: a character the vocabulary lacks is refused
    tok = CharTokenizer.from_text(tokenizer.TEXT)
    assert tokenizer.refusal(tok, tokenizer.TEXT) == ""  # negative control: a text it can encode raises nothing
    assert tables["vocab"].startswith("| id | 0 |") and len(values["ids"]) == values["chars"]


def test_the_byte_example_has_two_bytes_for_each_accented_letter():
    _, values = tokenizer.byte_values()
    accented = [c for c in tokenizer.UNICODE_TEXT if not c.isascii()]
    assert values["bytes"] == values["chars"] + len(accented)  # "the accented letters take two bytes each"
    assert values["decoded"] == repr(tokenizer.UNICODE_TEXT)


def test_the_checkpoint_loads_bit_for_bit_and_a_changed_array_is_noticed(tmp_path):
    path, ckpt, _ = checkpoints.make(tmp_path)
    _, values = checkpoints.layout(path, ckpt)
    assert values["loaded"] == "pass"
    changed = {k: v.copy() for k, v in ckpt.params.items()}
    changed["head_b"][0] += 1e-12
    assert not checkpoints.same_state(dataclasses.replace(ckpt, params=changed), ckpt)  # negative control


def test_a_write_that_fails_halfway_leaves_the_previous_checkpoint_and_no_temporary_file(tmp_path):
    path, _, state = checkpoints.make(tmp_path)
    before = path.read_bytes()
    found = checkpoints.crash(path, state)
    assert "No space left" in found["message"] and found["files"] == ["checkpoint.npz"]
    assert found["loaded_step"] == checkpoints.STEPS and found["tried_step"] == checkpoints.STEPS + 1
    assert path.read_bytes() == before


def test_every_file_the_page_lists_is_refused(tmp_path):
    path, _, _ = checkpoints.make(tmp_path)
    table = checkpoints.refusals(path)
    assert "loaded without error" not in table
    assert table.count("\n| ") == len(checkpoints.REFUSED)
