"""The NF4 page's independent check: bitsandbytes' `quantize_4bit` / `dequantize_4bit` against transformer/nf4.py,
array by array, every difference counted and its reason checked rather than assumed.

bitsandbytes (and torch, which it needs) are imported here only, inside the functions: transformer/ never
imports them, and a machine without bitsandbytes builds the page with a table row saying that nothing was
compared. Values and tables only; the words are in docs/finetuning/nf4.md.
"""

import inspect
from dataclasses import dataclass

import numpy as np

from transformer import nf4

from .. import sections
from ..common import md_table, package_version

BLOCK = inspect.signature(nf4.quantize).parameters["block_size"].default  # the one QLoRA uses
SHAPES = ((64, 256), (37, 129), (1024, 1024))  # a short last block in the second; each weight seeded by its rows


@dataclass(frozen=True)
class Compared:
    """One array compared: how many elements, how many differ, and whether every difference is the allowed
    one (`reason` says which; an unexplained difference makes `explained` False)."""
    what: str
    elements: int
    differ: int
    explained: bool
    reason: str


def functional():
    """bitsandbytes.functional, or None where bitsandbytes is not installed (or cannot load)."""
    try:
        import logging

        logging.getLogger("bitsandbytes").setLevel(logging.ERROR)  # it warns about optional CPU kernels
        from bitsandbytes import functional as bnb
    except Exception:  # ImportError, or a broken install raising anything while it loads
        return None
    return bnb


def devices():
    """The torch devices bitsandbytes is run on: the CPU, and CUDA where the build machine has it."""
    import torch

    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def exact(what, ours, theirs, reason="bit for bit"):
    ours, theirs = np.asarray(ours).reshape(-1), np.asarray(theirs).reshape(-1)
    differ = int(np.count_nonzero(ours != theirs)) if ours.shape == theirs.shape else max(ours.size, theirs.size)
    return Compared(what, ours.size, differ, differ == 0, reason)


def tables(bnb, device):
    return [exact("NF4 values \\(\\nu\\)", nf4.nf4_code(), bnb.get_4bit_type("nf4", device=device).cpu().numpy()),
            exact("dynamic values \\(\\zeta\\)", nf4.dynamic_code(),
                  bnb.create_dynamic_map(signed=True).cpu().numpy())]


def compare_single(bnb, w, block_size, device):
    import torch

    packed, state = bnb.quantize_4bit(torch.tensor(w, device=device), blocksize=block_size, quant_type="nf4",
                                      compress_statistics=False)
    ours = nf4.quantize(w, block_size, double=False)
    back = bnb.dequantize_4bit(packed, state).cpu().numpy()
    return [exact("packed codes (bytes)", ours.packed, packed.cpu().numpy()),
            exact("\\(\\operatorname{absmax}\\), plain", ours.absmax, state.absmax.cpu().numpy()),
            exact("\\(\\hat{\\theta}\\), single", nf4.dequantize(ours), back)]


def compare_double(bnb, w, block_size, device):
    """The nested statistics. Two differences are allowed, each checked: the offset may differ in its last
    bit (bitsandbytes sums the scales in float32; ours is the float64 mean rounded once), and a scale's
    8-bit code may differ where ours is strictly nearer (bitsandbytes' search is approximate)."""
    import torch

    packed, state = bnb.quantize_4bit(torch.tensor(w, device=device), blocksize=block_size, quant_type="nf4",
                                      compress_statistics=True)
    ours, single = nf4.quantize(w, block_size), nf4.quantize(w, block_size, double=False)
    theirs_offset = np.float32(state.offset.item())
    ulps = int(abs(ours.offset.view(np.int32).astype(np.int64) - theirs_offset.view(np.int32).astype(np.int64)))
    offset = Compared("\\(\\operatorname{offset}\\)", 1, int(ulps > 0), ulps <= 1,
                      f"{ulps} ulp apart: bitsandbytes sums in float32" if ulps else "bit for bit")
    gap = abs(np.float64(ours.offset) - np.float64(theirs_offset))
    theirs2 = state.state2.absmax.cpu().numpy()
    differ2 = int(np.count_nonzero(ours.absmax2 != theirs2))
    absmax2 = Compared("\\(\\operatorname{absmax}^{(2)}\\)", ours.absmax2.size, differ2,
                       bool(np.all(np.abs(ours.absmax2.astype(np.float64) - theirs2) <= gap)),
                       "bit for bit" if not differ2 else "each within the offset's gap: it moves with the offset")
    codes, theirs = ours.absmax_codes, state.absmax.cpu().numpy()
    differ = np.nonzero(codes != theirs)[0]
    centred = single.absmax - ours.offset
    scaled = centred / np.repeat(ours.absmax2, ours.block_size2)[:centred.size]
    zeta = nf4.dynamic_code()
    nearer = bool(np.all(np.abs(scaled[differ] - zeta[codes[differ]]) < np.abs(scaled[differ] - zeta[theirs[differ]])))
    nested = Compared("\\(\\operatorname{code}^{(8)}\\), nested", codes.size, differ.size, nearer,
                      "bit for bit" if not differ.size else "ours strictly nearer at each: bitsandbytes' search is "
                                                            "approximate")
    back = bnb.dequantize_4bit(packed, state).cpu().numpy().reshape(-1)
    mine = nf4.dequantize(ours).reshape(-1)
    block_of = np.arange(mine.size) // block_size
    other = np.isin(block_of, differ)
    scale = single.absmax[block_of]
    close = bool(np.all(np.abs(mine - back)[~other] <= 4e-7 * scale[~other]))
    weights = Compared("\\(\\hat{\\theta}\\), double", mine.size, int(np.count_nonzero(mine != back)), close,
                       f"{int(np.count_nonzero(other))} in the blocks whose code differs; the rest within "
                       "4e-7 of their block's scale, the offset's last bit")
    return [exact("packed codes (bytes), double", ours.packed, packed.cpu().numpy()), offset, absmax2, nested,
            weights]


def cells(c):
    return [c.what, f"{c.elements:,}", f"{c.differ:,}", c.reason, "pass" if c.explained else "**FAIL**"]


def compared(bnb, weight):
    """Every Compared of the tables and of each shape, single then double, on each device: (device, input, c)."""
    out = []
    for device in devices():
        out += [(device, "tables", c) for c in tables(bnb, device)]
        for shape in SHAPES:
            w = weight(shape, seed=shape[0])
            label = f"{sections.shape_text(shape)}, \\(n_b\\) = {BLOCK}"
            out += [(device, label, c) for c in (*compare_single(bnb, w, BLOCK, device),
                                                  *compare_double(bnb, w, BLOCK, device))]
    return out


SINGLE = ("packed codes (bytes)", "\\(\\operatorname{absmax}\\), plain", "\\(\\hat{\\theta}\\), single")


LAYER = (64, 256)  # (in, out): a layer's weight as this project stores it


def layout(weight):
    """A layer quantized as stored here, (in, out), against the same weight quantized in bitsandbytes' Linear4bit
    layout, (out, in), and decoded back: the blocks run along other axes, so they hold other weights. Both use
    this project's quantize (bit for bit bitsandbytes' own on a flat array, as the table shows), so this needs no
    bitsandbytes."""
    w = weight(LAYER, seed=LAYER[0] + 1)
    ours = nf4.dequantize(nf4.quantize(w, BLOCK, double=False))
    linear4bit = nf4.dequantize(nf4.quantize(np.ascontiguousarray(w.T), BLOCK, double=False)).T
    gaps = np.abs(ours - linear4bit)
    return {"shape": f"{LAYER[0]} × {LAYER[1]}", "differ": int((gaps > 0).sum()), "elements": int(w.size),
            "gap": float(gaps.max()), "largest": float(np.abs(w).max())}


def comparison(weight):
    """(table, values): bitsandbytes against transformer/nf4.py on the weights `weight(shape, seed)` draws."""
    bnb = functional()
    header = ["device", "input", "compared", "elements", "differ", "why", "result"]
    if bnb is None:
        return md_table(header, [["—", "bitsandbytes is not installed on the machine that built this page", "nothing",
                                  "—", "—", "—", "not run"]]), {
            "version": "not installed", "torch": package_version("torch"), "devices": [], "single_differ": 0,
            "single_elements": 0, "shapes": [f"{r} × {c}" for r, c in SHAPES], "block": BLOCK,
            "layout": layout(weight)}
    found = compared(bnb, weight)
    single = [c for _, label, c in found if label == "tables" or c.what in SINGLE]
    return md_table(header, [[device, label, *cells(c)] for device, label, c in found]), {
        "version": package_version("bitsandbytes"), "torch": package_version("torch"), "devices": devices(),
        "single_differ": sum(c.differ for c in single), "single_elements": sum(c.elements for c in single),
        "shapes": [f"{r} × {c}" for r, c in SHAPES], "block": BLOCK, "layout": layout(weight)}
