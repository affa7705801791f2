"""Serving several requests at once: continuous batching over a shared pool of KV pages.

A request is a prompt, a number of tokens to add and its sampling settings. Each step of the scheduler feeds every
running request the ids it has not fed yet, draws a token for every request whose text is all fed, and retires
the finished ones, whose pages go back to the pool at once so that the next waiting request can take their place:
the batch is refilled continuously, not once per wave. A request's first feed is its prompt (`prefill`, or
`extend` after cached pages); every later feed is the one token it drew, and the decoding requests are fed
together in one batched step (`decode_batch`).

Two policies bound what a step does:

- the budget: at most `budget` ids fed per step. Decoding requests come first, one id each; a prompt takes what is
  left, so a long one is fed in chunks over several steps while the others decode (chunked prefill).
- preemption: without it a request is admitted only when the pool can promise every page it may ever fill. With it,
  a request is admitted when the pool holds the pages of its text; when a later step finds the pool short,
  the youngest running request gives all its pages back and waits at the head of the queue, to be fed its whole
  text again when pages come back.

Positions are learned and absolute (the position table has context_len rows). When a request's text reaches
context_len, its cache cannot simply drop the oldest page: every remaining token would move to a new position. So
the request resets its pages and replays its last `keep` tokens from position 0, then decodes on. `keep =
context_len` reproduces `generate` exactly (its sliding window sees the last context_len tokens every step), at
the price of a full forward pass per token once the limit is reached; a smaller `keep` replays once every
context_len - keep + 1 tokens, and after the first replay each token's logits see at least `keep` tokens.

The pool belongs to the scheduler: pages leased from it by anything else can leave a waiting request with no way
in, which `run` reports instead of waiting forever.
"""

import itertools
import math
import time
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
    drawn_at : list of int
        For each new token, the scheduler's step that drew it (an index into `Scheduler.times`).
    replays : int
        How many times the request reset its pages at the context limit.
    preemptions : int
        How many times it gave its pages back to make room for older requests.
    """

    prompt: list
    num_tokens: int
    temperature: float = 1.0
    top_k: int | None = None
    seed: int = 0
    new: list = field(default_factory=list)
    drawn_from: list = field(default_factory=list)
    windows: list = field(default_factory=list)
    drawn_at: list = field(default_factory=list)
    replays: int = 0
    preemptions: int = 0


class Running:
    """A submitted request as the scheduler holds it: its text so far, its cache, its sampler, where it stands."""

    def __init__(self, request, pool, cfg, order):
        self.request, self.order = request, order  # order: lower is older
        self.ids = list(request.prompt)
        self.cache = PagedCache(pool, cfg.context_len)
        self.rng = np.random.default_rng(request.seed)
        self.start = max(0, len(self.ids) - cfg.context_len)  # the first id the cache holds
        self.logits = None  # the logits of its next token, once its whole text is fed
        self.decoding = False  # its cache holds its text but the token it drew last

    @property
    def text(self):
        """The ids its cache holds once fed: from `start` on."""
        return self.ids[self.start:]

    @property
    def unfed(self):
        """How many ids of its text the cache does not hold yet."""
        return len(self.ids) - self.start - self.cache.length

    def restart(self, start):
        """Give every page back; the text from `start` on is fed again from position 0."""
        self.cache.release()
        self.start, self.logits, self.decoding = start, None, False


class Scheduler:
    """Continuous batching of requests over one `PagePool`.

    Parameters
    ----------
    params : dict
        Parameter name to array.
    cfg : ModelConfig
        The model configuration.
    pool : PagePool
        The pages all requests share (a `PrefixPool` shares the pages of common beginnings).
    max_batch : int
        The most requests running together.
    keep : int, optional
        Tokens replayed when a request reaches context_len (default context_len // 2; 1 to context_len).
    budget : int, optional
        The most ids fed in one step, at least max_batch (default: no bound, a prompt is fed whole).
    preempt : bool
        Admit a request when the pages of its text fit, and take pages back from the youngest when the pool runs
        short (default False: admit only when every page a request may fill can be promised).
    """

    def __init__(self, params, cfg, pool, max_batch=16, keep=None, budget=None, preempt=False):
        keep = cfg.context_len // 2 if keep is None else keep
        if not (is_int(keep) and 1 <= keep <= cfg.context_len):
            raise InputError(f"keep must be an integer in [1, {cfg.context_len}], got {keep!r}")
        if not (is_int(max_batch) and max_batch >= 1):
            raise InputError(f"max_batch must be a positive integer, got {max_batch!r}")
        if budget is not None and not (is_int(budget) and budget >= max_batch):
            raise InputError(f"budget must be an integer of at least max_batch = {max_batch} ids per step (every "
                             f"running request may decode in one step), got {budget!r}")
        self.params, self.cfg, self.pool = params, cfg, pool
        self.max_batch, self.keep, self.budget, self.preempt = max_batch, keep, budget, bool(preempt)
        self.waiting, self.running, self.arrivals = deque(), [], itertools.count()
        self.steps = []  # the size of every batched decoding step, for the pages and the benchmark
        self.times = []  # seconds from the start of `run` to the end of each step
        self.prefix = isinstance(pool, PrefixPool)  # requests share the full pages their texts begin with
        self.computed = self.reused = 0  # positions prefilled, and positions a prefix cache gave instead
        self.preempted = 0  # how many times a request gave its pages back to make room
        self.short = 0  # pages the request at the head of the queue lacked, when it could not be admitted
        self.peak = 0  # the most pages leased at once (a shared page counted once)

    def pages_needed(self, request):
        """Pages a request can fill at most: its prompt and every token it draws but the last (which is never
        fed back), and never more than context_len positions."""
        fed = len(request.prompt) + max(request.num_tokens - 1, 0)
        return self.pool.pages_for(min(fed, self.cfg.context_len))

    def submit(self, request):
        """Queue a request, checking it first; a request the whole pool could never hold is refused, and one for
        no tokens is done at once."""
        check_sampling(request.temperature, request.top_k, self.cfg.vocab_size)
        if not (is_int(request.seed) and request.seed >= 0):
            raise InputError(f"seed must be a non-negative integer, got {request.seed!r}")
        request.prompt = check_prompt(request.prompt, self.cfg)
        if not is_int(request.num_tokens) or request.num_tokens < 0:
            raise InputError(f"number of tokens must be a non-negative integer, got {request.num_tokens!r}")
        if self.pages_needed(request) > self.pool.num_pages:
            raise InputError(f"a request needs up to {self.pages_needed(request)} pages of {self.pool.page_size} "
                             f"positions; the pool has {self.pool.num_pages}")
        if request.num_tokens:
            self.waiting.append(Running(request, self.pool, self.cfg, next(self.arrivals)))

    def run(self):
        """Run steps until every submitted request has its tokens; each Request's results are filled in.

        Whatever happens, every page goes back to the pool: a step that raises releases the pages of
        every running request before the error propagates.
        """
        started = time.perf_counter()
        try:
            while self.waiting or self.running:
                self.step()
                self.times.append(time.perf_counter() - started)
        finally:
            for r in self.running:
                r.cache.release()
            self.running = []

    def step(self):
        """One step: plan the running requests' feeds, admit waiting requests into what is left, feed them all, draw
        a token for every request whose text is all fed, and retire the finished ones."""
        feeds, leases, gone = self.plan()
        self.admit(feeds, leases, gone)  # feeds each request it admits
        if not self.running and not gone:  # nothing can run, so no page will come back
            raise PoolExhausted(f"the next request needs {self.short} pages and the pool has "
                                f"{self.pool.available} free: pages leased outside the scheduler")
        self.feed(feeds)
        self.draw()
        self.retire()

    def plan(self):
        """The ids each running request is fed this step, oldest first: one for a decoding request; for one that is
        still being prefilled, as many of its unfed ids as the budget leaves after the decoding ones. With
        preemption, while the pool cannot hold a request's feed, the youngest running request gives its pages
        back (the request itself, when it is the youngest). Returns the feeds {request: ids}, the pages they will
        lease, and the requests that gave way."""
        budget = (math.inf if self.budget is None else self.budget) - sum(r.decoding for r in self.running)
        feeds, leases, gone = {}, 0, []
        for r in sorted(self.running, key=lambda x: x.order):
            if r not in self.running:  # it gave way to an older request
                continue
            n = 1 if r.decoding else min(r.unfed, budget)  # eq:chunk-budget
            need = self.pool.pages_for(r.cache.length + n) - len(r.cache.pages)
            while self.preempt and self.pool.available - leases < need and r in self.running:
                victim = max(self.running, key=lambda x: x.order)  # eq:preempt-youngest
                budget += victim.decoding  # the id set aside for its decoding
                self.give_way(victim)
                gone.append(victim)
            if n and r in self.running:
                budget -= 0 if r.decoding else n
                feeds[r], leases = n, leases + need
        return feeds, leases, gone

    def give_way(self, victim):
        """A running request gives back its pages and waits at the head of the queue, to be fed its whole text again
        (its tokens so far and its generator are kept)."""
        self.running.remove(victim)
        victim.restart(victim.start)
        victim.request.preemptions += 1
        self.preempted += 1
        self.waiting.appendleft(victim)  # older than every request that has not started yet

    def admit(self, feeds, leases, gone=()):
        """Start waiting requests, in order, while the batch has room, the budget has ids left and the pool has
        pages. Without preemption the pool must hold every page each running request and this one may fill, a
        shared page counted by each of its readers (it stays leased while one of them still reads it); with
        preemption, the pages of this request's text, and a request that gave way in this step (in `gone`) waits
        for the next: its pages, or the shared ones it adopts again, could let it back in at once, to give way
        again at the next step. Each is fed its first chunk at once, so that the next one admitted can find its
        pages: with a prefix cache, a request adopts the cached full pages its text begins with and is fed only the
        rest (at least its last id, whose logits it needs)."""
        S = self.pool.page_size
        budget = math.inf if self.budget is None else self.budget - sum(feeds.values())
        held = {page for r in self.running for page in r.cache.pages}
        promised = leases if self.preempt else sum(self.pages_needed(r.request) for r in self.running) - len(held)
        while self.waiting and len(self.running) < self.max_batch and budget > 0 and self.waiting[0] not in gone:
            r = self.waiting[0]
            shared = self.pool.lookup(r.text[:-1]) if self.prefix else []
            revived = sum(page in self.pool.idle for page in shared) if self.prefix else 0
            text_pages = self.pool.pages_for(len(r.text))
            self.short = text_pages - len(shared) + revived if self.preempt else self.pages_needed(r.request)
            if self.pool.available - promised < self.short:  # eq:promise
                break  # it waits for pages to come back
            self.running.append(self.waiting.popleft())
            r.cache.adopt(shared)
            self.reused += len(shared) * S
            n = min(len(r.text) - len(shared) * S, budget)
            self.feed_chunk(r, n)
            budget -= n
            if self.preempt:  # the pages of the rest of its text
                promised += text_pages - len(r.cache.pages)
            else:  # every page it may fill, less those it holds that were not held before
                promised += self.pages_needed(r.request) - len(set(r.cache.pages) - held)
                held |= set(r.cache.pages)

    def feed(self, feeds):
        """Feed each running request its planned ids: the one-id feeds together in one batched decoding step, each
        longer one in one pass over its cache."""
        one = [r for r, n in feeds.items() if n == 1 and r.cache.length]
        if one:
            rows = decode_batch(self.params, [r.text[r.cache.length] for r in one], [r.cache for r in one], self.cfg)
            self.steps.append(len(one))
            for r, logits in zip(one, rows):
                self.computed += 0 if r.decoding else 1
                if r.cache.length % self.pool.page_size == 0:  # this id filled a page
                    self.name_pages(r)
                r.logits = None if r.unfed else logits
        for r, n in feeds.items():
            if r not in one:
                self.feed_chunk(r, n)

    def feed_chunk(self, r, n):
        """Feed a request the next n ids of its text in one pass (`prefill` into an empty cache, `extend` after
        cached positions), name its full pages for the prefix cache, and keep the logits once its text is all in."""
        chunk = r.text[r.cache.length:r.cache.length + n]
        logits = (extend if r.cache.length else prefill)(self.params, chunk, r.cache, self.cfg)
        self.computed += n
        self.name_pages(r)
        r.logits = None if r.unfed else logits

    def name_pages(self, r):
        """With a prefix cache, name a request's full pages by the tokens they hold, whether a prompt or decoding
        filled them, so that a later text beginning with those tokens (a conversation's next turn, say) adopts
        them."""
        if self.prefix:
            self.pool.register(r.cache.pages, r.text[:r.cache.length])

    def draw(self):
        """Draw one token for every request whose text is all fed (one pass per sampling setting; each row its own
        generator), and note it."""
        alike = {}  # the requests drawing, by their sampling settings
        for r in self.running:
            if r.logits is not None:
                alike.setdefault((r.request.temperature, r.request.top_k), []).append(r)
        for (temperature, top_k), group in alike.items():
            tokens = sample_rows(np.stack([r.logits for r in group]), temperature, top_k, [r.rng for r in group])
            for r, token in zip(group, tokens):
                r.request.drawn_from.append(r.logits)
                r.request.windows.append((r.start, len(r.ids)))
                r.request.drawn_at.append(len(self.times))
                r.ids.append(token)
                r.request.new.append(token)
                r.logits, r.decoding = None, True

    def retire(self):
        """Give back the pages of every request that has all its tokens; a request whose cache is full restarts
        from its last `keep` ids (reset and replay)."""
        self.peak = max(self.peak, len(self.pool.leased))
        for r in [r for r in self.running if len(r.request.new) == r.request.num_tokens]:
            r.cache.release()
            self.running.remove(r)
        for r in self.running:
            if r.cache.length == self.cfg.context_len:
                r.restart(len(r.ids) - self.keep)  # eq:replay-keep
                r.request.replays += 1


def serve(params, cfg, pool, requests, max_batch=16, keep=None, budget=None, preempt=False):
    """Submit the requests, run them together, and return them with their results filled in."""
    scheduler = Scheduler(params, cfg, pool, max_batch, keep, budget, preempt)
    for request in requests:
        scheduler.submit(request)
    scheduler.run()
    return requests
