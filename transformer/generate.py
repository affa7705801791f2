"""Generation: sampling the next token, and incremental decoding with a
key/value cache (transformer/kv_cache.py).

Without a cache, producing token t+1 reruns the model over all t tokens. But
the keys and values of earlier positions never change (a position only
attends backwards), so we keep them: each new token computes its own q, k, v,
appends k and v to the cache, and attends over everything cached.

The position table has context_len rows. Once the text is longer, we slide a
window over the last context_len tokens; every position in it moves, so the
cache no longer applies and each step reruns the full window.
"""

import math

import numpy as np

from .activations import ACTIVATION_FUNCTIONS
from .block import block_params
from .config import is_int
from .errors import InputError
from .kv_cache import BatchStep, KVCache
from .layernorm import layer_norm_forward
from .linear import linear_forward
from .model import check_ids, check_params, forward, head_weights
from .softmax import softmax_forward


def decode_step(params, token, cache, cfg):
    """Feed one token at position cache.length and return its next-token logits.

    The token's keys and values are appended to the cache. It is `decode_batch` for one request.

    Parameters
    ----------
    params : dict
        Parameter name to array.
    token : int
        The token id.
    cache : KVCache or PagedCache
        The keys and values of the earlier positions; updated in place.
    cfg : ModelConfig
        The model configuration.

    Returns
    -------
    ndarray of shape (n_V,)
        The logits of the next token.

    Raises
    ------
    InputError
        If the cache is full (context_len positions) or the token is not a valid id.
    """
    return decode_batch(params, [token], [cache], cfg)[0]


def decode_batch(params, tokens, caches, cfg):
    """Feed one token to each of R requests at once, token r at position `caches[r].length`.

    The requests may be at different positions. They share every matmul; in attention each query sees
    only its own request's cached keys: the keys of all requests are laid side by side, padded to the
    longest, and the padding is masked out.

    Parameters
    ----------
    params : dict
        Parameter name to array.
    tokens : sequence of int
        One token id per request.
    caches : sequence of KVCache or PagedCache
        Each request's cache; each is updated in place.
    cfg : ModelConfig
        The model configuration.

    Returns
    -------
    ndarray of shape (R, n_V)
        Each request's next-token logits.

    Raises
    ------
    InputError
        If a cache is full or a token is not a valid id.
    PoolExhausted
        If a paged cache needs a page and the pool has none.
    """
    if len(tokens) != len(caches) or not caches:
        raise InputError(f"got {len(tokens)} tokens for {len(caches)} caches: one token per request")
    check_ids(np.asarray(tokens).reshape(-1, 1), cfg, what="token")
    positions = np.array([cache.length for cache in caches])
    for r, (cache, pos) in enumerate(zip(caches, positions)):
        if pos >= cfg.context_len:
            which = f"request {r}'s cache" if len(caches) > 1 else "the cache"
            raise InputError(f"{which} is full ({cfg.context_len} positions); slide the window instead")
        cache.reserve(pos + 1)
    step = BatchStep(caches, positions)  # where each request writes and what it reads, worked out once
    lengths = positions + 1
    longest = int(lengths.max())
    # Request r attends to its own positions 0 .. lengths[r] - 1 and to nothing past them.
    dtype = params["tok_emb"].dtype  # the mask must not promote float32 scores to float64
    own = np.where(np.arange(longest) < lengths[:, None], 0.0, -np.inf).astype(dtype)[:, None, None, :]  # eq:kv-own  (R, 1, 1, n)
    x = params["tok_emb"][np.asarray(tokens)] + params["pos_emb"][positions]  # (R, d)
    for layer in range(cfg.num_layers):
        x = decode_block(x, block_params(params, layer), layer, step, own, cfg)
    for cache, pos in zip(caches, positions):
        cache.length = int(pos) + 1
    x, _ = layer_norm_forward(x, params["lnf_g"], params["lnf_b"], cfg.ln_eps)
    logits, _ = linear_forward(x, *head_weights(params, cfg))
    return logits


def decode_block(x, p, layer, step, own, cfg):
    """One block of a batched decoding step: the new positions' rows through attention over each request's
    cache and through the feed-forward network.

    Parameters
    ----------
    x : ndarray of shape (R, d)
        The residual stream of each request's new position.
    p : dict
        The block's parameters, as `block_params` returns them.
    layer : int
        The block's index, where its keys and values are cached.
    step : BatchStep
        Where each request writes its new key and value, and what it reads.
    own : ndarray of shape (R, 1, 1, n)
        0 at each request's own positions, -inf past them.
    cfg : ModelConfig
        The model configuration.

    Returns
    -------
    ndarray of shape (R, d)
        The residual stream leaving the block.
    """
    R, H, dh = x.shape[0], cfg.num_heads, cfg.head_dim
    a, _ = layer_norm_forward(x, p["ln1_g"], p["ln1_b"], cfg.ln_eps)
    q, _ = linear_forward(a, p["wq"], p["bq"])  # eq:kv-project
    k, _ = linear_forward(a, p["wk"], p["bk"])  # eq:kv-project
    v, _ = linear_forward(a, p["wv"], p["bv"])  # eq:kv-project
    step.write(layer, k.reshape(R, H, dh), v.reshape(R, H, dh))
    keys, values = step.read(layer)  # (R, H, n, dh), padded past each request's length
    q = q.reshape(R, H, 1, dh) * (1.0 / math.sqrt(dh))
    scores = q @ keys.transpose(0, 1, 3, 2) + own  # eq:kv-attend  (R, H, 1, n): no causal mask, all are past
    att, _ = softmax_forward(scores)
    heads = (att @ values).reshape(R, H * dh)  # eq:kv-attend  (R, d)
    return block_rest(x, heads, p, cfg)


def block_rest(x, heads, p, cfg):
    """The rest of a block once attention's heads are mixed: their projection added to the stream x, then the
    feed-forward half with its own residual (`decode_block` and `extend_block` share it)."""
    act_forward, _ = ACTIVATION_FUNCTIONS[cfg.activation]
    a, _ = linear_forward(heads, p["wo"], p["bo"])
    x = x + a
    u, _ = layer_norm_forward(x, p["ln2_g"], p["ln2_b"], cfg.ln_eps)
    u, _ = linear_forward(u, p["ff1_w"], p["ff1_b"])
    u, _ = act_forward(u)
    u, _ = linear_forward(u, p["ff2_w"], p["ff2_b"])
    return x + u

def prefill(params, ids, cache, cfg):
    """Run a whole prompt through one forward pass and write its keys and values into an empty cache.

    The training forward already computes every block's keys and values of every position; they sit in
    its attention caches. Prefill copies them into the decoding cache, so a prompt of n tokens costs one
    batched pass instead of n single-token steps.

    Parameters
    ----------
    params : dict
        Parameter name to array.
    ids : sequence of int
        The prompt, at most context_len ids.
    cache : KVCache or PagedCache
        An empty cache (length 0); filled with positions 0 to n - 1.
    cfg : ModelConfig
        The model configuration.

    Returns
    -------
    ndarray of shape (n_V,)
        The logits of the token after the prompt.

    Raises
    ------
    InputError
        If the cache is not empty, or the prompt is empty, too long or holds an invalid id.
    """
    if cache.length:
        raise InputError(f"prefill needs an empty cache; this one holds {cache.length} positions")
    ids = check_ids(np.asarray(ids)[None], cfg, what="prompt ids")  # (1, n)
    cache.reserve(ids.shape[1])
    logits, model_cache = forward(params, ids, cfg.with_(checkpoint_blocks=False))  # eq:kv-prefill
    for layer, block_cache in enumerate(model_cache.block_caches):
        attn = block_cache.attn_cache  # AttentionCache or FlashCache: both hold k and v, (1, H, n, dh)
        cache.write(layer, 0, attn.k[0], attn.v[0])  # eq:kv-prefill
    cache.length = ids.shape[1]
    return logits[0, -1]


def extend(params, ids, cache, cfg):
    """Feed several tokens of one request at once, at positions cache.length onwards: each attends to every cached
    position and, causally, to the ones fed before it in the same call. A prompt fed in pieces, each piece one
    call, fills the cache and gives the logits that one `prefill` of the whole prompt gives, up to rounding; it is
    how a long prompt is fed in chunks, and how a request whose first pages are already cached computes only the
    rest.

    Parameters
    ----------
    params : dict
        Parameter name to array.
    ids : sequence of int
        The tokens to feed, at least one.
    cache : KVCache or PagedCache
        The request's cache; its positions cache.length to cache.length + len(ids) - 1 are written.
    cfg : ModelConfig
        The model configuration.

    Returns
    -------
    ndarray of shape (n_V,)
        The logits of the token after the last one fed.

    Raises
    ------
    InputError
        If ids is empty, holds an invalid id, or would fill the cache past context_len.
    """
    ids = check_ids(np.asarray(ids)[None], cfg, what="ids to extend with")[0]  # (n,)
    start, n = cache.length, len(ids)
    if start + n > cfg.context_len:
        raise InputError(f"{n} ids after {start} cached positions pass the context ({cfg.context_len} positions)")
    cache.reserve(start + n)
    dtype = params["tok_emb"].dtype
    # Query i, at position start + i, sees positions 0 .. start + i: the cache, and the chunk up to itself.
    visible = np.arange(start + n)[None, :] <= (start + np.arange(n))[:, None]
    mask = np.where(visible, 0.0, -np.inf).astype(dtype)  # eq:kv-chunk  (n, start + n)
    x = params["tok_emb"][ids] + params["pos_emb"][start:start + n]  # (n, d)
    for layer in range(cfg.num_layers):
        x = extend_block(x, block_params(params, layer), layer, cache, start, mask, cfg)
    cache.length = start + n
    x, _ = layer_norm_forward(x[-1], params["lnf_g"], params["lnf_b"], cfg.ln_eps)
    logits, _ = linear_forward(x, *head_weights(params, cfg))
    return logits


def extend_block(x, p, layer, cache, start, mask, cfg):
    """One block of `extend`: the chunk's rows x (n, d) through attention over the cache and the chunk, written
    into the cache first, and through the feed-forward network."""
    n, H, dh = x.shape[0], cfg.num_heads, cfg.head_dim
    a, _ = layer_norm_forward(x, p["ln1_g"], p["ln1_b"], cfg.ln_eps)
    q, k, v = (linear_forward(a, p[f"w{m}"], p[f"b{m}"])[0].reshape(n, H, dh).transpose(1, 0, 2) for m in "qkv")
    cache.write(layer, start, k, v)  # (H, n, dh) at positions start .. start + n - 1
    keys, values = cache.read(layer, start + n)  # (H, start + n, dh)
    scores = (q * (1.0 / math.sqrt(dh))) @ keys.transpose(0, 2, 1) + mask  # eq:kv-chunk  (H, n, start + n)
    att, _ = softmax_forward(scores)
    heads = (att @ values).transpose(1, 0, 2).reshape(n, H * dh)  # eq:kv-chunk
    return block_rest(x, heads, p, cfg)


def check_sampling(temperature, top_k, vocab_size):
    """Check the sampling settings.

    Parameters
    ----------
    temperature : float
        Must be a finite number >= 0.
    top_k : int or None
        If given, must be an integer in [1, vocab_size].
    vocab_size : int
        n_V.

    Raises
    ------
    InputError
        If either setting is out of range.
    """
    if isinstance(temperature, (bool, np.bool_)) or not (
            isinstance(temperature, (int, float, np.floating, np.integer)) and math.isfinite(temperature)
            and temperature >= 0):
        raise InputError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if top_k is not None and (not is_int(top_k) or not 1 <= top_k <= vocab_size):
        raise InputError(f"top_k must be an integer in [1, {vocab_size}], got {top_k!r}")


def sample_next(logits, temperature, top_k, rng):
    """Draw one token id from softmax(logits / temperature).

    When top_k is given, only the top_k largest logits can be drawn (tokens tied with the k-th largest
    are kept too). Temperature 0 means the argmax. It is `sample_rows` for one row.

    Parameters
    ----------
    logits : ndarray of shape (n_V,)
        The next-token logits.
    temperature : float
        Divides the logits; 0 picks the argmax.
    top_k : int or None
        Keep only this many of the largest logits; None keeps all.
    rng : numpy.random.Generator
        Draws the token.

    Returns
    -------
    int
        The token id.

    Raises
    ------
    InputError
        If logits is not 1-D, or a logit is NaN or +inf (see `sample_rows`).
    """
    logits = np.asarray(logits)
    if logits.ndim != 1:
        raise InputError(f"sample_next draws from one row of logits, shape (n_V,); got shape {logits.shape}")
    return sample_rows(logits[None], temperature, top_k, [rng])[0]


def sample_rows(logits, temperature, top_k, rngs):
    """Draw one token id from each row of logits, row r with generator rngs[r].

    Every step on the way to the probabilities works row by row, so each row's token is exactly the one
    `sample_next` would draw from that row alone with the same generator: decoding several requests
    together (the scheduler) draws what each would draw on its own, at the cost of one pass over all rows
    instead of one per row.

    Parameters
    ----------
    logits : ndarray of shape (R, n_V)
        One row of next-token logits per request.
    temperature : float
        Divides the logits; 0 picks the argmax.
    top_k : int or None
        Keep only this many of the largest logits of each row; None keeps all.
    rngs : sequence of numpy.random.Generator
        One per row; each draws its row's token.

    Returns
    -------
    list of int
        The token id of each row.

    Raises
    ------
    InputError
        If logits is not 2-D, there is not one generator per row, or a logit is NaN or +inf (a model whose
        output overflowed: no distribution follows from it; -inf is a masked token and is fine).
    MaskedRowError
        If a row has nothing left to draw (every entry -inf); it stops the draw of every row.
    """
    # C order, so that each row's sum runs along contiguous memory exactly as a lone row's does.
    z = np.ascontiguousarray(logits, dtype=np.float64)
    if z.ndim != 2 or len(rngs) != len(z):
        raise InputError(f"sample_rows needs logits of shape (R, n_V) and R generators; got shape {z.shape} "
                         f"and {len(rngs)} generator(s)")
    undrawable = np.isnan(z) | np.isposinf(z)  # left in, a NaN or +inf makes every probability NaN: token 0
    if undrawable.any():
        row, token = (int(i) for i in np.argwhere(undrawable)[0])
        raise InputError(f"the logit of token {token} in row {row} is {z[row, token]}: a token can be drawn only "
                         f"from logits that are finite or -inf (masked); a model that outputs it has diverged")
    if temperature == 0:
        return [int(j) for j in np.argmax(z, axis=-1)]
    # Shift so each row's largest logit is 0 before dividing: then a tiny temperature
    # sends the others to -inf (probability 0) instead of overflowing to inf.
    with np.errstate(over="ignore"):  # overflowing to -inf is the intent: probability 0
        z = (z - z.max(axis=-1, keepdims=True)) / temperature  # eq:sample-temperature
    if top_k is not None and top_k < z.shape[-1]:
        kth_largest = np.partition(z, -top_k, axis=-1)[:, [-top_k]]  # (R, 1)
        z = np.where(z >= kth_largest, z, -np.inf)  # eq:sample-topk
    probs, _ = softmax_forward(z)  # eq:sample-temperature
    # In each row, the first token whose cumulative probability passes a uniform draw: rng.choice(n, p=probs)'s
    # own method, so the same stream gives the same tokens, without choice's checks of p on every token.
    cdf = probs.cumsum(axis=-1)
    cdf /= cdf[:, -1:]
    return [int(row.searchsorted(rng.random(), side="right")) for row, rng in zip(cdf, rngs)]


def generate(params, cfg, prompt_ids, num_tokens, temperature=1.0, top_k=None, seed=0,
             return_logits=False):
    """Continue prompt_ids by num_tokens sampled tokens and return the new ids.

    Parameters
    ----------
    params : dict
        Parameter name to array.
    cfg : ModelConfig
        The model configuration.
    prompt_ids : array_like of shape (n,)
        A non-empty prompt; when it is longer than context_len, the model sees its last context_len ids.
    num_tokens : int
        How many tokens to add, >= 0.
    temperature : float
        See `sample_next`.
    top_k : int or None
        See `sample_next`.
    seed : int
        Seed of the sampler.
    return_logits : bool
        Also return the logits each new token was drawn from (the tests compare them with full
        recomputation).

    Returns
    -------
    new : list of int
        The new token ids.
    drawn_from : list of ndarray
        Only with return_logits=True: the logits each new token was drawn from.

    Raises
    ------
    InputError
        If a sampling setting, num_tokens or the prompt is invalid.
    ConfigError
        If params do not match cfg.
    """
    check_sampling(temperature, top_k, cfg.vocab_size)
    check_params(params, cfg)
    if not is_int(num_tokens) or num_tokens < 0:
        raise InputError(f"number of tokens must be a non-negative integer, got {num_tokens!r}")
    ids = check_prompt(prompt_ids, cfg)
    rng = np.random.default_rng(seed)
    cache = KVCache(cfg, params["tok_emb"].dtype)
    logits = read_prompt(params, ids, cache, cfg)
    new, drawn_from = [], []
    for _ in range(num_tokens):
        drawn_from.append(logits)
        token = sample_next(logits, temperature, top_k, rng)
        ids.append(token)
        new.append(token)
        if cache.length == len(ids) - 1 and cache.length < cfg.context_len:
            logits = decode_step(params, token, cache, cfg)  # the cache still holds every position
        else:  # the window slid: every position moved, recompute the window
            logits = window_logits(params, ids, cfg)
    return (new, drawn_from) if return_logits else new


def check_prompt(prompt_ids, cfg):
    """Check a prompt and return its ids as a list.

    Parameters
    ----------
    prompt_ids : array_like of shape (n,)
        The prompt.
    cfg : ModelConfig
        Supplies n_V (vocab_size).

    Returns
    -------
    list of int
        The ids.

    Raises
    ------
    InputError
        If the prompt is empty, not 1-D, or holds an invalid id (anywhere, also before the window the model sees).
    """
    prompt = np.asarray(prompt_ids)
    if prompt.ndim != 1 or prompt.size == 0:
        raise InputError("the prompt must be a non-empty sequence of token ids")
    check_ids(prompt.reshape(-1, 1), cfg, what="prompt ids")
    return prompt.tolist()


def read_prompt(params, ids, cache: KVCache, cfg):
    """Run the prompt through the model and return the logits of the token after it.

    A prompt that fits the position table fills the cache in one forward pass (`prefill`); a longer one is
    a single forward pass over its last context_len ids, and the cache stays empty.
    """
    if len(ids) > cfg.context_len:
        return window_logits(params, ids, cfg)
    return prefill(params, ids, cache, cfg)


def window_logits(params, ids, cfg):
    """Next-token logits from a full forward pass over the last context_len ids, without the cache."""
    return forward(params, np.array(ids[-cfg.context_len:]), cfg)[0][-1]
