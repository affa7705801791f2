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
        keys[l] is block l's keys, shape (H, context_len, dh), filled up to `length`.
    values : list of ndarray
        values[l] is block l's values, shaped and filled like keys[l].
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
        keys[l][page] is one physical page of block l's keys, shape (H, S, dh).
    free : list of int
        The pages not leased, the next to lease last.
    """

    def __init__(self, cfg, num_pages, page_size, dtype):
        for name, value in (("num_pages", num_pages), ("page_size", page_size)):
            if not (isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 1):
                raise InputError(f"{name} must be a positive integer, got {value!r}")
        shape = (num_pages, cfg.num_heads, page_size, cfg.head_dim)
        self.keys = [np.zeros(shape, dtype) for _ in range(cfg.num_layers)]
        self.values = [np.zeros(shape, dtype) for _ in range(cfg.num_layers)]
        self.page_size, self.num_pages = int(page_size), int(num_pages)
        self.free = list(range(num_pages - 1, -1, -1))  # lease 0, 1, 2, ... first
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
        The page table: pages[i] is the physical page holding logical page i, positions i S to (i + 1) S - 1.
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
        used = self.pages[:self.pool.pages_for(stop)]
        H, S, dh = self.pool.keys[layer].shape[1:]
        # Gather the request's pages in logical order and lay them end to end: (H, pages * S, dh).
        keys = self.pool.keys[layer][used].transpose(1, 0, 2, 3).reshape(H, len(used) * S, dh)  # eq:page-gather
        values = self.pool.values[layer][used].transpose(1, 0, 2, 3).reshape(H, len(used) * S, dh)  # eq:page-gather
        return keys[:, :stop], values[:, :stop]

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
