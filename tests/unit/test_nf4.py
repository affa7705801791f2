"""NF4 with double-quantized scales: the tables, the packing, the error bound, the bytes, and bitsandbytes.

The properties are checked against independent statements of them (the normal quantiles in float64, the
nearest value by brute force, the byte count by hand); bitsandbytes, where installed, is the second,
independent implementation, compared bit for bit.
"""

from statistics import NormalDist

import numpy as np
import pytest

from transformer import nf4
from transformer.errors import InputError


def weights(shape, seed=0, scale=0.05):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def test_the_nf4_code_is_sixteen_normal_quantiles_with_an_exact_zero():
    code = nf4.nf4_code()
    assert code.dtype == np.float32 and code.shape == (16,)
    assert np.all(np.diff(code) > 0) and code[0] == -1 and code[-1] == 1 and code[7] == 0
    # The same quantiles from float64 probabilities with numpy's own linspace. Ours, like bitsandbytes',
    # start from float32 probabilities (relative error 6e-8), which the quantile function amplifies by at
    # most 1/(phi(z) z) ~ 6 near the smallest value: 1e-6.
    normal = NormalDist()
    positive = np.array([normal.inv_cdf(p) for p in np.linspace(nf4.NF4_OFFSET, 0.5, 9)[:-1]])
    negative = np.array([-normal.inv_cdf(p) for p in np.linspace(nf4.NF4_OFFSET, 0.5, 8)[:-1]])
    np.testing.assert_allclose(code[8:][::-1], positive / positive[0], rtol=1e-6)
    np.testing.assert_allclose(code[:7], negative / positive[0], rtol=1e-6)


def test_the_dynamic_code_has_256_values_fine_near_zero():
    code = nf4.dynamic_code()
    assert code.shape == (256,) and np.all(np.diff(code) >= 0)
    assert 0 in code and code[-1] == 1
    positive = code[code > 0]
    gaps = np.diff(positive)
    assert gaps[positive[1:] <= 1e-3].max() < 2e-4 < 5e-3 < gaps[positive[:-1] >= 0.5].min()
    assert np.array_equal(code[code < 0], -positive[:-1][::-1])  # symmetric, but for 1 (no -1)


def test_nearest_finds_the_nearest_value_and_the_lower_one_at_a_midpoint():
    code = nf4.nf4_code()
    x = np.random.default_rng(1).uniform(-1, 1, 5000).astype(np.float32)
    brute = np.abs(x[:, None] - code[None, :]).argmin(axis=1)
    assert np.array_equal(nf4.nearest(x, code), brute)
    midpoint = (code[3] + code[4]) / np.float32(2)
    assert nf4.nearest(np.array([midpoint]), code)[0] == 3


def test_two_codes_share_a_byte_the_first_in_the_high_nibble():
    codes = np.array([12, 13, 1, 11, 7], dtype=np.uint8)
    assert nf4.pack(codes).tolist() == [0xCD, 0x1B, 0x77]  # the odd fifth code is padded with 0's code, 7
    assert np.array_equal(nf4.unpack(np.array([0xCD, 0x1B, 0x77], dtype=np.uint8), 5), codes)


@pytest.mark.parametrize("shape,block_size", [((64, 256), 64), ((37, 129), 64), ((100, 30), 32), ((5,), 64)])
def test_the_error_of_each_weight_is_at_most_half_a_gap_of_its_block(shape, block_size):
    w = weights(shape)
    q = nf4.quantize(w, block_size, double=False)
    flat, back = w.reshape(-1), nf4.dequantize(q).reshape(-1)
    absmax = np.repeat(q.absmax, block_size)[:flat.size]
    half_gap = np.diff(nf4.nf4_code()).max() / 2
    assert np.all(np.abs(flat - back) <= absmax * half_gap * (1 + 1e-6))
    assert np.array_equal(q.absmax, [np.abs(flat[i:i + block_size]).max() for i in range(0, flat.size, block_size)])


def test_double_quantized_scales_are_within_half_a_gap_of_the_true_ones():
    w = weights((512, 512))
    single, double = nf4.quantize(w, double=False), nf4.quantize(w)
    second = np.repeat(double.absmax2, double.block_size2)[:single.absmax.size]
    half_gap = np.diff(nf4.dynamic_code()).max() / 2
    assert np.all(np.abs(double.scales() - single.absmax) <= second * half_gap * (1 + 1e-6) + 1e-9)
    assert np.array_equal(double.packed, single.packed)  # the weights' codes do not depend on how scales are stored


def test_an_nf4weight_decodes_each_scale_as_its_code_times_its_second_level_scale_plus_the_offset():
    q = nf4.quantize(weights((100, 64)), block_size2=16)  # 100 scales: six second-level blocks and a short seventh
    assert q.absmax2.size == 7 and q.absmax is None
    by_hand = [nf4.dynamic_code()[q.absmax_codes[k]] * q.absmax2[k // 16] + q.offset for k in range(100)]
    assert np.array_equal(q.scales(), np.array(by_hand, dtype=np.float32))
    assert q.nbytes == q.packed.nbytes + q.absmax_codes.nbytes + q.absmax2.nbytes + 4


def test_dequantize_range_decodes_any_range_as_dequantize_does():
    q = nf4.quantize(weights((37, 129)))  # an odd count, and blocks that straddle the rows
    whole = nf4.dequantize(q).reshape(-1)
    rng = np.random.default_rng(2)
    ranges = [(0, whole.size), (63, 65), (64, 128), (1, 2), (whole.size - 1, whole.size)]
    ranges += [tuple(sorted(rng.choice(whole.size + 1, 2, replace=False))) for _ in range(50)]
    for start, stop in ranges:
        assert np.array_equal(nf4.dequantize_range(q, start, stop), whole[start:stop]), (start, stop)


@pytest.mark.parametrize("n", [1, 63, 64, 65, 4096, 64 * 256 + 1])
@pytest.mark.parametrize("double", [False, True])
def test_the_payload_formula_counts_the_real_arrays(n, double):
    q = nf4.quantize(weights((n,)), double=double)
    assert q.nbytes == nf4.payload_bytes(n, double=double)
    blocks = -(-n // 64)
    by_hand = -(-n // 2) + (blocks + 4 * -(-blocks // 256) + 4 if double else 4 * blocks)
    assert q.nbytes == by_hand


@pytest.mark.parametrize("bad,message", [
    ({"block_size": 0}, "block_size must be a positive integer"),
    ({"block_size2": 1.5}, "block_size2 must be a positive integer"),
])
def test_bad_block_sizes_are_refused_by_name(bad, message):
    with pytest.raises(InputError, match=message):
        nf4.quantize(weights((8,)), **bad)


@pytest.mark.parametrize("w", [np.zeros(0), np.array([1.0, np.nan]), np.array([np.inf])])
def test_an_empty_or_non_finite_weight_is_refused(w):
    with pytest.raises(InputError, match="non-empty and finite"):
        nf4.quantize(w)


# ------------------------------------------------------------------ bitsandbytes, where installed

SHAPES = [((64, 256), 64), ((37, 129), 64), ((512, 512), 64), ((100, 30), 32), ((1024, 1024), 64)]


@pytest.fixture(scope="module")
def bnb():
    functional = pytest.importorskip("bitsandbytes.functional", reason="bitsandbytes is not installed")
    return functional


def bnb_quantize(bnb, w, block_size, double):
    import torch

    return bnb.quantize_4bit(torch.tensor(w), blocksize=block_size, quant_type="nf4", compress_statistics=double)


def test_our_tables_are_bitsandbytes_tables(bnb):
    assert np.array_equal(nf4.nf4_code(), bnb.get_4bit_type("nf4", device="cpu").numpy())
    assert np.array_equal(nf4.dynamic_code(), bnb.create_dynamic_map(signed=True).numpy())


@pytest.mark.parametrize("shape,block_size", SHAPES)
def test_codes_scales_and_weights_equal_bitsandbytes_bit_for_bit(bnb, shape, block_size):
    w = weights(shape, seed=shape[0])
    packed, state = bnb_quantize(bnb, w, block_size, double=False)
    ours = nf4.quantize(w, block_size, double=False)
    assert np.array_equal(ours.packed, packed.numpy().reshape(-1))
    assert np.array_equal(ours.absmax, state.absmax.numpy())
    assert np.array_equal(nf4.dequantize(ours), bnb.dequantize_4bit(packed, state).numpy())


@pytest.mark.parametrize("shape,block_size", SHAPES)
def test_double_quantization_against_bitsandbytes_every_difference_is_ours_being_nearer(bnb, shape, block_size):
    """Two differences, both counted here. The offset: ours is the mean of the scales rounded once to
    float32; bitsandbytes sums in float32 in its own order, so the two may differ in the last bit (and the
    second-level scales with them). The codes: bitsandbytes' CPU kernel finds a scale's 8-bit code with an
    approximate search that does not always return the nearest value; ours does. So the only code
    differences allowed are those where ours is strictly nearer, and the weights of those blocks alone."""
    w = weights(shape, seed=shape[0])
    packed, state = bnb_quantize(bnb, w, block_size, double=True)
    ours = nf4.quantize(w, block_size)
    assert np.array_equal(ours.packed, packed.numpy().reshape(-1))
    np.testing.assert_array_max_ulp(ours.offset, state.offset.numpy(), maxulp=1)
    scales = nf4.quantize(w, block_size, double=False).absmax
    assert ours.offset == np.float32(np.mean(scales, dtype=np.float64))
    # A second-level scale is the largest |scale - offset| of its block: it moves with the offset, no more.
    offset_gap = abs(np.float64(ours.offset) - state.offset.item())
    assert np.all(np.abs(ours.absmax2.astype(np.float64) - state.state2.absmax.numpy()) <= offset_gap)
    theirs = state.absmax.numpy()
    differ = np.nonzero(ours.absmax_codes != theirs)[0]
    code = nf4.dynamic_code()
    centred = scales - ours.offset
    scaled = centred / np.repeat(ours.absmax2, 256)[:centred.size]
    assert np.all(np.abs(scaled[differ] - code[ours.absmax_codes[differ]])
                  < np.abs(scaled[differ] - code[theirs[differ]]))
    assert differ.size <= 0.005 * theirs.size  # a handful: 0 to 0.3% of the scales in these shapes
    # The weights: outside the blocks whose code differs, only the offset's last bit separates them, so
    # each weight agrees to a few float32 units of its block's scale.
    gap = np.abs(nf4.dequantize(ours).reshape(-1) - bnb.dequantize_4bit(packed, state).numpy().reshape(-1))
    same = np.ones(scales.size, dtype=bool)
    same[differ] = False
    block_of = np.arange(gap.size) // block_size
    assert np.all(gap[same[block_of]] <= 4e-7 * scales[block_of][same[block_of]])


def test_a_finite_float64_weight_too_large_for_float32_is_refused_as_such():
    """NF4 quantizes in float32: a float64 weight past its range is refused for that reason, naming the value,
    not called non-finite (it is finite; its float32 rounding would not be)."""
    w = np.ones((4, 4))
    w[1, 2] = 1e39
    with pytest.raises(InputError, match=r"does not fit float32.*1e\+39"):
        nf4.quantize(w)
    w[1, 2] = np.nan
    with pytest.raises(InputError, match="finite"):
        nf4.quantize(w)


def test_a_layer_quantized_in_the_transposed_layout_gets_other_blocks_and_other_numbers():
    """What the module's docstring says of Linear4bit's layout, (out, in) against this project's (in, out): the
    same weight quantized in the two orders has other blocks, so its decoded weights differ (the equality with
    bitsandbytes holds for one flat array, not across layouts); each stays within its own blocks' error bound."""
    w = np.random.default_rng(61).standard_normal((64, 256)).astype(np.float32)
    here = nf4.dequantize(nf4.quantize(w, 64, double=False))
    there = nf4.dequantize(nf4.quantize(np.ascontiguousarray(w.T), 64, double=False)).T
    assert (here != there).any()
    widest = float(np.diff(nf4.nf4_code()).max()) / 2  # half the widest gap between two NF4 values
    for decoded, blocks in ((here, w.reshape(-1, 64)), (there.T, w.T.reshape(-1, 64))):
        bound = np.abs(blocks).max(axis=1, keepdims=True) * widest * (1 + 1e-6)
        assert (np.abs(decoded.reshape(-1, 64) - blocks) <= bound).all()
