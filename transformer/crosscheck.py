"""Cross-check the NumPy reference against PyTorch on every device found.

The same parameters and inputs go through our NumPy code and through the
torch mirror (torch operations, torch autograd, torch.optim.AdamW) on each
device. We compare the logits, the loss, every parameter gradient, the
intermediates the pages show, ten AdamW steps and KV-cache decoding. Devices
that are not present are listed with the reason, never silently dropped. In
GPT-2's layout, transformers' GPT2LMHeadModel is compared too
(transformer/crosscheck_hf.py).

The gradients have a third computation: the autograd engine (transformer/autograd.py),
which differentiates the same model by a tape instead of hand-written backward
functions. Its gradients are compared with torch's on each device ("autograd" rows,
one per parameter gradient) and, once, with the hand-written NumPy gradients (the report's
"autograd" entry), where both sides are NumPy float64 and agree to rounding. The printed
report (transformer/crosscheck_report.py) shows the three side by side.

The NumPy side always computes in float64: it is the reference. Each gap is
reported two ways: max |ours - torch| and that divided by max |ours| (a
scale-free relative gap, as in gradcheck.relative_gap: divided by the larger of
max |ours| and max |torch|).
"""

import json
from dataclasses import asdict

import numpy as np

from . import crosscheck_finetune, crosscheck_hf, crosscheck_memory, crosscheck_serving
from .autograd_model import loss_and_grads as autograd_loss_and_grads
from .config import PRESETS, ModelConfig
from .crosscheck_rows import AUTOGRAD_TOLERANCE, TOLERANCES, Row, Tolerance, compare  # noqa: F401  (re-exported)
from .generate import KVCache, decode_step
from .gradcheck import relative_gap
from .model import forward, init_params, loss_and_grads
from .optim import AdamWConfig, adamw_init, adamw_update, clip_grads, lr_at

DEVICES = ("cpu", "cuda", "mps", "xla")


def discover_devices(requested=DEVICES):
    """Find which of the requested devices are present, and which dtype to check each in.

    Parameters
    ----------
    requested : sequence of str
        Device names from DEVICES.

    Returns
    -------
    list of tuple
        One (device, torch.device or None, dtype name, reason) per requested name; the torch.device and
        dtype are None for a device that is absent, and the reason says why.

    Raises
    ------
    ValueError
        If a name is not in DEVICES.
    """
    import torch

    found = []
    for name in requested:
        if name == "cpu":
            found.append((name, torch.device("cpu"), "float64", "always present"))
        elif name == "cuda":
            if torch.cuda.is_available():
                found.append((name, torch.device("cuda"), "float64", torch.cuda.get_device_name(0)))
            else:
                built = f"built with CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
                found.append((name, None, None, f"not available on this machine (torch {torch.__version__}, {built})"))
        elif name == "mps":
            mps = getattr(torch.backends, "mps", None)
            if mps is not None and mps.is_available():  # MPS has no float64
                found.append((name, torch.device("mps"), "float32", "Apple Metal"))
            else:
                found.append((name, None, None, "not available on this machine (no Apple Metal device)"))
        elif name == "xla":
            try:
                import torch_xla.core.xla_model as xm
            except ImportError:
                found.append((name, None, None, "not available on this machine (torch_xla is not installed)"))
            else:  # TPUs compute float64 in emulation if at all: check float32
                found.append((name, xm.xla_device(), "float32", "XLA device"))
        else:
            raise ValueError(f"unknown device {name!r}; choose from {', '.join(DEVICES)}")
    return found


def check_device(device, torch_device, dtype, cfg, params, ids, targets, adam_steps=10):
    """Run every comparison on one device.

    Parameters
    ----------
    device : str
        The device name.
    torch_device : torch.device
        Where torch computes.
    dtype : str
        The torch dtype name, "float64" or "float32".
    cfg : ModelConfig
        The model configuration.
    params : dict
        Parameter name to float64 array.
    ids : ndarray of shape (B, T)
        Token ids.
    targets : ndarray of shape (B, T)
        Target ids.
    adam_steps : int
        Optimizer steps to compare.

    Returns
    -------
    list of Row
        One row per comparison.
    """
    import torch

    from .torch_mirror import to_torch, torch_loss

    tdtype = getattr(torch, dtype)
    rows = []
    tparams = to_torch(params, torch_device, tdtype)
    trace, ttrace = {}, {}
    logits, _ = forward(params, ids, cfg, trace)
    loss, grads = loss_and_grads(params, ids, targets, cfg)
    tloss = torch_loss(tparams, ids, targets, cfg, ttrace)
    tloss.backward()
    compare(rows, device, dtype, "forward", "logits", logits, ttrace["logits"])
    compare(rows, device, dtype, "loss", "loss", loss, tloss)
    for name in trace:
        if name != "logits":
            compare(rows, device, dtype, "intermediate", name, trace[name], ttrace[name])
    for name in params:
        compare(rows, device, dtype, "gradient", name, grads[name], tparams[name].grad)
    _, autograd_grads = autograd_loss_and_grads(params, ids, targets, cfg)
    for name in params:
        compare(rows, device, dtype, "autograd", name, autograd_grads[name], tparams[name].grad)
    rows += check_steps(device, torch_device, dtype, cfg, params, ids, targets, adam_steps, own_gradients=False)
    if dtype == "float64":  # see check_steps for why not in float32
        rows += check_steps(device, torch_device, dtype, cfg, params, ids, targets, adam_steps, own_gradients=True)
    rows += check_kv_cache(device, torch_device, dtype, cfg, params, ids[0])
    rows += crosscheck_memory.check_policies(device, torch_device, dtype, cfg, params, ids, targets)
    rows += crosscheck_serving.check_paged(device, torch_device, dtype, cfg, params)
    rows += crosscheck_finetune.check_finetune(device, torch_device, dtype, cfg, params, ids, targets)
    rows += crosscheck_hf.check_transformers(device, torch_device, dtype, cfg, params, ids, targets)
    return rows


def autograd_against_numpy(cfg, params, ids, targets):
    """The autograd engine's gradients against the hand-written backward's, both NumPy float64.

    Parameters
    ----------
    cfg : ModelConfig
        The model configuration.
    params : dict
        Parameter name to float64 array.
    ids, targets : ndarray of shape (B, T)
        Token ids and target ids.

    Returns
    -------
    dict
        tolerance (AUTOGRAD_TOLERANCE as a dict); max_abs, the largest absolute gap of all; max_rel and
        worst, the largest relative gap and its parameter among the other gradients; on_floor, the
        gradients that are zero (their hand-written values all within the absolute bound: a relative
        gap there compares two noises, so they are held to the absolute bound instead); passed; gaps,
        each parameter's max_abs, max_rel, on_floor and passed (the report's "engine vs NumPy" column).
    """
    _, grads = loss_and_grads(params, ids, targets, cfg)
    _, ours = autograd_loss_and_grads(params, ids, targets, cfg)
    tol = AUTOGRAD_TOLERANCE
    gaps = {}
    for name, g in grads.items():
        max_abs, max_rel = float(np.abs(ours[name] - g).max()), float(relative_gap(ours[name], g))
        # A gradient that is zero in exact arithmetic comes out as rounding noise on both sides.
        on_floor = bool(np.abs(g).max() <= tol.abs)
        passed = max_abs <= tol.abs if on_floor else max_rel <= tol.rel
        gaps[name] = {"max_abs": max_abs, "max_rel": max_rel, "on_floor": on_floor, "passed": passed}
    worst = max((name for name in gaps if not gaps[name]["on_floor"]), key=lambda name: gaps[name]["max_rel"])
    return {"tolerance": asdict(tol), "max_rel": gaps[worst]["max_rel"], "worst": worst,
            "on_floor": [name for name in gaps if gaps[name]["on_floor"]],
            "max_abs": max(gap["max_abs"] for gap in gaps.values()),
            "passed": all(gap["passed"] for gap in gaps.values()), "gaps": gaps}


def make_torch_adamw(tparams, opt: AdamWConfig):
    """torch.optim.AdamW decaying the matrices and embedding tables (every tensor of two axes) and
    nothing else. The rule is written here from the shapes, not taken from optim.is_decayed, so a
    wrong list of decayed names in the reference shows up as a difference."""
    import torch

    groups = [{"params": [p for p in tparams.values() if p.dim() >= 2], "weight_decay": opt.weight_decay},
              {"params": [p for p in tparams.values() if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=opt.lr, betas=(opt.beta1, opt.beta2), eps=opt.eps)


def make_torch_schedule(optimizer, warmup, total, min_lr):
    """Linear warm-up then cosine decay from torch's own schedulers (LinearLR, CosineAnnealingLR): the
    learning rates of optim.lr_at for steps 0 to total - 1."""
    import torch

    warm = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=1.0 / warmup, end_factor=1.0,
                                             total_iters=warmup - 1)
    decay = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total - warmup, eta_min=min_lr)
    return torch.optim.lr_scheduler.SequentialLR(optimizer, [warm, decay], milestones=[warmup])


ADAMW = AdamWConfig(lr=1e-2)  # a large rate, so ten steps move every parameter visibly
# Whole training steps also warm up, decay and clip as train() does. The gradient norm of the
# cross-check's model starts near 3.5 and falls below 1 after about seven steps, so clipping at 1.0
# acts on most of the ten steps.
WARMUP, MIN_LR, GRAD_CLIP = 3, 1e-3, 1.0
# The largest rounding noise we allow a float64 gradient that is zero in exact
# arithmetic (the key bias): its terms are ~1e-3 here and cancel to ~1e-17.
ZERO_GRADIENT_NOISE = 1e-14


def check_steps(device, torch_device, dtype, cfg, params, ids, targets, steps, own_gradients, opt=ADAMW):
    """Ten optimizer steps on both sides, every parameter compared after each.

    own_gradients=False ("adamw step N"): torch.optim.AdamW is fed our
    gradients, so the two optimizers alone are compared.
    own_gradients=True ("train step N"): whole training steps, each side with
    its own gradients, learning-rate schedule and clipping, in train()'s order:
    gradients, clip to GRAD_CLIP, AdamW at the step's rate. The key-bias gradient is zero in exact arithmetic, so
    each framework moves bk by its own rounding noise divided by Adam's
    normaliser: at most lr * noise / eps a step. Both bk trajectories are
    therefore noise, and bk is held to that bound (ZERO_GRADIENT_NOISE) rather
    than compared relatively. In float32 the noise (~3e-9) is not small next
    to eps (1e-8) and the bound is no test at all, so whole steps run in
    float64 only.
    """
    import torch

    from .torch_mirror import to_torch, torch_loss

    ours = {k: v.copy() for k, v in params.items()}
    state = adamw_init(ours)
    theirs = to_torch(params, torch_device, getattr(torch, dtype))
    optimizer = make_torch_adamw(theirs, opt)
    schedule = make_torch_schedule(optimizer, WARMUP, steps, MIN_LR) if own_gradients else None
    label = "train step" if own_gradients else "adamw step"
    rows = []
    for step in range(1, steps + 1):
        _, grads = loss_and_grads(ours, ids, targets, cfg)
        if own_gradients:
            grads, _ = clip_grads(grads, GRAD_CLIP)
            adamw_update(ours, grads, state, lr_at(step - 1, opt.lr, WARMUP, steps, MIN_LR), opt)
            optimizer.zero_grad()
            torch_loss(theirs, ids, targets, cfg).backward()
            torch.nn.utils.clip_grad_norm_(list(theirs.values()), GRAD_CLIP)
        else:
            adamw_update(ours, grads, state, opt.lr, opt)
            for name, t in theirs.items():
                t.grad = torch.tensor(grads[name], dtype=t.dtype).to(torch_device)
        optimizer.step()
        if schedule is not None:
            schedule.step()
        for name in ours:
            tol = None
            if own_gradients and name.endswith(".bk"):
                bound = 2 * step * opt.lr * ZERO_GRADIENT_NOISE / opt.eps  # both sides drift at most this
                tol = Tolerance(0.0, bound, "a zero gradient: both sides move by rounding noise only")
            compare(rows, device, dtype, label, name, ours[name], theirs[name], tol, step)
    return rows


def check_kv_cache(device, torch_device, dtype, cfg, params, ids):
    """Our cached decoding, one token at a time, against torch's full causal
    forward over the whole sequence (position t sees tokens 0..t only)."""
    import torch

    from .torch_mirror import to_torch, torch_forward

    cache = KVCache(cfg, np.float64)
    ours = np.stack([decode_step(params, int(token), cache, cfg) for token in ids])
    with torch.no_grad():
        theirs = torch_forward(to_torch(params, torch_device, getattr(torch, dtype), False), ids, cfg)
    rows = []
    compare(rows, device, dtype, "kv-cache", f"logits at {len(ids)} positions", ours, theirs)
    return rows


def run_crosscheck(devices=DEVICES, dtype=None, activation="relu", seed=0, batch=2, seq_len=16, tied_head=False,
                   head_bias=True):
    """Run every check on every requested device.

    Parameters
    ----------
    devices : sequence of str
        Device names from DEVICES.
    dtype : str, optional
        The torch dtype; by default each device's own. A device without float64 is checked in float32.
    activation : str
        The model's activation: one of the config's ACTIVATIONS.
    seed : int
        Seed of the parameters and the inputs.
    batch : int
        B, sequences per input.
    seq_len : int
        T, tokens per sequence.
    tied_head, head_bias : bool
        The head's layout (GPT-2's: tied, without bias).

    Returns
    -------
    dict
        The report: versions, config, tolerances, each device's status, every row, and whether all passed.
    """
    import torch

    cfg: ModelConfig = PRESETS["default"].with_(activation=activation, tied_head=tied_head, head_bias=head_bias)
    params = init_params(cfg, seed=seed, dtype=np.float64)
    rng = np.random.default_rng(seed)
    # Nudge LayerNorm gains and all biases off their initial 1 and 0 so that
    # every term of every gradient is exercised.
    for value in params.values():
        if value.ndim == 1:
            value += 0.1 * rng.standard_normal(value.shape)
    ids = rng.integers(0, cfg.vocab_size, (batch, seq_len))
    targets = rng.integers(0, cfg.vocab_size, (batch, seq_len))
    report = {"versions": {"numpy": np.__version__, "torch": torch.__version__},
              "config": cfg.to_dict(), "seed": seed, "ids_shape": [batch, seq_len],
              "tolerances": {k: asdict(v) for k, v in TOLERANCES.items()},
              "devices": [], "rows": [], "autograd": autograd_against_numpy(cfg, params, ids, targets),
              "transformers": crosscheck_hf.transformers_status(cfg)[1]}
    for name, torch_device, device_dtype, reason in discover_devices(devices):
        if torch_device is None:
            report["devices"].append({"device": name, "status": "not available", "reason": reason})
            continue
        use = dtype or device_dtype
        if use == "float64" and device_dtype == "float32":
            use = "float32"  # the device cannot do float64
        rows = check_device(name, torch_device, use, cfg, params, ids, targets)
        kernel_rows, kernel_note = crosscheck_memory.check_flash_kernel(name, torch_device, use, seed)
        rows += kernel_rows
        report["devices"].append({"device": name, "status": "checked", "reason": reason, "dtype": use,
                                  "passed": all(r.passed for r in rows), "checks": len(rows),
                                  "flash_kernel": kernel_note})
        report["rows"] += [asdict(r) for r in rows]
    report["passed"] = (all(r["passed"] for r in report["rows"]) and bool(report["rows"])
                        and report["autograd"]["passed"])
    return report


def write_json(report, path):
    """Write a report to a JSON file.

    Parameters
    ----------
    report : dict
        A report from `run_crosscheck`.
    path : str or Path
        The file to write.
    """
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
