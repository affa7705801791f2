"""Where decoding keeps the keys and values of earlier positions: two strategies behind one interface.

Every block's keys and values of positions 0 to length - 1 never change once written (a position attends
only backwards), so decoding keeps them. A cache offers:

- `reserve(stop)`: make room for positions up to stop - 1 (or raise if there is none);
- `write(layer, start, k, v)`: store block `layer`'s keys and values of positions start, start + 1, ...
  (k and v of shape (H, n, dh));
- `read(layer, stop)`: the keys and values of positions 0 to stop - 1, each (H, stop, dh);
- `release()`: forget everything (and hand back what it holds);
- `length`: how many positions are filled; the decoder sets it once every block is written.

`KVCache` is one contiguous (H, context_len, dh) array per block and per request: simple, and it holds
context_len positions whatever the request's length. `PagedCache` holds a request's positions in
fixed-size pages leased from a `PagePool` shared by all requests; its page table says which physical page
holds which logical one, so a request holds only the pages it has filled, and a finished request's pages
serve the next one.
"""

import numpy as np

from .errors import InputError, TransformerError


class PoolExhausted(TransformerError):
    """Every page of the pool is leased."""


class KVCache:
    """The contiguous strategy: positions 0 to context_len - 1 of every block, in one array each.

    Parameters
    ----------
    cfg : ModelConfig
        Supplies the number of blocks and the array shapes.
    dtype : numpy.dtype
        The dtype of the arrays.

    Attributes
    ----------
    keys : list of ndarray
        `keys[l]` is block l's keys, shape (H, context_len, dh), filled up to `length`.
    values : list of ndarray
        `values[l]` is block l's values, shaped and filled like `keys[l]`.
    length : int
        The number of positions cached.
    """

    def __init__(self, cfg, dtype):
        shape = (cfg.num_heads, cfg.context_len, cfg.head_dim)
        self.keys = [np.zeros(shape, dtype) for _ in range(cfg.num_layers)]
        self.values = [np.zeros(shape, dtype) for _ in range(cfg.num_layers)]
        self.length = 0

    def reserve(self, stop):
        capacity = self.keys[0].shape[1]
        if stop > capacity:
            raise InputError(f"the cache is full ({capacity} positions); slide the window instead")

    def write(self, layer, start, k, v):
        stop = start + k.shape[1]
        self.keys[layer][:, start:stop], self.values[layer][:, start:stop] = k, v  # eq:kv-append

    def read(self, layer, stop):
        return self.keys[layer][:, :stop], self.values[layer][:, :stop]

    def release(self):
        self.length = 0

    @property
    def nbytes(self):
        """Bytes this request's cache holds."""
        return sum(a.nbytes for a in (*self.keys, *self.values))


class PagePool:
    """Physical pages of keys and values for every block, leased to requests one page at a time.

    Parameters
    ----------
    cfg : ModelConfig
        Supplies the number of blocks, H and dh.
    num_pages : int
        Pages in the pool, shared by all requests.
    page_size : int
        Positions per page, S.
    dtype : numpy.dtype
        The dtype of the arrays.

    Attributes
    ----------
    keys, values : list of ndarray
        `keys[l][page]` is one physical page of block l's keys, shape (S, H, dh): position by position, so a
        request's pages laid end to end are its keys in order without moving the heads.
    free : list of int
        The pages not leased, the next to lease last.
    """

    def __init__(self, cfg, num_pages, page_size, dtype):
        for name, value in (("page_size", page_size), ("num_pages", num_pages)):
            if not (isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 1):
                raise InputError(f"{name} must be a positive integer, got {value!r}")
        # One page more than can be leased: the last, never written, stays zeros and pads the shorter
        # requests' page tables when several requests are gathered at once (see `gather`).
        shape = (num_pages + 1, page_size, cfg.num_heads, cfg.head_dim)
        self.keys = [np.zeros(shape, dtype) for _ in range(cfg.num_layers)]
        self.values = [np.zeros(shape, dtype) for _ in range(cfg.num_layers)]
        self.page_size, self.num_pages = int(page_size), int(num_pages)
        self.free = list(range(num_pages - 1, -1, -1))  # lease 0, 1, 2, ... first
        self.blank = num_pages
        self.leased = set()

    @property
    def available(self):
        """Pages a lease can still take."""
        return len(self.free)

    def lease(self):
        """One free page's number; PoolExhausted when none is left."""
        if not self.free:
            raise PoolExhausted(f"all {self.num_pages} pages of {self.page_size} positions are leased")
        page = self.free.pop()
        self.leased.add(page)
        return page

    def give_back(self, page):
        """Return a leased page; returning a page that is not leased is an error, never a silent double free."""
        if page not in self.leased:
            raise ValueError(f"page {page} is not leased: returned twice, or never leased")
        self.leased.remove(page)
        self.free.append(page)

    def pages_for(self, positions):
        """Pages needed to hold this many positions."""
        return -(-positions // self.page_size)

    def table(self, tables, n):
        """The page tables of several requests as one (R, pages) array covering n positions, the shorter
        ones padded with the blank page."""
        pages = self.pages_for(n)
        table = np.full((len(tables), pages), self.blank)
        for r, own in enumerate(tables):
            table[r, :min(pages, len(own))] = own[:pages]  # eq:page-gather
        return table

    def gather(self, table, layer, n):
        """Block `layer`'s keys and values of the requests of a `table`, each laid end to end in its logical
        order: (R, H, n, dh) each. Past a request's own length lie the blank page's zeros (or another page's
        leftovers), which the decoder masks."""
        (R, pages), (S, H, dh) = table.shape, self.keys[layer].shape[1:]
        # One copy, (R, pages, S, H, dh); joining the pages and putting the heads first are views of it.
        keys = self.keys[layer][table].reshape(R, pages * S, H, dh)[:, :n]  # eq:page-gather
        values = self.values[layer][table].reshape(R, pages * S, H, dh)[:, :n]  # eq:page-gather
        return keys.transpose(0, 2, 1, 3), values.transpose(0, 2, 1, 3)

    def scatter(self, slots, layer, k, v):
        """Write one position of each of several requests at once: slots = (pages, offsets), one of each per
        request, k and v of shape (R, H, dh)."""
        pages, offsets = slots
        self.keys[layer][pages, offsets], self.values[layer][pages, offsets] = k, v  # eq:kv-append


class PagedCache:
    """The paged strategy: one request's positions in pages leased from a shared `PagePool`.

    Parameters
    ----------
    pool : PagePool
        Where the pages come from and go back to.
    capacity : int
        The most positions this request may hold (context_len).

    Attributes
    ----------
    pages : list of int
        The page table: `pages[i]` is the physical page holding logical page i, positions i S to (i + 1) S - 1.
    length : int
        The number of positions cached.
    """

    def __init__(self, pool, capacity):
        self.pool, self.capacity = pool, capacity
        self.pages = []
        self.length = 0

    def reserve(self, stop):
        if stop > self.capacity:
            raise InputError(f"the cache is full ({self.capacity} positions); replay the suffix instead")
        while len(self.pages) * self.pool.page_size < stop:
            self.pages.append(self.pool.lease())  # eq:page-lease

    def adopt(self, pages):
        """Start this empty cache with full pages another request filled (transformer/prefix_cache.py): the pool
        shares them, nothing is copied, and the cache's length becomes theirs."""
        if self.pages or self.length:
            raise InputError(f"only an empty cache adopts pages; this one holds {self.length} positions")
        for page in pages:
            self.pool.share(page)
        self.pages, self.length = list(pages), len(pages) * self.pool.page_size

    def slot(self, pos):
        """(physical page, offset in it) of logical position pos."""
        return self.pages[pos // self.pool.page_size], pos % self.pool.page_size  # eq:page-table

    def write(self, layer, start, k, v):
        keys, values = self.pool.keys[layer], self.pool.values[layer]
        done, n = 0, k.shape[1]
        while done < n:  # page by page: the part of k and v that falls in each
            page, offset = self.slot(start + done)
            m = min(self.pool.page_size - offset, n - done)
            keys[page, offset:offset + m] = k[:, done:done + m].transpose(1, 0, 2)  # eq:kv-append
            values[page, offset:offset + m] = v[:, done:done + m].transpose(1, 0, 2)  # eq:kv-append
            done += m

    def read(self, layer, stop):
        keys, values = self.pool.gather(self.pool.table([self.pages], stop), layer, stop)
        return keys[0], values[0]

    def release(self):
        """Hand every page back to the pool (the page table empties first, so a page goes back once), the last
        page first: a prefix cache keeps idle pages in the order they come back and takes back the oldest, so a
        text's later pages go before its first ones, which more texts begin with and without which the later
        ones cannot be found."""
        pages, self.pages, self.length = self.pages, [], 0
        for page in reversed(pages):
            self.pool.give_back(page)

    @property
    def nbytes(self):
        """Bytes of the pool's arrays this request holds: its pages, in every block, keys and values."""
        per_page = sum(a[0].nbytes for a in (*self.pool.keys, *self.pool.values))
        return len(self.pages) * per_page


def one_pool(caches):
    """The pool every cache of the list leases from, or None when they are not all paged from one pool."""
    pool = getattr(caches[0], "pool", None)
    return pool if pool is not None and all(getattr(c, "pool", None) is pool for c in caches) else None


class BatchStep:
    """Several requests' caches seen together for one batched decoding step, request r fed at positions[r]
    (its room already reserved): where each writes, and what each reads, in every block.

    When every cache is paged from one pool, the step works out once where the new positions go (their
    pages and offsets) and the joint page table, and each block then writes and reads all requests in one
    indexing operation each; any other mix of caches is written and read cache by cache.
    """

    def __init__(self, caches, positions):
        self.caches, self.positions = caches, positions
        self.lengths = positions + 1
        self.pool = one_pool(caches)
        if self.pool is not None:
            self.slots = tuple(np.array([c.slot(int(p)) for c, p in zip(caches, positions)]).T)
            self.table = self.pool.table([c.pages for c in caches], int(self.lengths.max()))

    def write(self, layer, k, v):
        """Store block `layer`'s key and value of each request's new position, k and v of shape (R, H, dh)."""
        if self.pool is not None:
            self.pool.scatter(self.slots, layer, k, v)
            return
        for r, (cache, pos) in enumerate(zip(self.caches, self.positions)):
            cache.write(layer, int(pos), k[r][:, None], v[r][:, None])

    def read(self, layer):
        """Block `layer`'s keys and values of every request side by side, (R, H, max(lengths), dh) each,
        request r's positions 0 to lengths[r] - 1 and zeros after them, which the decoder masks.

        The zeros matter: past a request's length its last page holds whatever an earlier request left there,
        and a NaN or an infinity would survive the mask (NaN - inf is NaN, and 0 * inf is NaN)."""
        n = int(self.lengths.max())
        if self.pool is not None:
            keys, values = self.pool.gather(self.table, layer, n)
            past = (np.arange(n) >= self.lengths[:, None])[:, None, :, None]  # (R, 1, n, 1)
            if past.any():  # eq:kv-own
                keys, values = np.where(past, 0, keys), np.where(past, 0, values)
            return keys, values
        if len(self.caches) == 1:  # one contiguous cache: its own arrays, no copy
            keys, values = self.caches[0].read(layer, n)
            return keys[None], values[None]
        first, _ = self.caches[0].read(layer, 1)
        keys = np.zeros((len(self.caches), first.shape[0], n, first.shape[2]), dtype=first.dtype)
        values = np.zeros_like(keys)
        for r, (cache, stop) in enumerate(zip(self.caches, self.lengths)):
            keys[r, :, :stop], values[r, :, :stop] = cache.read(layer, stop)
        return keys, values
