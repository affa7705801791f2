"""The paged KV cache, batched decoding and the scheduler: the same logits as a full forward pass over each
request's own text, and every page back in the pool at the end, however the run ends.

Decoding computes each position's logits with the same operations as the full forward, grouped
differently (one row at a time, several requests per matmul, keys gathered from pages), so the two agree to
rounding: 1e-12 relative in float64 leaves a margin of 1e3 over the gaps seen (about 1e-15).
"""

import numpy as np
import pytest

import transformer.generate as generate_module
import transformer.scheduler as scheduler_module
from transformer.config import ModelConfig
from transformer.errors import InputError
from transformer.generate import decode_batch, decode_step, extend, generate, prefill
from transformer.kv_cache import KVCache, PagedCache, PagePool, PoolExhausted
from transformer.model import forward, init_params
from transformer.scheduler import Request, Scheduler, serve

EQUAL_REL = 1e-12
CFG = ModelConfig(vocab_size=11, context_len=16, emb_dim=16, num_heads=4, num_layers=2, ff_dim=24)
PAGE_SIZES = (1, 3, 5, CFG.context_len, CFG.context_len + 4)  # a page may be wider than the context


@pytest.fixture(scope="module")
def params():
    return init_params(CFG, seed=0)


def assert_close(ours, reference, what):
    gap = np.abs(ours - reference).max() / np.abs(reference).max()
    assert gap <= EQUAL_REL, f"{what}: relative gap {gap:.2e}"


def requests(seed=0, sizes=((3, 30), (10, 5), (20, 25), (1, 1), (5, 17))):
    """Prompts of different lengths (one longer than the context) and lengths that cross the context."""
    rng = np.random.default_rng(seed)
    return [Request(rng.integers(0, CFG.vocab_size, n).tolist(), m, seed=i) for i, (n, m) in enumerate(sizes)]


def assert_logits_match_full_forward(params, done):
    for r in done:
        text = r.prompt + r.new
        assert len(r.drawn_from) == len(r.windows) == r.num_tokens
        for (start, stop), logits in zip(r.windows, r.drawn_from):
            assert 0 < stop - start <= CFG.context_len
            assert_close(logits, forward(params, np.array(text[start:stop]), CFG)[0][-1], f"{start}:{stop}")


# ------------------------------------------------------------------ the pool and the page table

def test_the_pool_leases_each_page_once_and_refuses_a_double_return():
    pool = PagePool(CFG, 3, 4, np.float64)
    pages = [pool.lease() for _ in range(3)]
    assert sorted(pages) == [0, 1, 2] and not pool.free
    with pytest.raises(PoolExhausted, match="all 3 pages of 4 positions are leased"):
        pool.lease()
    pool.give_back(pages[1])
    with pytest.raises(ValueError, match="page 1 is not leased"):
        pool.give_back(pages[1])
    assert pool.lease() == 1


@pytest.mark.parametrize("num_pages,page_size", [(0, 4), (3, 0), (3, 2.0), (True, 4)])
def test_bad_pool_sizes_are_refused_by_name(num_pages, page_size):
    with pytest.raises(InputError, match="must be a positive integer"):
        PagePool(CFG, num_pages, page_size, np.float64)


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_pages_hold_what_a_contiguous_cache_holds(page_size):
    rng = np.random.default_rng(page_size)
    pool = PagePool(CFG, 40, page_size, np.float64)
    other = PagedCache(pool, CFG.context_len)  # interleaved with the first: their pages alternate
    paged, contiguous = PagedCache(pool, CFG.context_len), KVCache(CFG, np.float64)
    start = 0
    for n in (5, 1, 7, 3):  # writes that start and end inside pages
        k, v = rng.standard_normal((2, CFG.num_heads, n, CFG.head_dim))
        for cache in (paged, contiguous, other):
            cache.reserve(start + n)
            cache.write(0, start, k, v if cache is not other else -v)
        start += n
    for stop in (1, min(page_size, start), start):
        for got, want in zip(paged.read(0, stop), contiguous.read(0, stop)):
            np.testing.assert_array_equal(got, want)
    assert len(paged.pages) == pool.pages_for(start) and not set(paged.pages) & set(other.pages)
    assert paged.slot(start - 1) == (paged.pages[(start - 1) // page_size], (start - 1) % page_size)
    paged.release()
    other.release()
    assert len(pool.free) == pool.num_pages and not paged.pages


def test_a_cache_never_grows_past_the_context():
    pool = PagePool(CFG, 40, 3, np.float64)
    with pytest.raises(InputError, match="the cache is full"):
        PagedCache(pool, CFG.context_len).reserve(CFG.context_len + 1)
    with pytest.raises(InputError, match="the cache is full"):
        KVCache(CFG, np.float64).reserve(CFG.context_len + 1)


# ------------------------------------------------------------------ prefill and batched decoding

@pytest.mark.parametrize("page_size", [*PAGE_SIZES, "contiguous"])
def test_batched_decoding_of_requests_at_different_positions_equals_the_full_forward(params, page_size):
    texts = [[1, 2, 3], [4] * 9, [5, 6], [7, 8, 9, 10, 0, 1, 2]]
    if page_size == "contiguous":
        caches = [KVCache(CFG, np.float64) for _ in texts]
    else:
        pool = PagePool(CFG, 40, page_size, np.float64)
        caches = [PagedCache(pool, CFG.context_len) for _ in texts]
    for text, cache in zip(texts, caches):
        assert_close(prefill(params, text[:-1], cache, CFG), forward(params, np.array(text[:-1]), CFG)[0][-1], "prefill")
    logits = decode_batch(params, [t[-1] for t in texts], caches, CFG)
    for text, row, cache in zip(texts, logits, caches):
        assert cache.length == len(text)
        assert_close(row, forward(params, np.array(text), CFG)[0][-1], f"request {text}")


def test_prefill_is_one_forward_pass_and_no_decode_step(params, monkeypatch):
    calls = []
    real_forward = generate_module.forward
    monkeypatch.setattr(generate_module, "forward", lambda *a, **k: calls.append("forward") or real_forward(*a, **k))
    monkeypatch.setattr(generate_module, "decode_batch", lambda *a: calls.append("decode"))
    prefill(params, list(range(10)), KVCache(CFG, np.float64), CFG)
    assert calls == ["forward"]


def test_prefill_needs_an_empty_cache(params):
    cache = KVCache(CFG, np.float64)
    decode_step(params, 1, cache, CFG)
    with pytest.raises(InputError, match="prefill needs an empty cache"):
        prefill(params, [1, 2], cache, CFG)


# ------------------------------------------------------------------ the scheduler

@pytest.mark.parametrize("max_batch", [1, 4])
@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_every_request_sees_exactly_its_own_text(params, page_size, max_batch):
    pool = PagePool(CFG, 40, page_size, np.float64)
    done = serve(params, CFG, pool, requests(page_size), max_batch=max_batch, keep=8)
    assert_logits_match_full_forward(params, done)
    assert len(pool.free) == pool.num_pages and not pool.leased
    assert sum(r.replays for r in done) > 0  # the context limit was crossed


def test_with_keep_equal_to_the_context_the_tokens_and_logits_are_generates(params):
    done = serve(params, CFG, PagePool(CFG, 40, 3, np.float64), requests(1), max_batch=4, keep=CFG.context_len)
    for r in done:
        new, drawn_from = generate(params, CFG, r.prompt, r.num_tokens, seed=r.seed, return_logits=True)
        assert r.new == new
        for ours, theirs in zip(r.drawn_from, drawn_from, strict=True):
            assert_close(ours, theirs, "against generate")


def test_requests_with_different_sampling_settings_in_one_batch_draw_what_generate_draws(params):
    """The scheduler draws the requests that share temperature and top_k in one pass; two share a
    temperature but not top_k, and one is greedy."""
    settings = [(1.0, None), (1.0, 3), (0, None), (2.0, None), (1.0, 3)]
    batch = requests(2)
    for r, (temperature, top_k) in zip(batch, settings, strict=True):
        r.temperature, r.top_k = temperature, top_k
    done = serve(params, CFG, PagePool(CFG, 40, 3, np.float64), batch, max_batch=5, keep=CFG.context_len)
    for r in done:
        assert r.new == generate(params, CFG, r.prompt, r.num_tokens, r.temperature, r.top_k, seed=r.seed)


@pytest.mark.parametrize("page_size", [3, "contiguous"])
def test_float32_decoding_stays_float32_and_agrees_with_float64(page_size):
    params32 = init_params(CFG, seed=0, dtype=np.float32)
    params64 = {k: v.astype(np.float64) for k, v in params32.items()}
    runs = {}
    for dtype, params in ((np.float32, params32), (np.float64, params64)):
        if page_size == "contiguous":
            caches = [KVCache(CFG, dtype), KVCache(CFG, dtype)]
        else:
            pool = PagePool(CFG, 20, page_size, dtype)
            caches = [PagedCache(pool, CFG.context_len) for _ in range(2)]
        rows = [prefill(params, [1, 2, 3], caches[0], CFG), prefill(params, [4, 5], caches[1], CFG)]
        rows += list(decode_batch(params, [6, 7], caches, CFG))
        runs[dtype] = rows
    assert all(row.dtype == np.float32 for row in runs[np.float32])
    for ours, reference in zip(runs[np.float32], runs[np.float64]):
        assert np.abs(ours - reference).max() <= 1e-5 * np.abs(reference).max()  # float32 rounding, a few layers


def test_a_request_for_no_tokens_takes_nothing_and_gives_every_page_back(params):
    pool = PagePool(CFG, 8, 4, np.float64)
    (r,) = serve(params, CFG, pool, [Request([1, 2, 3], 0)])
    assert r.new == [] and r.windows == [] and len(pool.free) == pool.num_pages


def test_admission_fills_the_batch_as_far_as_the_pool_allows(params):
    """Two requests that hold at most 2 pages each fit a pool of 4 together: the first step runs both."""
    sched = Scheduler(params, CFG, PagePool(CFG, 4, 4, np.float64), max_batch=4)
    for _ in range(2):
        sched.submit(Request([1, 2, 3, 4], 2))
    sched.run()
    assert sched.steps == [2]


def test_a_pool_leased_elsewhere_is_an_error_not_a_wait_forever(params):
    pool = PagePool(CFG, 4, 4, np.float64)
    PagedCache(pool, CFG.context_len).reserve(1)  # one page taken by something else
    sched = Scheduler(params, CFG, pool)
    sched.submit(Request([1, 2, 3], 20))
    with pytest.raises(PoolExhausted, match="needs 4 pages and the pool has 3 free"):
        sched.run()


def test_one_token_per_request_and_a_valid_seed_are_required(params):
    pool = PagePool(CFG, 8, 4, np.float64)
    caches = [PagedCache(pool, CFG.context_len) for _ in range(2)]
    with pytest.raises(InputError, match="got 1 tokens for 2 caches"):
        decode_batch(params, [7], caches, CFG)
    with pytest.raises(InputError, match="seed must be a non-negative integer"):
        Scheduler(params, CFG, pool).submit(Request([1], 2, seed=-1))


def test_a_replay_keeps_exactly_the_last_keep_tokens(params):
    keep = 5
    (r,) = serve(params, CFG, PagePool(CFG, 40, 3, np.float64), [Request([1, 2, 3], 40, seed=0)], keep=keep)
    lengths = [stop - start for start, stop in r.windows]
    # 3 to 16 tokens seen, then 5 to 16 after each of the replays: 14 + 12 + 12 + 2 tokens.
    assert lengths == [*range(3, 17), *range(5, 17), *range(5, 17), 5, 6]
    assert r.replays == 3


def test_requests_wait_for_pages_and_the_batch_refills_as_requests_finish(params):
    pool = PagePool(CFG, 8, 4, np.float64)  # room for two requests of 16 positions at once
    sched = Scheduler(params, CFG, pool, max_batch=3, keep=8)
    batch = requests(2, sizes=((4, 12), (4, 3), (4, 12), (4, 2)))
    for r in batch:
        sched.submit(r)
    sched.run()
    assert_logits_match_full_forward(params, batch)
    assert max(sched.steps) == 2  # the pool, not max_batch, bounded the batch
    # Two steps with both, one with the first alone while the short second request retires, and from
    # the next step on its place is taken by the third.
    assert sched.steps[:4] == [2, 2, 1, 2]
    assert len(pool.free) == pool.num_pages


def test_a_request_that_fails_mid_decode_gives_every_page_back(params, monkeypatch):
    pool = PagePool(CFG, 40, 3, np.float64)
    calls = []

    def failing(*args):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("the device went away")
        return decode_batch(*args)

    monkeypatch.setattr(scheduler_module, "decode_batch", failing)
    with pytest.raises(RuntimeError, match="went away"):
        serve(params, CFG, pool, requests(3), max_batch=4)
    assert len(pool.free) == pool.num_pages and not pool.leased


@pytest.mark.parametrize("kwargs,message", [
    ({"keep": 0}, "keep must be an integer in"), ({"keep": 17}, "keep must be an integer in"),
    ({"max_batch": 0}, "max_batch must be a positive integer"),
])
def test_bad_scheduler_settings_are_refused_by_name(params, kwargs, message):
    with pytest.raises(InputError, match=message):
        Scheduler(params, CFG, PagePool(CFG, 4, 4, np.float64), **kwargs)


def test_a_request_the_pool_could_never_hold_is_refused_at_submission(params):
    sched = Scheduler(params, CFG, PagePool(CFG, 3, 4, np.float64))
    with pytest.raises(InputError, match="needs up to 4 pages of 4 positions; the pool has 3"):
        sched.submit(Request([1, 2, 3], 20))
    sched.submit(Request([1, 2, 3], 10))  # 3 + 9 fed positions: 3 pages, though 13 positions are drawn
    with pytest.raises(InputError, match="non-empty"):
        sched.submit(Request([], 2))


# ------------------------------------------------------------------ isolation between requests

@pytest.mark.parametrize("poison", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("page_size", (1, 3, 5))
def test_poison_left_in_released_pages_reaches_no_other_request(params, page_size, poison):
    """Every page of the pool is filled with NaN or inf, as a request that met a corrupt embedding row leaves
    them, then released: two clean requests batched over those pages decode exactly as on a fresh pool."""
    def decoded(pool):
        caches = [PagedCache(pool, CFG.context_len) for _ in range(2)]
        logits = [prefill(params, p, c, CFG) for p, c in zip(([1, 2, 3, 4, 5, 6, 7], [8, 9]), caches)]
        steps = [decode_batch(params, [3, 4], caches, CFG) for _ in range(4)]
        for cache in caches:
            cache.release()
        return np.concatenate([np.ravel(logits), *map(np.ravel, steps)])

    fresh = decoded(PagePool(CFG, 2 * CFG.context_len, page_size, np.float64))
    pool = PagePool(CFG, 2 * CFG.context_len, page_size, np.float64)
    for array in (*pool.keys, *pool.values):
        array[:pool.num_pages] = poison  # every page that can be leased; the blank one is never written
    assert np.array_equal(decoded(pool), fresh)


# ------------------------------------------------------------------ feeding a prompt in chunks

@pytest.mark.parametrize("page_size", (None, 1, 3, 5))  # None: a contiguous KVCache
@pytest.mark.parametrize("seed", range(4))
def test_a_prompt_fed_in_chunks_gives_prefills_logits_and_cache(params, page_size, seed):
    """Cut a prompt into random chunks and feed each with `extend`: the logits after the last chunk equal one
    prefill's (and the full forward's last row) up to rounding, every cached key and value too, and decoding
    on from either cache gives the same logits."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, CFG.context_len))
    prompt = rng.integers(0, CFG.vocab_size, n).tolist()
    cuts = sorted(rng.choice(np.arange(1, n), size=int(rng.integers(0, min(4, n - 1) + 1)), replace=False).tolist())

    def new_cache():
        if page_size is None:
            return KVCache(CFG, np.float64)
        return PagedCache(PagePool(CFG, 2 * CFG.context_len, page_size, np.float64), CFG.context_len)
    whole, chunked = new_cache(), new_cache()
    expected = prefill(params, prompt, whole, CFG)
    for a, b in zip([0, *cuts], [*cuts, n]):
        logits = extend(params, prompt[a:b], chunked, CFG)
    assert chunked.length == whole.length == n
    assert_close(logits, expected, "after the last chunk")
    assert_close(logits, forward(params, np.array(prompt), CFG)[0][-1], "against the full forward")
    for layer in range(CFG.num_layers):
        for ours, theirs in zip(chunked.read(layer, n), whole.read(layer, n)):
            assert_close(ours, theirs, f"block {layer}'s cache")
    if n < CFG.context_len:
        assert_close(decode_step(params, 1, chunked, CFG), decode_step(params, 1, whole, CFG), "decoding on")


def test_extend_refuses_an_empty_chunk_and_one_past_the_context(params):
    cache = KVCache(CFG, np.float64)
    with pytest.raises(InputError, match="empty"):
        extend(params, [], cache, CFG)
    extend(params, [1] * (CFG.context_len - 1), cache, CFG)
    with pytest.raises(InputError, match=f"2 ids after {CFG.context_len - 1} cached positions pass the context"):
        extend(params, [1, 2], cache, CFG)
    assert cache.length == CFG.context_len - 1
