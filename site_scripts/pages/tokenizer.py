"""Generator of the Tokenizer page's fragments."""

from transformer.data import ByteTokenizer, CharTokenizer, make_tokenizer
from transformer.errors import InputError

from .. import sections

TEXT = "To be, or not to be: that is the question."
UNICODE_TEXT = "naïve café"


def example_md():
    tok = CharTokenizer.from_text(TEXT)
    ids = tok.encode(TEXT)
    vocab = [["character", *(f"`{c!r}`" for c in tok.chars)]]
    btok = ByteTokenizer()
    bids = btok.encode(UNICODE_TEXT)
    try:
        tok.encode("To be, or not to be?")
        refusal = "(no error: the example text changed; pick a character it lacks)"
    except InputError as e:
        refusal = f"`InputError: {e}`"
    return "\n".join([
        f"A character tokenizer built from the text `{TEXT!r}` ({len(TEXT)} characters):\n",
        sections.md_table(["id", *map(str, range(tok.vocab_size))], vocab),
        f"V = {tok.vocab_size}. The text encodes to `{ids.tolist()}` (shape {sections.shape_text(ids.shape)}, "
        f"dtype {ids.dtype}), and `decode` gives back `{tok.decode(ids)!r}`"
        + (" exactly.\n" if tok.decode(ids) == TEXT else " — **not** the same text.\n"),
        f"A character the vocabulary lacks is refused with a message, not mapped to some other id: "
        f"encoding `'To be, or not to be?'` raises {refusal}\n",
        f"The byte tokenizer needs no vocabulary (V = {btok.vocab_size}): `{UNICODE_TEXT!r}` has "
        f"{len(UNICODE_TEXT)} characters but {bids.size} UTF-8 bytes, `{bids.tolist()}`; the accented letters take "
        f"two bytes each. It decodes back to `{btok.decode(bids)!r}`.\n",
    ])


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
    return {"symbols": symbols_md(), "example": example_md()}
