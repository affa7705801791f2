"""Prefix caching: full pages of keys and values shared between the requests whose texts begin alike.

A page's keys and values depend on every token from the cache's position 0 to the page's last position (each
position's key is computed from a residual stream that attended to all of them), and on nothing else. So a full
page is named by that run of tokens, its key, and any request whose cached text begins with the same run can read
the page instead of computing it again: many requests with one long system prompt hold its pages once.

A shared page is never written: a request writes only positions past its own length, and it adopts full pages
only. Each leased page counts the caches holding it; when the last one lets it go, a page with a key is kept,
idle, with its keys and values, for a later request to find, and is taken back (least recently used first) only
when a lease finds no free page. A pool serves one model: the keys and values are the parameters' as well.
"""

from collections import OrderedDict

from .kv_cache import PagePool, PoolExhausted


class PrefixPool(PagePool):
    """A `PagePool` whose full pages are found by the tokens they hold and shared, counted by reference.

    Attributes
    ----------
    refs : dict
        For each leased page, how many caches hold it.
    index : dict
        Key (the tuple of tokens from position 0 to the page's end) to the page holding those positions.
    idle : OrderedDict
        The pages with a key that no cache holds, least recently released first: taken back when free runs out.
    """

    def __init__(self, cfg, num_pages, page_size, dtype):
        super().__init__(cfg, num_pages, page_size, dtype)
        self.refs, self.index, self.key_of, self.idle = {}, {}, {}, OrderedDict()

    @property
    def available(self):
        """Pages a lease can still take: the free ones and the idle ones it may take back."""
        return len(self.free) + len(self.idle)

    def lease(self):
        """A free page, else the least recently used idle one (forgotten first); PoolExhausted when neither."""
        if not self.free and self.idle:
            page, _ = self.idle.popitem(last=False)
            del self.index[self.key_of.pop(page)]  # eq:prefix-evict
            self.free.append(page)
        try:
            page = super().lease()
        except PoolExhausted:
            raise PoolExhausted(f"all {self.num_pages} pages of {self.page_size} positions are held") from None
        self.refs[page] = 1
        return page

    def give_back(self, page):
        """One cache lets the page go; the last one frees it, or keeps it idle if it has a key."""
        if page not in self.leased:
            raise ValueError(f"page {page} is not leased: returned twice, or never leased")
        self.refs[page] -= 1  # eq:prefix-refs
        if self.refs[page]:
            return
        del self.refs[page]
        self.leased.remove(page)
        if page in self.key_of:
            self.idle[page] = None  # the most recently used end
        else:
            self.free.append(page)

    def share(self, page):
        """One more cache holds the page (an idle one comes back into use)."""
        if page in self.idle:
            del self.idle[page]
            self.leased.add(page)
            self.refs[page] = 0
        self.refs[page] += 1  # eq:prefix-refs

    def lookup(self, tokens):
        """The pages holding the longest run of full pages that `tokens` begins with, in order (not yet shared)."""
        pages, S = [], self.page_size
        for end in range(S, len(tokens) + 1, S):
            page = self.index.get(tuple(tokens[:end]))  # eq:prefix-key
            if page is None:
                break
            pages.append(page)
        return pages

    def register(self, pages, tokens):
        """Name the full pages of a cache holding `tokens` from position 0, so that later requests find them; a
        run of tokens another page already holds keeps that page."""
        S = self.page_size
        for i, page in enumerate(pages[:len(tokens) // S]):
            key = tuple(tokens[:(i + 1) * S])  # eq:prefix-key
            if key not in self.index and page not in self.key_of:
                self.index[key], self.key_of[page] = page, key
