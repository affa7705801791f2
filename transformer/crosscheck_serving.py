"""Cross-check of serving: several requests decoded together over pages, against torch's full forward.

Three requests of different lengths share one pool (pages of 3 positions) and are decoded together by the
`Scheduler`, past the context limit, where each resets its pages and replays its last tokens. Every token
a request draws came from logits over a window of its own text; torch reruns its full causal forward over
exactly that window, and each request's logits of all its steps are compared at once.
"""

import numpy as np

from .crosscheck_rows import compare
from .kv_cache import PagePool
from .scheduler import Request, serve

PAGE_SIZE = 3
SIZES = ((3, 40), (9, 12), (1, 50))  # (prompt length, tokens to add): the first and last cross context_len


def check_paged(device, torch_device, dtype, cfg, params, seed=0):
    """The "paged" rows of one device: one per request, all of its steps' logits."""
    import torch

    from .torch_mirror import to_torch, torch_forward

    rng = np.random.default_rng(seed)
    requests = [Request(rng.integers(0, cfg.vocab_size, n).tolist(), m, seed=seed + i)
                for i, (n, m) in enumerate(SIZES)]
    pool = PagePool(cfg, 3 * -(-cfg.context_len // PAGE_SIZE), PAGE_SIZE, np.float64)
    serve(params, cfg, pool, requests, max_batch=len(requests), keep=cfg.context_len // 2)
    tparams = to_torch(params, torch_device, getattr(torch, dtype), False)
    rows = []
    with torch.no_grad():
        for i, r in enumerate(requests):
            text = r.prompt + r.new
            theirs = torch.stack([torch_forward(tparams, np.array(text[a:b]), cfg)[-1] for a, b in r.windows])
            compare(rows, device, dtype, "paged", f"request {i}: logits of {len(r.windows)} steps, "
                    f"{r.replays} replays", np.stack(r.drawn_from), theirs)
    return rows
