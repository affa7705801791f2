"""The exercises on what surrounds the layers: AdamW with clipping, decoding with a KV cache, the online softmax
of Flash attention, and NF4 quantization. Each is graded against what its unit tests state of it."""

import math

import numpy as np

from .config import PRESETS
from .errors import InputError, NonFiniteError
from .kv_cache import KVCache
from .model import forward, init_params
from .exercise_checks import Check, Failed, Skipped, layout, same
from .exercise_grade import Exercise

TINY = PRESETS["tiny"]


# ----------------------------------------------------------------- AdamW with clipping
def optim_problem(seed):
    """A few parameters (a weight matrix, decayed, and a LayerNorm gain, not decayed), their state, and ten
    steps of gradients and learning rates."""
    from .optim import AdamWConfig, adamw_init

    rng = np.random.default_rng(seed)
    params = {"b0.wq": rng.standard_normal((3, 4)), "b0.ln1_g": 1 + 0.1 * rng.standard_normal(4)}
    steps = [({k: rng.standard_normal(v.shape) for k, v in params.items()}, 1e-2 * (1 + i % 3)) for i in range(10)]
    return params, adamw_init(params), steps, AdamWConfig(beta1=0.8, beta2=0.95, eps=1e-8, weight_decay=0.2)


def ten_steps(reader, ref):
    """Ten steps of the reader's AdamW against the reference's: every parameter and moment after each step."""
    mine, theirs = optim_problem(12), optim_problem(12)
    for n, ((grads, lr), (grads2, _)) in enumerate(zip(mine[2], theirs[2])):
        reader.adamw_update(mine[0], grads, mine[1], lr, mine[3])
        ref.adamw_update(theirs[0], grads2, theirs[1], lr, theirs[3])
        for name in mine[0]:
            same(f"{name} after step {n + 1}", mine[0][name], theirs[0][name])
            same(f"the first moment of {name} after step {n + 1}", mine[1]["m"][name], theirs[1]["m"][name])
        if mine[1]["step"] != theirs[1]["step"]:
            raise Failed(f"the step count is {mine[1]['step']} after {n + 1} steps")


def torch_adamw(reader, _ref):
    """The reader's AdamW against torch.optim.AdamW with the same decay groups; skipped where torch is absent."""
    try:
        import torch
    except ImportError:
        raise Skipped("torch is not installed") from None
    from .optim import is_decayed

    params, state, steps, cfg = optim_problem(13)
    tparams = {k: torch.tensor(v.copy(), requires_grad=True) for k, v in params.items()}
    groups = [{"params": [t for k, t in tparams.items() if is_decayed(k) == d], "weight_decay": w}
              for d, w in ((True, cfg.weight_decay), (False, 0.0))]
    opt = torch.optim.AdamW(groups, lr=1.0, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, foreach=False)
    for grads, lr in steps:
        reader.adamw_update(params, grads, state, lr, cfg)
        for k, t in tparams.items():
            t.grad = torch.tensor(grads[k])
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
    for k, t in tparams.items():
        same(f"{k} after {len(steps)} steps against torch.optim.AdamW", params[k], t.detach().numpy())


def nan_gradient_refused(reader, _ref):
    """A NaN gradient raises NonFiniteError, which says so, and changes nothing: no parameter, no moment, not the step count."""
    params, state, steps, cfg = optim_problem(14)
    grads = {k: g.copy() for k, g in steps[0][0].items()}
    grads["b0.ln1_g"][1] = np.nan
    before = {k: v.copy() for k, v in params.items()}
    try:
        reader.adamw_update(params, grads, state, 1e-2, cfg)
    except NonFiniteError as e:
        if "gradient" not in str(e):  # the cause, not its consequence (the update that would not be finite)
            raise Failed(f"a NaN gradient was refused with {str(e)!r}: the error should say that the gradient "
                         "is not finite") from None
    else:
        raise Failed("a NaN gradient was taken without NonFiniteError")
    if state["step"] != 0 or any(not np.array_equal(before[k], params[k]) for k in params) or \
            any(np.any(m != 0) for m in state["m"].values()):
        raise Failed("a refused step changed the parameters, the moments or the step count")


def global_norm_values(reader, _ref):
    """The global norm is sqrt(sum of squares) of every entry, also where the squares overflow or the entries
    are subnormal."""
    rng = np.random.default_rng(15)
    grads = {"a": rng.standard_normal((3, 4)), "b": rng.standard_normal(5)}
    flat = np.concatenate([g.ravel() for g in grads.values()])
    same("the global norm", reader.global_norm(grads), math.sqrt(float(np.dot(flat, flat))), 1e-14)
    huge = {k: g * 1e200 for k, g in grads.items()}
    norm = reader.global_norm(huge)
    if not math.isfinite(norm):
        raise Failed("gradients near 1e200 (finite) gave an infinite norm: their squares overflow unless the "
                     "entries are scaled down first")
    same("the global norm of gradients near 1e200", norm / 1e200, math.sqrt(float(np.dot(flat, flat))), 1e-14)
    tiny = {k: g * 1e-310 for k, g in grads.items()}  # subnormal: 1 / (their scale) overflows float64
    norm = reader.global_norm(tiny)
    if not math.isfinite(norm) or norm == 0:
        raise Failed(f"gradients near 1e-310 (subnormal) gave the norm {norm}: divide them by their scale, do not "
                     "multiply by its inverse, which overflows")


def clipping(reader, _ref):
    """Clipping scales every gradient by one factor, to the global norm max_norm, and leaves its inputs as
    they are; gradients already within max_norm come back unchanged; a negative max_norm is refused."""
    rng = np.random.default_rng(16)
    grads = {"a": rng.standard_normal((3, 4)) * 10, "b": rng.standard_normal(5)}
    before = {k: g.copy() for k, g in grads.items()}
    clipped, norm = reader.clip_grads(grads, 1.0)
    if any(not np.array_equal(before[k], grads[k]) for k in grads):
        raise Failed("clip_grads changed the arrays it was given")
    same("the norm clip_grads returns (the norm before clipping)", norm, reader.global_norm(before), 1e-14)
    factors = np.concatenate([(clipped[k] / before[k]).ravel() for k in grads])
    if factors.max() - factors.min() > 1e-12 * factors.max():
        raise Failed("the gradients were scaled by different factors: clipping by the global norm scales them all "
                     "by one, which keeps the direction of the whole update")
    same("the global norm after clipping to 1", reader.global_norm(clipped), 1.0, 1e-5)
    kept, _ = reader.clip_grads(before, 1e9)
    if any(not np.array_equal(kept[k], before[k]) for k in before):
        raise Failed("gradients within max_norm were changed")
    try:
        reader.clip_grads(before, -1.0)
    except InputError:
        return
    raise Failed("a negative max_norm was taken: its factor max_norm / norm flips every gradient's sign")


# ----------------------------------------------------------------- KV-cache decoding
def tiny_model(seed):
    params = init_params(TINY, seed=seed)
    rng = np.random.default_rng(seed)
    for v in params.values():
        if v.ndim == 1:
            v += 0.2 * rng.standard_normal(v.shape)
    return params


def token_by_token(reader, _ref):
    """Feeding the tokens one at a time gives, at every position, the full forward's logits."""
    params, ids = tiny_model(17), [3, 1, 4, 1]
    full, _ = forward(params, np.array(ids), TINY)
    cache = KVCache(TINY, np.float64)
    for t, token in enumerate(ids):
        logits = reader.decode_batch(params, [token], [cache], TINY)[0]
        same(f"the logits at position {t}, decoded with the cache, against the full forward", logits, full[t])


def batched_requests(reader, _ref):
    """Requests at different positions, decoded in one batch, each get the logits they get alone."""
    params, prompts = tiny_model(18), ([2, 0, 2], [4])
    caches = [KVCache(TINY, np.float64) for _ in prompts]
    for cache, prompt in zip(caches, prompts):
        for token in prompt[:-1]:
            reader.decode_batch(params, [token], [cache], TINY)
    batched = reader.decode_batch(params, [p[-1] for p in prompts], caches, TINY)
    for r, prompt in enumerate(prompts):
        alone, _ = forward(params, np.array(prompt), TINY)
        same(f"request {r}'s logits in a batch with a request at another position", batched[r], alone[-1])


def full_cache_refused(reader, _ref):
    """A token past the context limit is refused with InputError, and the cache is left as it was."""
    params, cache = tiny_model(19), KVCache(TINY, np.float64)
    for token in range(TINY.context_len):
        reader.decode_batch(params, [token % TINY.vocab_size], [cache], TINY)
    try:
        reader.decode_batch(params, [0], [cache], TINY)
    except InputError:
        return
    raise Failed(f"a token at position {TINY.context_len} of a cache of {TINY.context_len} positions was taken")


# ----------------------------------------------------------------- Flash attention's online softmax
def flash_inputs(rng, dtype, T=5, dh=3):
    return [rng.standard_normal((2, 2, T, dh)).astype(dtype) for _ in range(3)]


def softmax_attention(q, k, v):
    """The materialized causal attention, row statistics included, in float64."""
    s = q @ k.transpose(0, 1, 3, 2)
    s = np.where(np.tril(np.ones(s.shape[-2:], dtype=bool)), s, -np.inf)
    m = s.max(axis=-1)
    e = np.exp(s - m[..., None])
    return (e / e.sum(-1, keepdims=True)) @ v, m, e.sum(-1)


def every_tile(reader, _ref):
    """For every tile size, out, row_max and row_sum equal the materialized attention's."""
    q, k, v = flash_inputs(np.random.default_rng(20), np.float64)
    want = softmax_attention(q, k, v)
    for tile in (1, 2, 3, 5, 8):
        got = reader.flash_core_forward(q, k, v, tile)
        for name, a, b in zip(("out", "row_max", "row_sum"), got, want):
            same(f"{name} with tiles of {tile} keys", a, b)


def torch_flash(reader, _ref):
    """Every tile size against torch's causal scaled_dot_product_attention; skipped where torch is absent."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        raise Skipped("torch is not installed") from None
    q, k, v = flash_inputs(np.random.default_rng(23), np.float64)
    want = F.scaled_dot_product_attention(*(torch.tensor(a) for a in (q, k, v)), is_causal=True, scale=1.0)
    for tile in (1, 2, 3, 5):
        same(f"out with tiles of {tile} keys against torch", reader.flash_core_forward(q, k, v, tile)[0], want.numpy())


def bad_tile_refused(reader, _ref):
    """A tile of 0 keys, or a negative one, is refused with InputError."""
    q, k, v = flash_inputs(np.random.default_rng(24), np.float64)
    for tile in (0, -2):
        try:
            with np.errstate(all="ignore"):
                reader.flash_core_forward(q, k, v, tile)
        except InputError:
            continue
        raise Failed(f"a tile of {tile} keys was taken without InputError")


def flash_layout(reader, ref):
    for dtype in (np.float32, np.float64):
        args = flash_inputs(np.random.default_rng(21), dtype)
        for name, a, b in zip(("out", "row_max", "row_sum"), reader.flash_core_forward(*args, 2),
                              ref.flash_core_forward(*args, 2)):
            layout(f"{name} for {np.dtype(dtype).name} input", a, b)


# ----------------------------------------------------------------- NF4
def nf4_values(reader, ref):
    """The code: 16 ascending float32 values from -1 to 1 with an exact 0, the reference's own."""
    code = np.asarray(reader.nf4_code())
    layout("the code", code, ref.nf4_code())
    if code[0] != -1 or code[-1] != 1 or 0 not in code or np.any(np.diff(code) <= 0):
        raise Failed("the code must ascend from -1 to 1 and hold an exact 0")
    same("the code's values", code, ref.nf4_code(), 1e-7)


def blocks(reader, ref):
    """Block-wise absmax quantization: the reference's codes and scales, a short last block included."""
    x = np.random.default_rng(22).standard_normal(150).astype(np.float32)
    code = ref.nf4_code()
    (codes, absmax), (want_codes, want_absmax) = reader.quantize_blocks(x, code, 64), ref.quantize_blocks(x, code, 64)
    layout("the codes", codes, want_codes)
    layout("the scales (absmax per block)", absmax, want_absmax)
    same("the scales (absmax per block)", absmax, want_absmax, 0, 0)
    wrong = np.flatnonzero(codes != want_codes)
    if wrong.size:
        raise Failed(f"{wrong.size} of {codes.size} codes differ, first at entry {wrong[0]}: each entry is divided "
                     "by its block's absmax, then given the index of the nearest value of the code")


def packing(reader, _ref):
    """Two codes per byte, the first in the high nibble; unpack undoes pack, an odd count included."""
    codes = np.array([1, 2, 15, 0, 9], dtype=np.uint8)
    packed = reader.pack(codes)
    if packed.dtype != np.uint8 or packed.size != 3 or packed[0] != 0x12:
        raise Failed(f"pack([1, 2, 15, 0, 9]) gave {packed!r}: expected 3 bytes, the first 0x12 (the first code in "
                     "the high nibble)")
    back = reader.unpack(packed, codes.size)
    if not np.array_equal(back, codes):
        raise Failed(f"unpack(pack(codes)) gave {back}, not the codes {codes}")


def exercises():
    adamw_read = "#eq-adam-update"
    return [
        Exercise("adamw", "AdamW, the global norm and clipping", "training/optim.md",
                 (("optim", "adamw_update"), ("optim", "adamw_param"), ("optim", "global_norm"),
                  ("optim", "clip_grads")),
                 [Check("ten steps equal the reference's", ten_steps, adamw_read),
                  Check("PyTorch (torch.optim.AdamW)", torch_adamw, adamw_read),
                  Check("a non-finite gradient changes nothing", nan_gradient_refused, adamw_read),
                  Check("the global norm, without overflow", global_norm_values, "#eq-global-norm"),
                  Check("clipping by one factor", clipping, "#eq-clip")]),
        Exercise("kv_decoding", "decoding with a KV cache, several requests in one batch", "generation/kv-cache.md",
                 (("generate", "decode_batch"), ("generate", "decode_block")),
                 [Check("token by token equals the full forward", token_by_token, "#eq-kv-attend"),
                  Check("batched requests each get their own logits", batched_requests, "#eq-kv-own"),
                  Check("a full cache is refused", full_cache_refused, "#eq-kv-attend")]),
        Exercise("flash", "the online softmax of Flash attention", "model/flash-attention.md",
                 (("flash_attention", "flash_core_forward"),),
                 [Check("shapes and dtypes", flash_layout, "#eq-flash-acc"),
                  Check("every tile size equals softmax attention", every_tile, "#eq-flash-rescale"),
                  Check("PyTorch (scaled_dot_product_attention)", torch_flash, "#eq-flash-acc"),
                  Check("a tile that is not a positive integer is refused", bad_tile_refused, "#eq-flash-tile-scores")]),
        Exercise("nf4", "NF4: the code, block-wise quantization and packing", "finetuning/nf4.md",
                 (("nf4", "nf4_code"), ("nf4", "quantize_blocks"), ("nf4", "pack"), ("nf4", "unpack")),
                 [Check("the NF4 code", nf4_values, "#eq-nf4-code"),
                  Check("block-wise absmax quantization", blocks, "#eq-nf4-absmax"),
                  Check("two codes per byte", packing, "#eq-nf4-pack")]),
    ]
