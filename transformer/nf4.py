"""NF4: weights stored as 4-bit codes of a normal-quantile table, one scale per block, scales double-quantized.

A trained weight matrix is close to normally distributed. NF4 (the QLoRA paper's NormalFloat) spends its 16
values where such weights are dense: the values are quantiles of the standard normal, rescaled to [-1, 1],
with an exact 0. A weight is stored as the index of the nearest value after dividing its block of
`block_size` weights (flattened, in order) by the block's largest magnitude, its absmax. Two indices share
a byte, the first in the high nibble.

The absmax of every block is one float32 per 64 weights: half a bit per weight. Double quantization stores
them in 8 bits too: subtract their mean (one float32 offset), cut them into blocks of `block_size2`, and
store each as the index of the nearest value of an 8-bit "dynamic" table (signed, spaced finely near 0 and
coarsely near 1) after dividing by its block's absmax, a float32 per `block_size2` scales.

Every table is built here from its construction, in float32 as bitsandbytes builds it, so its values match
bitsandbytes' bit for bit, and so do the packed codes, the plain scales and the dequantized weights of the
same flat array (tests/unit/test_nf4.py compares them with bitsandbytes' CPU functions where it is installed;
its CUDA kernels have not been compared here). A layer is another matter: its weight is stored (in, out) here
and (out, in) in bitsandbytes' Linear4bit, so the blocks of one layer hold other weights in the two, and
their codes, scales and decoded weights differ. Double quantization differs in two counted ways: the offset is the
mean rounded once (bitsandbytes sums in float32, so the last bit may differ), and each scale's 8-bit code
is the nearest value (bitsandbytes' search sometimes is not).
"""

from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist

import numpy as np

from .errors import InputError

# The two extreme NF4 values sit at this quantile of the normal (and at 1 - it): the QLoRA paper's choice,
# the midpoint of the quantiles 1 - 1/(2*15) and 1 - 1/(2*16) for the 15 and 16 halves of the code.
NF4_OFFSET = 0.9677083


def float32_linspace(start, stop, num):
    """`num` evenly spaced float32 values from start to stop, rounded as torch.linspace rounds them: the
    first half is start + i step, the second half stop - (num - 1 - i) step, each multiply-add rounded once
    to float32 (a fused multiply-add; in float64 the product of a float32 and a small integer is exact).
    numpy's linspace rounds some values differently, and the tables below are defined by torch's."""
    start, stop = np.float32(start), np.float32(stop)
    step = np.float64((stop - start) / np.float32(num - 1))
    i = np.arange(num)
    up = np.float64(start) + step * i
    down = np.float64(stop) - step * (num - 1 - i)
    return np.where(i < num // 2, up, down).astype(np.float32)


@lru_cache(maxsize=None)
def nf4_code():
    """The 16 NF4 values, ascending, from -1 to 1 with an exact 0: 8 positive and 7 negative normal quantiles,
    each half spaced evenly in probability from NF4_OFFSET to 0.5, divided by the largest."""
    normal = NormalDist()
    positive = [normal.inv_cdf(float(p)) for p in float32_linspace(NF4_OFFSET, 0.5, 9)[:-1]]  # eq:nf4-code
    negative = [-normal.inv_cdf(float(p)) for p in float32_linspace(NF4_OFFSET, 0.5, 8)[:-1]]  # eq:nf4-code
    values = np.sort(np.array([*positive, 0.0, *negative], dtype=np.float32))
    values /= values.max()  # eq:nf4-code
    values.setflags(write=False)  # built once and shared
    return values


@lru_cache(maxsize=None)
def dynamic_code():
    """The 256 values of the signed 8-bit dynamic table the scales are stored in (bitsandbytes'
    `create_dynamic_map`): for e = 0 .. 6, 2^e values spaced evenly in [0.1, 1] times 10^(e - 6), with both
    signs, plus 0 and 1; ascending."""
    values = [0.0, 1.0]
    for e in range(7):
        bounds = float32_linspace(0.1, 1, 2 ** e + 1)
        means = (bounds[:-1] + bounds[1:]) / np.float32(2)
        scale = np.float32(10.0 ** (e - 6))  # the products are float32, as bitsandbytes computes them
        values += [*(scale * means), *(-scale * means)]  # eq:nf4-dynamic
    values = np.sort(np.array(values, dtype=np.float32))
    values.setflags(write=False)  # built once and shared
    return values


def nearest(scaled, code):
    """Index of the nearest value of an ascending code; a value exactly between two goes to the lower."""
    midpoints = (code[:-1] + code[1:]) / np.float32(2)
    return np.searchsorted(midpoints, scaled, side="left").astype(np.uint8)  # eq:nf4-nearest


def quantize_blocks(x, code, block_size):
    """Block-wise absmax quantization of a flat float32 array: (codes, absmax). The last block may be short."""
    n = x.size
    full = n - n % block_size
    blocks = x[:full].reshape(-1, block_size)
    absmax = np.abs(blocks).max(axis=1)  # eq:nf4-absmax
    scaled = np.clip(blocks * (np.float32(1) / np.maximum(absmax, np.float32(1e-38)))[:, None], -1, 1)  # eq:nf4-nearest
    parts, scales = [scaled.reshape(-1)], [absmax]
    if full < n:  # the short last block
        last = np.maximum(np.abs(x[full:]).max(), np.float32(1e-38))  # eq:nf4-absmax
        parts.append(np.clip(x[full:] / last, -1, 1))  # eq:nf4-nearest
        scales.append(np.array([last], dtype=np.float32))
    return nearest(np.concatenate(parts), code), np.concatenate(scales).astype(np.float32)


def pack(codes):
    """Two 4-bit codes per byte, the first in the high nibble; an odd count is padded with the code of 0."""
    if codes.size % 2:
        codes = np.append(codes, np.uint8(7))  # nf4_code()[7] == 0
    return (codes[0::2] << 4) | codes[1::2]  # eq:nf4-pack


def unpack(packed, n):
    """The first n 4-bit codes of packed bytes, in order."""
    codes = np.empty(packed.size * 2, dtype=np.uint8)
    codes[0::2], codes[1::2] = packed >> 4, packed & 0x0F  # eq:nf4-pack
    return codes[:n]


@dataclass(frozen=True)
class NF4Weight:
    """A weight stored in NF4. With double quantization, `absmax` is None and the scales live in
    `absmax_codes` (uint8), `absmax2` (float32, one per block_size2 scales) and `offset` (float32)."""
    packed: np.ndarray  # uint8, ceil(n / 2)
    shape: tuple
    block_size: int
    absmax: np.ndarray | None = None  # float32, one per block
    absmax_codes: np.ndarray | None = None
    absmax2: np.ndarray | None = None
    offset: np.float32 | None = None
    block_size2: int = 256

    @property
    def nbytes(self):
        """Bytes of the stored arrays: what the weight costs in memory."""
        arrays = (self.packed, self.absmax, self.absmax_codes, self.absmax2)
        return sum(a.nbytes for a in arrays if a is not None) + (4 if self.offset is not None else 0)

    def scales(self):
        """The float32 absmax of every block, decoded from the double quantization where there is one."""
        if self.absmax is not None:
            return self.absmax
        second = np.repeat(self.absmax2, self.block_size2)[:self.absmax_codes.size]
        return dynamic_code()[self.absmax_codes] * second + self.offset  # eq:nf4-scales


def check_block_size(name, value):
    if not (isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 1):
        raise InputError(f"{name} must be a positive integer, got {value!r}")


def quantize(w, block_size=64, double=True, block_size2=256):
    """Store a weight in NF4, with its scales double-quantized unless double=False.

    Parameters
    ----------
    w : array_like
        The weight, any shape; it is quantized flattened, in C order, as float32.
    block_size : int
        Weights per absmax scale.
    double : bool
        Double-quantize the scales.
    block_size2 : int
        Scales per second-level scale.

    Returns
    -------
    NF4Weight
    """
    check_block_size("block_size", block_size)
    check_block_size("block_size2", block_size2)
    w = np.asarray(w)
    if w.size == 0 or not np.isfinite(w).all():
        raise InputError("a weight to quantize must be non-empty and finite")
    largest = float(np.abs(w).max())
    if largest > float(np.finfo(np.float32).max):  # finite here, but too large for float32
        raise InputError(f"a weight to quantize does not fit float32, in which NF4 quantizes: its largest magnitude "
                         f"is {largest:.3g}, float32's {float(np.finfo(np.float32).max):.3g}")
    w = w.astype(np.float32)
    codes, absmax = quantize_blocks(w.reshape(-1), nf4_code(), block_size)
    packed = pack(codes)
    if not double:
        return NF4Weight(packed, w.shape, block_size, absmax=absmax)
    offset = np.float32(absmax.mean(dtype=np.float64))  # the mean, rounded once to float32; eq:nf4-offset
    absmax_codes, absmax2 = quantize_blocks(absmax - offset, dynamic_code(), block_size2)  # eq:nf4-double
    return NF4Weight(packed, w.shape, block_size, absmax_codes=absmax_codes, absmax2=absmax2, offset=offset,
                     block_size2=block_size2)


def dequantize(q):
    """The float32 weight an NF4Weight stands for."""
    n = int(np.prod(q.shape))
    values = nf4_code()[unpack(q.packed, n)]
    scales = np.repeat(q.scales(), q.block_size)[:n]
    return (values * scales).reshape(q.shape)  # eq:nf4-dequantize


def dequantize_range(q, start, stop, scales=None):
    """Values start to stop - 1 of the flattened weight, decoded without decoding the rest.

    Parameters
    ----------
    q : NF4Weight
    start, stop : int
        A range of positions of the flattened weight.
    scales : ndarray, optional
        q.scales(), when the caller decodes many ranges (the double-quantized scales are decoded once).

    Returns
    -------
    ndarray of shape (stop - start,), float32
    """
    scales = q.scales() if scales is None else scales
    first = start - start % 2  # unpack whole bytes
    codes = unpack(q.packed[first // 2:(stop + 1) // 2], stop - first)[start - first:]
    first_block = start // q.block_size
    spread = np.repeat(scales[first_block:(stop - 1) // q.block_size + 1], q.block_size)
    begin = start - first_block * q.block_size
    values = nf4_code()[codes]
    values *= spread[begin:begin + stop - start]  # eq:nf4-dequantize
    return values


def payload_bytes(n, block_size=64, double=True, block_size2=256):
    """Bytes of an NF4 weight of n values: the packed codes, and the scales in float32 or double-quantized."""
    blocks = -(-n // block_size)
    codes = -(-n // 2)
    if not double:
        return codes + 4 * blocks  # eq:nf4-payload
    return codes + blocks + 4 * -(-blocks // block_size2) + 4  # eq:nf4-payload
