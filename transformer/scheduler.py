"""Serving several requests at once: continuous batching over a shared pool of KV pages.

A request is a prompt, a number of tokens to add and its sampling settings. The scheduler admits waiting
requests while the pool can hold them, fills each one's pages with one forward pass over its prompt
(`prefill`), and then decodes every running request together, one batched step per token
(`decode_batch`). A request that finishes hands its pages back at once, and the next waiting request takes
its place in the batch: the batch is refilled continuously, not once per wave.

Positions are learned and absolute (the position table has context_len rows). When a request's text
reaches context_len, its cache cannot simply drop the oldest page: every remaining token would move to a
new position. So the request resets its pages and replays the last `keep` tokens from position 0 in one
prefill, then decodes on. `keep = context_len` reproduces `generate` exactly (its sliding window sees the
last context_len tokens every step), at the price of a full forward pass per token once the limit is
reached; a smaller `keep` replays once every context_len - keep + 1 tokens, and after the first replay each
token's logits see at least `keep` tokens.

The pool belongs to the scheduler: pages leased from it by anything else can leave a waiting request with
no way in, which `run` reports instead of waiting forever.
"""

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from .config import is_int
from .errors import InputError
from .generate import check_prompt, check_sampling, decode_batch, extend, prefill, sample_rows
from .kv_cache import PagedCache, PoolExhausted
from .prefix_cache import PrefixPool


@dataclass
class Request:
    """One generation request and, once run, its result.

    Attributes
    ----------
    prompt : list of int
        The prompt's ids.
    num_tokens : int
        How many tokens to add.
    temperature, top_k, seed :
        As `generate` takes them; each request draws from its own generator.
    new : list of int
        The tokens added.
    drawn_from : list of ndarray
        The logits each new token was drawn from.
    windows : list of (int, int)
        For each new token, the span [start, stop) of the request's text its logits saw: a full forward
        over `text[start:stop]` gives the same logits.
    replays : int
        How many times the request reset its pages at the context limit.
    """

    prompt: list
    num_tokens: int
    temperature: float = 1.0
    top_k: int | None = None
    seed: int = 0
    new: list = field(default_factory=list)
    drawn_from: list = field(default_factory=list)
    windows: list = field(default_factory=list)
    replays: int = 0


class Running:
    """A request being decoded: its text so far, its cache, its sampler and the logits of its next token."""

    def __init__(self, request, pool, cfg):
        self.request, self.cfg = request, cfg
        self.ids = list(request.prompt)
        self.cache = PagedCache(pool, cfg.context_len)
        self.rng = np.random.default_rng(request.seed)
        self.start = max(0, len(self.ids) - cfg.context_len)  # the first id the cache holds
        self.logits = None


class Scheduler:
    """Continuous batching of requests over one `PagePool`.

    Parameters
    ----------
    params : dict
        Parameter name to array.
    cfg : ModelConfig
        The model configuration.
    pool : PagePool
        The pages all requests share.
    max_batch : int
        The most requests decoded together.
    keep : int, optional
        Tokens replayed when a request reaches context_len (default context_len // 2; 1 to context_len).
    """

    def __init__(self, params, cfg, pool, max_batch=16, keep=None):
        keep = cfg.context_len // 2 if keep is None else keep
        if not (is_int(keep) and 1 <= keep <= cfg.context_len):
            raise InputError(f"keep must be an integer in [1, {cfg.context_len}], got {keep!r}")
        if not (is_int(max_batch) and max_batch >= 1):
            raise InputError(f"max_batch must be a positive integer, got {max_batch!r}")
        self.params, self.cfg, self.pool = params, cfg, pool
        self.max_batch, self.keep = max_batch, keep
        self.waiting, self.running = deque(), []
        self.steps = []  # the batch size of every decode step, for the pages and the benchmark
        self.prefix = isinstance(pool, PrefixPool)  # requests share the full pages their texts begin with
        self.computed = self.reused = 0  # positions prefilled, and positions a prefix cache gave instead

    def pages_needed(self, request):
        """Pages a request can fill at most: its prompt and every token it draws but the last (which is never
        fed back), and never more than context_len positions."""
        fed = len(request.prompt) + max(request.num_tokens - 1, 0)
        return self.pool.pages_for(min(fed, self.cfg.context_len))

    def submit(self, request):
        """Queue a request, checking it first; a request the whole pool could never hold is refused."""
        check_sampling(request.temperature, request.top_k, self.cfg.vocab_size)
        if not (is_int(request.seed) and request.seed >= 0):
            raise InputError(f"seed must be a non-negative integer, got {request.seed!r}")
        request.prompt = check_prompt(request.prompt, self.cfg)
        if not is_int(request.num_tokens) or request.num_tokens < 0:
            raise InputError(f"number of tokens must be a non-negative integer, got {request.num_tokens!r}")
        if self.pages_needed(request) > self.pool.num_pages:
            raise InputError(f"a request needs up to {self.pages_needed(request)} pages of {self.pool.page_size} "
                             f"positions; the pool has {self.pool.num_pages}")
        self.waiting.append(request)

    def run(self):
        """Decode every submitted request to the end; each Request's results are filled in.

        Whatever happens, every page goes back to the pool: a step that raises releases the pages of
        every running request before the error propagates.
        """
        try:
            while self.waiting or self.running:
                self.admit()
                if not self.running:  # nothing can run, so no page will come back
                    need = self.pages_needed(self.waiting[0])
                    raise PoolExhausted(f"the next request needs {need} pages and the pool has "
                                        f"{self.pool.available} free: pages leased outside the scheduler")
                self.step()
        finally:
            for r in self.running:
                r.cache.release()
            self.running = []

    def admit(self):
        """Start waiting requests, in order, while the batch has room and the pool can promise their pages. With a
        prefix cache, a request adopts the cached full pages its text begins with and computes only the rest (at
        least its last token, whose logits it needs)."""
        promised = sum(self.pages_needed(r.request) - len(r.cache.pages) for r in self.running)
        while self.waiting and len(self.running) < self.max_batch:
            text = self.waiting[0].prompt[-self.cfg.context_len:]
            shared = self.pool.lookup(text[:-1]) if self.prefix else []
            revived = sum(page in self.pool.idle for page in shared) if self.prefix else 0
            need = self.pages_needed(self.waiting[0]) - len(shared) + revived
            if self.pool.available - promised < need:
                break  # it waits for pages to come back
            r = Running(self.waiting.popleft(), self.pool, self.cfg)
            self.running.append(r)
            r.logits = self.fill(r, shared)
            promised += self.pages_needed(r.request) - len(r.cache.pages)  # what it will lease from here on

    def fill(self, r, shared=()):
        """Fill a request's empty cache with its text (the pages in `shared` adopted, the rest computed), name
        its full pages for the prefix cache, and return the logits of its next token."""
        text = r.ids[r.start:]
        r.cache.adopt(shared)
        logits = extend(self.params, text[r.cache.length:], r.cache, self.cfg) if shared else \
            prefill(self.params, text, r.cache, self.cfg)
        self.reused += len(shared) * self.pool.page_size
        self.computed += len(text) - len(shared) * self.pool.page_size
        if self.prefix:
            self.pool.register(r.cache.pages, text)
        return logits

    def step(self):
        """Draw one token for every running request, retire the finished ones, advance the others."""
        alike = {}  # the requests still drawing, by their sampling settings
        for r in self.running:
            if len(r.request.new) < r.request.num_tokens:
                alike.setdefault((r.request.temperature, r.request.top_k), []).append(r)
        for (temperature, top_k), group in alike.items():  # one pass per setting; each row its own generator
            tokens = sample_rows(np.stack([r.logits for r in group]), temperature, top_k, [r.rng for r in group])
            for r, token in zip(group, tokens):
                r.request.drawn_from.append(r.logits)
                r.request.windows.append((r.start, len(r.ids)))
                r.ids.append(token)
                r.request.new.append(token)
        for r in [r for r in self.running if len(r.request.new) == r.request.num_tokens]:
            r.cache.release()
            self.running.remove(r)
        full = [r for r in self.running if r.cache.length == self.cfg.context_len]
        for r in full:  # reset and replay the retained suffix from position 0
            r.cache.release()
            r.start = len(r.ids) - self.keep  # eq:replay-keep
            r.request.replays += 1
            r.logits = self.fill(r)  # eq:replay-keep
        batch = [r for r in self.running if r not in full]
        if batch:
            logits = decode_batch(self.params, [r.ids[-1] for r in batch], [r.cache for r in batch], self.cfg)
            for r, row in zip(batch, logits):
                r.logits = row
            self.steps.append(len(batch))


def serve(params, cfg, pool, requests, max_batch=16, keep=None):
    """Submit the requests, run them together, and return them with their results filled in."""
    scheduler = Scheduler(params, cfg, pool, max_batch, keep)
    for request in requests:
        scheduler.submit(request)
    scheduler.run()
    return requests
