"""Generator of the Generation chapter's quiz (site_scripts/pages/_quiz.py): what the KV cache holds after a
prompt, how many keys a decoding step attends to, how many pages a paged cache leases, and what temperature 0
draws, each answer and each wrong choice read from a run of the decoding code (`prefill`, `decode_step`,
`PagedCache`, `sample_next`) on the default or the tiny model."""

import numpy as np

from transformer.config import PRESETS
from transformer.generate import decode_step, prefill, sample_next
from transformer.kv_cache import KVCache, PagedCache, PagePool
from transformer.model import forward, init_params
from transformer.softmax import softmax_forward

from ..sections import page_link
from ._quiz import Choice, Question, page

DEFAULT, TINY = PRESETS["default"], PRESETS["tiny"]
PROMPT = [7, 3, 12, 3, 40]  # five ids of the default model's vocabulary
PAGED_PROMPT, PAGE_SIZE = list(range(10)), 4  # a prompt that fills two pages and part of a third
SAMPLED_IDS, SEEDS = [1, 3, 4], range(20)  # the tiny model's window and the draws of the temperature question


class CountingCache(KVCache):
    """A contiguous cache that notes how many positions each read hands to attention."""

    def __init__(self, cfg, dtype):
        super().__init__(cfg, dtype)
        self.read_lengths = []

    def read(self, layer, stop):
        keys, values = super().read(layer, stop)
        self.read_lengths.append(keys.shape[1])
        return keys, values


def decoded():
    """The default model (seed 0) after `prefill` of PROMPT and one `decode_step` of the token it predicts: the
    cache's length after each, the shape of its key array, and the lengths its reads gave attention."""
    params = init_params(DEFAULT, seed=0)
    cache = CountingCache(DEFAULT, params["tok_emb"].dtype)
    logits = prefill(params, np.array(PROMPT), cache, DEFAULT)
    after_prompt = cache.length
    decode_step(params, int(np.argmax(logits)), cache, DEFAULT)
    return after_prompt, cache.length, cache.keys[0].shape, cache.read_lengths


def prompt_positions():
    """How many positions the cache holds after `prefill`, against the prompt less one, one more, and the rows
    the cache's arrays have room for."""
    n = len(PROMPT)
    after_prompt, after_step, shape, _ = decoded()
    if after_prompt != n:
        raise ValueError(f"prefill of {n} ids left {after_prompt} positions: rewrite this question")
    return Question(
        "quiz-prefill",
        f"`prefill` reads a prompt of {n} ids into an empty `KVCache` of the default model (\\(T_{{\\max}}\\) = "
        f"{DEFAULT.context_len}). How many positions does the cache hold then (`cache.length`)?",
        (Choice(str(after_prompt),
                f"Positions 0 to {n - 1}: the forward over the prompt computes every position's keys and values "
                f"anyway, and prefill writes them all, the last prompt token's included.", right=True),
         Choice(str(n - 1),
                f"The last prompt token is in the cache too: its keys and values are written with the others. What "
                f"is not there yet is the token drawn from the logits prefill returns."),
         Choice(str(n + 1),
                f"The token drawn from prefill's logits enters the cache only when `decode_step` feeds it: then the "
                f"length becomes {after_step}."),
         Choice(str(shape[1]),
                f"That is the room the cache's arrays have, {DEFAULT.context_len} positions (block 0's keys are "
                f"{shape}, \\((H, T_{{\\max}}, d_h)\\)); `length` counts the positions filled.")),
        page_link("quiz_generation", "kvcache", "eq-kv-prefill"), "KV cache: fill the cache with the prompt")


def attended_keys():
    """How many keys the first decoding step's query attends to, read from the lengths the cache gave attention
    in each block, against forgetting the own key, attending to the own key alone, and reading the whole array."""
    after_prompt, after_step, shape, reads = decoded()
    if len(set(reads)) != 1 or len(reads) != DEFAULT.num_layers:
        raise ValueError(f"the blocks read {reads} positions: rewrite this question")
    attended = reads[0]
    return Question(
        "quiz-decode-keys",
        f"After that prompt, `decode_step` feeds the next token, at position {after_prompt}. Over how many keys "
        f"does its query take the softmax, in each block?",
        (Choice(str(attended),
                f"The {after_prompt} cached positions and its own: the new key and value are appended first, then "
                f"the query attends to positions 0 to {after_prompt}. Each of the {DEFAULT.num_layers} blocks read "
                f"{attended} positions from the cache.", right=True),
         Choice(str(after_prompt),
                "Only the cached ones would leave out the token's own key. A position sees itself (the causal "
                "mask's diagonal), so its key is written before attention reads."),
         Choice("1",
                f"Only the new position's query, key and value are computed, but the query attends to every "
                f"cached key as well: {attended} of them."),
         Choice(str(shape[1]),
                f"The cache's arrays have room for {shape[1]} positions, but `read` returns the filled ones only: "
                f"{attended} here. The rest hold zeros, which attention must not see.")),
        page_link("quiz_generation", "kvcache", "eq-kv-attend"), "KV cache: attend from the new position only")


def pages_leased():
    """How many pages a paged cache leases for a prompt, counted after `prefill` into a `PagedCache`, against
    rounding down, a page per position, and a request's whole context."""
    params = init_params(DEFAULT, seed=0)
    pool = PagePool(DEFAULT, -(-DEFAULT.context_len // PAGE_SIZE), PAGE_SIZE, params["tok_emb"].dtype)
    cache = PagedCache(pool, DEFAULT.context_len)
    prefill(params, np.array(PAGED_PROMPT), cache, DEFAULT)
    n, pages = len(PAGED_PROMPT), len(cache.pages)
    whole = pool.pages_for(DEFAULT.context_len)
    return Question(
        "quiz-pages",
        f"A paged cache with pages of \\(S_{{\\mathrm{{page}}}}\\) = {PAGE_SIZE} positions reads a prompt of {n} ids. "
        f"How many pages does it lease?",
        (Choice(str(pages),
                f"\\(\\lceil {n} / {PAGE_SIZE} \\rceil\\) = {pages}: positions 0 to {n - 1} fill "
                f"{n // PAGE_SIZE} pages and {n % PAGE_SIZE} positions of another. The last page's free slots wait "
                f"for the tokens to come.", right=True),
         Choice(str(n // PAGE_SIZE),
                f"Rounding down leaves the last {n % PAGE_SIZE} positions, from position "
                f"{PAGE_SIZE * (n // PAGE_SIZE)} on, without a page. A page partly filled is leased whole."),
         Choice(str(n),
                f"A page holds {PAGE_SIZE} positions, not one: position \\(t\\) lives at offset "
                f"\\(t \\bmod {PAGE_SIZE}\\) of logical page \\(\\lfloor t / {PAGE_SIZE} \\rfloor\\)."),
         Choice(str(whole),
                f"That is the whole context, {DEFAULT.context_len} positions, what a contiguous cache sets aside for "
                f"every request. A paged cache leases pages only as its positions fill, and gives them back when "
                f"the request ends.")),
        page_link("quiz_generation", "kvcache", "eq-page-lease"), "KV cache: lease a page when the table is full")


def temperature_zero():
    """What `sample_next` draws at temperature 0 from the tiny model's next-token logits, over many seeds,
    against an error, a draw from the softmax, and the uniform draw of a very high temperature."""
    params = init_params(TINY, seed=0)
    logits = forward(params, np.array(SAMPLED_IDS), TINY)[0][-1]
    best = int(np.argmax(logits))
    cold = {sample_next(logits, 0, None, np.random.default_rng(s)) for s in SEEDS}
    warm = sorted({sample_next(logits, 1.0, None, np.random.default_rng(s)) for s in SEEDS})
    if cold != {best} or len(warm) < 2:
        raise ValueError(f"temperature 0 drew {cold}, temperature 1 {warm}: rewrite this question")
    hot, _ = softmax_forward(logits / 100.0)
    n_v = TINY.vocab_size
    return Question(
        "quiz-temperature",
        f"The tiny model's next-token logits after the ids `{SAMPLED_IDS}` are "
        f"`{[round(float(z), 3) for z in logits]}`. Which token does `sample_next` draw at temperature "
        f"\\(\\tau\\) = 0?",
        (Choice(f"Token {best}, every time",
                f"The largest logit, {logits[best]:.3f}: temperature 0 is the argmax. With {len(SEEDS)} different "
                f"seeds, every draw was token {best}.", right=True),
         Choice("None: dividing the logits by 0 raises an error",
                f"`sample_rows` checks for \\(\\tau\\) = 0 before it divides and takes the argmax instead: the "
                f"{len(SEEDS)} draws here returned token {best} without an error."),
         Choice("A token drawn from the softmax of the logits, as at \\(\\tau\\) = 1",
                f"That is \\(\\tau\\) = 1: there, the same {len(SEEDS)} seeds drew tokens "
                f"{', '.join(map(str, warm))}. Lowering \\(\\tau\\) sharpens the softmax until, at 0, only the "
                f"largest logit is left."),
         Choice(f"Any of the {n_v} tokens, each with probability 1/{n_v}",
                f"That is the other end: a high temperature flattens the softmax (at \\(\\tau\\) = 100 every "
                f"probability is within {np.abs(hot - 1 / n_v).max():.4f} of 1/{n_v}). A low one sharpens it.")),
        page_link("quiz_generation", "sampling", "eq-sample-temperature"), "Sampling: temperature")


def questions():
    """The quiz's questions, in the order of the chapter's pages."""
    return [prompt_positions(), attended_keys(), pages_leased(), temperature_zero()]


def generate(context):
    return page(questions())
