"""Generator of the Tokenizer page: the values its prose shows (docs/model/tokenizer.md binds them) and its
tables. The three tokenizers run on short texts at build time; the refusal is the real message; GPT-2's merges
are the real ones, read from its files."""

from transformer.bpe import CONTRACTIONS, GPT2Tokenizer, byte_to_char, pre_tokenize
from transformer.data import ByteTokenizer, CharTokenizer, make_tokenizer
from transformer.errors import InputError

from .. import sections
from ..common import md_table

TEXT = "To be, or not to be: that is the question."
UNICODE_TEXT = "naïve café"
LACKING = "To be, or not to be?"  # a text with a character that TEXT lacks
SHOWN = 13  # characters of TEXT whose ids the alignment table shows
GPT2_TEXT = "Shall I compare thee to a summer's day?\n  Thou art more lovely"
GPT2_WORD = " Shakespeare"  # merged step by step on the page


def refusal(tok, text):
    """The message `encode` raises for a text with a character the vocabulary lacks ("" if it raises none)."""
    try:
        tok.encode(text)
    except InputError as e:
        return str(e)
    return ""


def char_values():
    tok = CharTokenizer.from_text(TEXT)
    ids = tok.encode(TEXT)
    vocab = md_table(["id", *map(str, range(tok.vocab_size))], [["character", *(f"`{c!r}`" for c in tok.chars)]])
    aligned = md_table(["position", *map(str, range(SHOWN))],
                       [["character", *(f"`{c!r}`" for c in TEXT[:SHOWN])], ["id", *map(str, ids[:SHOWN])]])
    values = {"text": repr(TEXT), "chars": len(TEXT), "vocab_size": tok.vocab_size, "ids": ids.tolist(),
              "shape": ids.shape, "dtype": str(ids.dtype), "decoded": repr(tok.decode(ids)), "shown": SHOWN,
              "lacking": repr(LACKING), "refusal": refusal(tok, LACKING)}
    return {"vocab": vocab, "aligned": aligned}, values


def byte_values():
    tok = ByteTokenizer()
    ids = tok.encode(UNICODE_TEXT)
    rows = [[f"`{c!r}`", " ".join(str(b) for b in c.encode("utf-8"))] for c in UNICODE_TEXT]
    table = md_table(["character", "UTF-8 bytes (ids)"], rows)
    wide = sorted({c for c in UNICODE_TEXT if len(c.encode("utf-8")) > 1})
    values = {"text": repr(UNICODE_TEXT), "chars": len(UNICODE_TEXT), "bytes": ids.size, "ids": ids.tolist(),
              "vocab_size": tok.vocab_size, "decoded": repr(tok.decode(ids)), "wide": " and ".join(map(repr, wide))}
    return {"bytes": table}, values


def shown(part: bytes):
    """A byte string as the page writes it: text, with a space as ␣ and a newline as ⏎."""
    return "`" + part.decode("utf-8", errors="backslashreplace").replace(" ", "␣").replace("\n", "⏎") + "`"


def gpt2_values():
    """GPT-2's tokenizer on a line of verse (its words and their ids), its byte map, and one word merged step by
    step with the rank of each merge."""
    tok, table = GPT2Tokenizer(), byte_to_char()
    words = pre_tokenize(GPT2_TEXT)
    rows = [[shown(w.encode()), " ".join(str(i) for i in tok.word_ids(w.encode()))] for w in words]
    steps = tok.merge_steps(GPT2_WORD.encode())
    merges = [[n, "" if pair is None else " + ".join(map(shown, pair)), "" if rank is None else rank,
               " ".join(map(shown, parts))] for n, (pair, rank, parts) in enumerate(steps)]
    moved = [b for b, c in table.items() if c != chr(b)]
    values = {"text": repr(GPT2_TEXT), "chars": len(GPT2_TEXT), "words": len(words),
              "ids": tok.encode(GPT2_TEXT).tolist(), "line_ids": len(tok.encode(GPT2_TEXT)), "vocab_size": tok.vocab_size, "merges": len(tok.ranks),
              "word": repr(GPT2_WORD), "bytes": len(GPT2_WORD.encode()), "steps": len(steps) - 1,
              "word_ids": list(tok.word_ids(GPT2_WORD.encode())), "moved": len(moved), "kept": 256 - len(moved),
              "space": table[ord(" ")], "newline": table[ord("\n")], "contractions": [f"`{c}`" for c in CONTRACTIONS]}
    tables = {"gpt2_words": md_table(["word", "ids"], rows),
              "gpt2_merges": md_table(["step", "pair merged", "rank", "the word's parts after it"], merges)}
    return tables, values


def symbols_md():
    tok = make_tokenizer("char", TEXT)
    ids = tok.encode(TEXT)
    rows = [
        (r"\text{text}", "text", f"{len(TEXT)} characters"),
        (r"n_V", "tokenizer.vocab_size", f"{tok.vocab_size} (this text)"),
        (r"\mathrm{id}", "ids", ids.shape, "one sequence: the text's ids"),
    ]
    return sections.symbols_md(rows, f"`make_tokenizer('char', {TEXT!r})` and its `encode`")


def generate(context):
    char_tables, char = char_values()
    byte_tables, byte = byte_values()
    gpt2_tables, gpt2 = gpt2_values()
    return {"values": {"char": char, "byte": byte, "gpt2": gpt2}, **char_tables, **byte_tables, **gpt2_tables,
            "symbols": symbols_md()}
