"""Benchmark: what GPT-2 small costs on this machine, measured with random weights (nothing to download).

At the preset `gpt2` (124M parameters), float32, one sequence of the full context (T = 1024):

- per memory policy (tools/memory_policies.POLICIES): the median time of a forward pass and of a whole training
  step (after one untimed call of each) (forward, backward, clipping, AdamW); the step's peak, the most bytes numpy held at once above the
  parameters and the AdamW moments (tracemalloc, as tools/memory_policies measures it); and the bytes the
  forward's cache keeps for the backward;
- per way of decoding (no cache: the whole forward for every token; the contiguous KV cache; the paged one):
  the time to the first new token after a prompt, and new tokens per second after it.

The bytes follow numpy's version, not the machine (up to a few hundred bytes of Python's own objects, which
tracemalloc counts too); the times are this machine's, so run it on a quiet one (the load average is recorded
beside them). The result is kept in the repository, not measured by the build
(several minutes on two cores): `--write` puts it in reports/gpt2-cost.json with the machine, the commit and a
hash of each module of the package it ran, so that the pages that cite it can say which code it measured.

    python -m tools.gpt2_cost [--steps 3] [--write]
"""

import argparse
import json
import os
import platform
import sys
import time

import numpy as np

from transformer.config import PRESETS
from transformer.generate import decode_step, prefill
from transformer.kv_cache import KVCache, PagedCache, PagePool
from transformer.model import forward, init_params, loss_and_grads
from transformer.optim import AdamWConfig, adamw_init, adamw_update, clip_grads

from .bench_kernels import median_seconds
from .common import ROOT, code_text, hash_parts, numpy_version, read_text
from .keyed_report import commit
from .memory_policies import POLICIES, owned_bytes, traced_peak

CONFIG = PRESETS["gpt2"]
T = CONFIG.context_len  # one sequence of the whole context
PROMPT, NEW = 64, 32  # decoding: prompt tokens, then new tokens timed
PAGE = 16  # positions per page of the paged cache
SEED = 0
REPORT = ROOT / "reports" / "gpt2-cost.json"


def measure_policy(policy, steps):
    """Times, step peak and retained bytes of one memory policy at GPT-2 small's size (see the module's text)."""
    cfg = CONFIG.with_(**POLICIES[policy])
    params = init_params(cfg, SEED, np.float32)
    state, opt = adamw_init(params), AdamWConfig()
    rng = np.random.default_rng(SEED)
    ids, targets = rng.integers(0, cfg.vocab_size, (2, 1, T))

    def step():
        _, grads = loss_and_grads(params, ids, targets, cfg)
        adamw_update(params, clip_grads(grads, 1.0)[0], state, opt.lr, opt)

    step_peak = traced_peak(step)
    _, cache = forward(params, ids, cfg)
    retained = owned_bytes(cache, exclude=params.values())
    del cache
    return {"policy": policy, "forward_s": median_seconds(lambda: forward(params, ids, cfg), steps),
            "step_s": median_seconds(step, steps), "step_peak": step_peak, "retained": retained}


def measure_decoding(way, params):
    """Greedy decoding of NEW tokens after a PROMPT-token prompt: seconds to the first new token, then tokens/s."""
    prompt = list(np.random.default_rng(SEED).integers(0, CONFIG.vocab_size, PROMPT))
    if way == "no cache":
        def first():
            return forward(params, np.array([prompt]), CONFIG)[0][0, -1]

        def step(tokens, _):
            return forward(params, np.array([prompt + tokens]), CONFIG)[0][0, -1]
    else:
        cache = KVCache(CONFIG, np.float32) if way == "contiguous" else \
            PagedCache(PagePool(CONFIG, -(-(PROMPT + NEW) // PAGE), PAGE, np.float32), CONFIG.context_len)

        def first():
            return prefill(params, prompt, cache, CONFIG)

        def step(tokens, _):
            return decode_step(params, tokens[-1], cache, CONFIG)
    start = time.perf_counter()
    logits = first()
    first_s = time.perf_counter() - start
    tokens, start = [int(np.argmax(logits))], time.perf_counter()
    while len(tokens) < NEW + 1:
        tokens.append(int(np.argmax(step(tokens, logits))))
    return {"way": way, "first_token_s": first_s, "tokens_per_s": NEW / (time.perf_counter() - start),
            "tokens": tokens}


def machine():
    """The machine and its state, beside the times."""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    except OSError:
        cpu = None
    return {"cpu": cpu or platform.processor(), "cores": os.cpu_count(),
            "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
            "load_before": os.getloadavg()[0], "python": platform.python_version(), "numpy": numpy_version(),
            "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS", "unset")}


def measured_code():
    """{file: hash of its code} of every module of the package this process ran: what the figures measured."""
    files = sorted(m.__file__ for name, m in sys.modules.items()
                   if name.startswith("transformer.") and getattr(m, "__file__", None))
    return {os.path.relpath(f, ROOT): hash_parts(code_text(read_text(f))) for f in files}


def run(steps, log=print):
    report = {"machine": machine(), "config": CONFIG.to_dict(), "batch": 1, "T": T, "prompt": PROMPT,
              "new": NEW, "page_size": PAGE, "steps": steps, "policies": [], "decoding": []}
    for policy in POLICIES:
        report["policies"].append(measure_policy(policy, steps))
        log(report["policies"][-1])
    params = init_params(CONFIG, SEED, np.float32)
    for way in ("no cache", "contiguous", "paged"):
        report["decoding"].append(measure_decoding(way, params))
        log({k: v for k, v in report["decoding"][-1].items() if k != "tokens"})
    report.update(commit=commit(), date=time.strftime("%Y-%m-%d"), code=measured_code())
    return report


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3, help="timed repeats per policy (the median is kept)")
    parser.add_argument("--write", action="store_true", help=f"keep the result in {os.path.relpath(REPORT, ROOT)}")
    args = parser.parse_args(argv)
    report = run(args.steps)
    if args.write:
        tmp = REPORT.with_suffix(".tmp")
        tmp.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
        tmp.replace(REPORT)  # whole or not at all


if __name__ == "__main__":
    main()
