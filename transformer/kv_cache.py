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
        `keys[l][page]` is one physical page of block l's keys, shape (H, S, dh).
    free : list of int
        The pages not leased, the next to lease last.
    """

    def __init__(self, cfg, num_pages, page_size, dtype):
        for name, value in (("page_size", page_size), ("num_pages", num_pages)):
            if not (isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 1):
                raise InputError(f"{name} must be a positive integer, got {value!r}")
        # One page more than can be leased: the last, never written, stays zeros and pads the shorter
        # requests' page tables when several requests are gathered at once (see `gather`).
        shape = (num_pages + 1, cfg.num_heads, page_size, cfg.head_dim)
        self.keys = [np.zeros(shape, dtype) for _ in range(cfg.num_layers)]
        self.values = [np.zeros(shape, dtype) for _ in range(cfg.num_layers)]
        self.page_size, self.num_pages = int(page_size), int(num_pages)
        self.free = list(range(num_pages - 1, -1, -1))  # lease 0, 1, 2, ... first
        self.blank = num_pages
        self.leased = set()

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

    def gather(self, tables, layer, n):
        """Block `layer`'s keys and values of several requests at once, each laid end to end in its
        logical order: (R, H, n, dh) each. A request with fewer than n positions is padded with the blank
        page; the decoder masks whatever lies past a request's own length.

        Parameters
        ----------
        tables : sequence of list of int
            Each request's page table.
        layer : int
            The block.
        n : int
            Positions to return, the longest request's length.
        """
        pages = self.pages_for(n)
        table = np.full((len(tables), pages), self.blank)
        for r, own in enumerate(tables):
            table[r, :min(pages, len(own))] = own[:pages]  # eq:page-gather
        R, (H, S, dh) = len(tables), self.keys[layer].shape[1:]
        keys = self.keys[layer][table].transpose(0, 2, 1, 3, 4).reshape(R, H, pages * S, dh)  # eq:page-gather
        values = self.values[layer][table].transpose(0, 2, 1, 3, 4).reshape(R, H, pages * S, dh)  # eq:page-gather
        return keys[:, :, :n], values[:, :, :n]


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

    def slot(self, pos):
        """(physical page, offset in it) of logical position pos."""
        return self.pages[pos // self.pool.page_size], pos % self.pool.page_size  # eq:page-table

    def write(self, layer, start, k, v):
        keys, values = self.pool.keys[layer], self.pool.values[layer]
        done, n = 0, k.shape[1]
        while done < n:  # page by page: the part of k and v that falls in each
            page, offset = self.slot(start + done)
            m = min(self.pool.page_size - offset, n - done)
            keys[page, :, offset:offset + m] = k[:, done:done + m]  # eq:kv-append
            values[page, :, offset:offset + m] = v[:, done:done + m]  # eq:kv-append
            done += m

    def read(self, layer, stop):
        keys, values = self.pool.gather([self.pages], layer, stop)
        return keys[0], values[0]

    def release(self):
        """Hand every page back to the pool (the page table empties first, so a page goes back once)."""
        pages, self.pages, self.length = self.pages, [], 0
        for page in pages:
            self.pool.give_back(page)

    @property
    def nbytes(self):
        """Bytes of the pool's arrays this request holds: its pages, in every block, keys and values."""
        per_page = sum(a[0].nbytes for a in (*self.pool.keys, *self.pool.values))
        return len(self.pages) * per_page


def gather(caches, layer, lengths):
    """Block `layer`'s keys and values of several requests side by side for a batched decoding step:
    request r's positions 0 to `lengths[r] - 1`, padded to the longest, (R, H, max(lengths), dh) each.
    Paged caches of one pool are gathered in one indexing operation; any other mix is read cache by cache
    into zeros. The decoder masks the padding.
    """
    n = int(max(lengths))
    if len(caches) == 1 and not hasattr(caches[0], "pool"):  # one contiguous cache: its own arrays, no copy
        keys, values = caches[0].read(layer, n)
        return keys[None], values[None]
    pool = getattr(caches[0], "pool", None)
    if pool is not None and all(getattr(c, "pool", None) is pool for c in caches):
        return pool.gather([c.pages for c in caches], layer, n)
    first, _ = caches[0].read(layer, 1)
    keys = np.zeros((len(caches), first.shape[0], n, first.shape[2]), dtype=first.dtype)
    values = np.zeros_like(keys)
    for r, (cache, stop) in enumerate(zip(caches, lengths)):
        keys[r, :, :stop], values[r, :, :stop] = cache.read(layer, stop)
    return keys, values
