"""Generator of the Tokenizer page: the values its prose shows (docs/model/tokenizer.md binds them) and its
tables. Both tokenizers run on a short text at build time; the refusal is the real message."""

from transformer.data import ByteTokenizer, CharTokenizer, make_tokenizer
from transformer.errors import InputError

from .. import sections
from ..common import md_table

TEXT = "To be, or not to be: that is the question."
UNICODE_TEXT = "naïve café"
LACKING = "To be, or not to be?"  # a text with a character that TEXT lacks
SHOWN = 13  # characters of TEXT whose ids the alignment table shows


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
    return {"values": {"char": char, "byte": byte}, **char_tables, **byte_tables, "symbols": symbols_md()}
