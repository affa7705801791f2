"""Property tests: tokenizers, configurations, the KV cache and the gradient check on examples hypothesis
draws (checkpoint and adapter files are in test_properties_files.py).

Each property holds for every example, not for a few chosen ones. The examples are derandomized (the same
ones on every run, so CI cannot flake) and kept tiny, so the whole file takes seconds.
"""

import json
import math
from dataclasses import asdict, fields

import numpy as np
import pytest

hypothesis = pytest.importorskip(
    "hypothesis", reason="the property tests need hypothesis, part of the test extra (pip install -e '.[test]')")
from hypothesis import given, settings
from hypothesis import strategies as st

from transformer.config import ModelConfig
from transformer.data import ByteTokenizer, CharTokenizer, tokenizer_from_dict
from transformer.errors import ConfigError, InputError
from transformer.finetune import adapter_loss_and_grads
from transformer.generate import decode_batch, decode_step, prefill
from transformer.gradcheck import check_passes, gradcheck_model
from transformer.kv_cache import KVCache, PagedCache, PagePool
from transformer.lora import TARGETS, LoRAConfig, adapter_shapes, init_adapters
from transformer.model import forward, init_params, param_count, param_shapes
from transformer.optim import lr_at
from transformer.train_config import TrainConfig


def prop(max_examples=100):
    """Hypothesis settings of these tests: derandomized (the same examples every run, so CI cannot flake), no
    deadline (a shared machine's pauses are not failures) and no example database written into the tree."""
    return settings(max_examples=max_examples, derandomize=True, deadline=None, database=None)

# ------------------------------------------------------------------ tokenizers

VOCABS = st.text(min_size=1, max_size=20).map(lambda s: "".join(dict.fromkeys(s)))  # distinct characters


@prop()
@given(data=st.data(), chars=VOCABS)
def test_char_tokenizer_round_trips_any_text_of_its_alphabet(data, chars):
    tok = tokenizer_from_dict(json.loads(json.dumps(CharTokenizer(chars).to_dict())))  # as a checkpoint keeps it
    text = data.draw(st.text(alphabet=chars, max_size=50))
    ids = tok.encode(text)
    assert ids.dtype == np.int64 and ids.shape == (len(text),)
    assert ((ids >= 0) & (ids < tok.vocab_size)).all()
    assert tok.decode(ids) == text


@prop()
@given(data=st.data(), chars=VOCABS)
def test_char_tokenizer_names_the_first_character_outside_its_alphabet(data, chars):
    outside = data.draw(st.characters().filter(lambda c: c not in chars))
    before = data.draw(st.text(alphabet=chars, max_size=10))
    after = data.draw(st.text(max_size=10))
    with pytest.raises(InputError, match="not in this tokenizer's vocabulary") as caught:
        CharTokenizer(chars).encode(before + outside + after)
    assert repr(outside) in str(caught.value)


@prop()
@given(text=st.text(max_size=50))
def test_byte_tokenizer_round_trips_any_text_as_its_utf8_bytes(text):
    ids = ByteTokenizer().encode(text)
    assert bytes(ids.astype(np.uint8)) == text.encode("utf-8")  # the ids are the bytes themselves
    assert ByteTokenizer().decode(ids) == text


@prop()
@given(raw=st.binary(max_size=50))
def test_byte_tokenizer_gives_back_the_raw_bytes_of_text_that_was_not_utf8(raw):
    text = raw.decode("utf-8", errors="surrogateescape")  # how Python hands over a non-UTF-8 argument
    assert bytes(ByteTokenizer().encode(text).astype(np.uint8)) == raw


@prop()
@given(data=st.data(), tok=st.one_of(VOCABS.map(CharTokenizer), st.just(ByteTokenizer())))
def test_decoding_an_id_outside_the_vocabulary_is_an_input_error(data, tok):
    bad = data.draw(st.one_of(st.integers(-2**63, -1), st.integers(tok.vocab_size, 2**63 - 1)))
    good = data.draw(st.lists(st.integers(0, tok.vocab_size - 1), max_size=5))
    for ids in (good + [bad], np.array(good + [bad], dtype=np.int64)):
        with pytest.raises(InputError, match=f"got {bad}"):
            tok.decode(ids)


# ------------------------------------------------------------------ configurations

# Values of every kind a config might be handed: small integers most, and the awkward ones.
ANYTHING = st.one_of(
    st.integers(-2, 9), st.integers(-2, 9).map(np.int64), st.integers(), st.just(10**400),
    st.floats(), st.floats(-2, 9).map(np.float64), st.booleans(), st.just(np.bool_(True)), st.none(),
    st.text(max_size=6), st.sampled_from(["relu", "gelu", "flash", "materialized", "float64", "char", "byte"]),
    st.lists(st.integers(), max_size=2), st.just(np.array([1, 2])), st.just({"a": 1}),
)
BASE = ModelConfig(vocab_size=5, context_len=4, emb_dim=4, num_heads=2, num_layers=1, ff_dim=6, flash_tile=2)
RUNNABLE_PARAMS = 50_000  # an accepted config up to this size is built and run; beyond, memory is the limit


def runs_on_a_tiny_input(cfg):
    """Build the model, run a forward pass over a few ids and check what comes out."""
    params = init_params(cfg, seed=0)
    ids = np.arange(min(3, cfg.context_len)) % cfg.vocab_size
    logits, _ = forward(params, ids, cfg)
    assert logits.shape == (len(ids), cfg.vocab_size) and np.isfinite(logits).all()


@prop(300)
@given(name=st.sampled_from([f.name for f in fields(ModelConfig)]), value=ANYTHING)
def test_a_model_config_value_is_refused_by_name_or_gives_a_model_that_runs(name, value):
    try:
        cfg = BASE.with_(**{name: value})
    except ConfigError as e:
        assert name in str(e)
        return
    assert ModelConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg  # a checkpoint keeps it exactly
    if param_count(cfg) <= RUNNABLE_PARAMS:
        runs_on_a_tiny_input(cfg)


@prop()
@given(values=st.dictionaries(st.text(max_size=12).filter(lambda k: k not in BASE.to_dict()), ANYTHING, min_size=1))
def test_unknown_model_config_keys_are_refused_by_name(values):
    with pytest.raises(ConfigError, match="unknown model configuration keys") as caught:
        ModelConfig.from_dict({**BASE.to_dict(), **values})
    assert all(k in str(caught.value) for k in values)


TRAIN_BASE = TrainConfig(steps=3, batch_size=2, warmup=1, eval_every=1, ckpt_every=1)


@prop(300)
@given(name=st.sampled_from([f.name for f in fields(TrainConfig)]), value=ANYTHING)
def test_a_train_config_value_is_refused_by_name_or_gives_a_schedule(name, value):
    try:
        cfg = TrainConfig(**{**asdict(TRAIN_BASE), name: value})
    except ConfigError as e:
        assert name in str(e)
        return
    assert TrainConfig.from_dict(json.loads(json.dumps(asdict(cfg)))) == cfg  # a checkpoint keeps it exactly
    cfg.adamw()
    for step in (0, cfg.warmup, cfg.steps - 1):
        lr = lr_at(step, cfg.lr, cfg.warmup, cfg.steps, cfg.min_lr)
        assert math.isfinite(lr) and lr >= 0


LORA_VALUES = st.one_of(ANYTHING, st.lists(st.sampled_from([*TARGETS, "x", ""]), max_size=3).map(tuple))


@prop(200)
@given(name=st.sampled_from(["rank", "alpha", "targets"]), value=LORA_VALUES)
def test_a_lora_config_value_is_refused_by_name_or_gives_adapters_that_run(name, value):
    base_cfg = BASE.with_(emb_dim=6, num_heads=2)
    values = {"rank": 2, "alpha": 4.0, "targets": ("q", "v"), name: value}
    try:
        lora = LoRAConfig(**values)
        shapes = adapter_shapes(param_shapes(base_cfg), lora)  # a rank too large for a weight is refused here
    except ConfigError as e:
        assert f"lora {name}" in str(e) or (name == "rank" and "rank" in str(e))
        return
    saved = json.loads(json.dumps(asdict(lora)))  # as an adapter file keeps it, and load_adapter rebuilds it
    assert LoRAConfig(saved["rank"], saved["alpha"], tuple(saved["targets"])) == lora
    adapters = init_adapters(param_shapes(base_cfg), lora, seed=0)
    assert {k: v.shape for k, v in adapters.items()} == shapes
    ids = np.array([1, 2, 3])
    loss, grads = adapter_loss_and_grads(init_params(base_cfg, seed=0), adapters, ids, (ids + 1) % 5, base_cfg, lora)
    assert math.isfinite(loss) and all(np.isfinite(g).all() for g in grads.values())


# ------------------------------------------------------------------ random small models

@st.composite
def small_configs(draw, max_heads=3, max_head_dim=3):
    """A random tiny model: every size from 1, heads dividing the width, each activation and attention."""
    heads = draw(st.integers(1, max_heads))
    return ModelConfig(
        vocab_size=draw(st.integers(1, 7)), context_len=draw(st.integers(1, 6)),
        emb_dim=heads * draw(st.integers(1, max_head_dim)), num_heads=heads, num_layers=draw(st.integers(1, 2)),
        ff_dim=draw(st.integers(1, 8)), activation=draw(st.sampled_from(["relu", "gelu"])),
        attention=draw(st.sampled_from(["materialized", "flash"])), flash_tile=draw(st.integers(1, 3)),
        checkpoint_blocks=draw(st.booleans()))


# Decoding computes each position's logits with the forward's operations grouped differently (one row at a
# time, keys gathered from pages); in float64 the two agree to about 1e-15 at these widths, so 1e-12 of the
# logits' scale leaves a margin of 1e3 and none for a wrong position, mask or cached row.
DECODE_REL = 1e-12


def assert_same_logits(ours, full, what):
    scale = max(1.0, float(np.abs(full).max()))
    np.testing.assert_allclose(ours, full, rtol=0, atol=DECODE_REL * scale, err_msg=what)


@prop(60)
@given(data=st.data(), cfg=small_configs())
def test_contiguous_cache_decoding_equals_recomputation(data, cfg):
    params = init_params(cfg, seed=data.draw(st.integers(0, 9)))
    ids = data.draw(st.lists(st.integers(0, cfg.vocab_size - 1), min_size=1, max_size=cfg.context_len))
    n_prompt = data.draw(st.integers(1, len(ids)))
    full, _ = forward(params, np.array(ids), cfg)
    cache = KVCache(cfg, np.float64)
    assert_same_logits(prefill(params, ids[:n_prompt], cache, cfg), full[n_prompt - 1], "prefill")
    for t in range(n_prompt, len(ids)):
        assert_same_logits(decode_step(params, ids[t], cache, cfg), full[t], f"decode step at position {t}")


@prop(60)
@given(data=st.data(), cfg=small_configs())
def test_paged_batched_decoding_of_requests_equals_recomputation(data, cfg):
    """Several requests, each prefilled to its own length, then decoded together while any has tokens left."""
    params = init_params(cfg, seed=data.draw(st.integers(0, 9)))
    token = st.integers(0, cfg.vocab_size - 1)
    texts = data.draw(st.lists(st.lists(token, min_size=1, max_size=cfg.context_len), min_size=1, max_size=3))
    pool = PagePool(cfg, 3 * cfg.context_len, data.draw(st.integers(1, 4)), np.float64)
    caches = [PagedCache(pool, cfg.context_len) for _ in texts]
    for text, cache in zip(texts, caches):
        n = data.draw(st.integers(1, len(text)))
        assert_same_logits(prefill(params, text[:n], cache, cfg), forward(params, np.array(text[:n]), cfg)[0][-1],
                           f"prefill of {text[:n]}")
    while live := [r for r, text in enumerate(texts) if caches[r].length < len(text)]:
        logits = decode_batch(params, [texts[r][caches[r].length] for r in live], [caches[r] for r in live], cfg)
        for r, row in zip(live, logits):
            prefix = texts[r][:caches[r].length]
            assert_same_logits(row, forward(params, np.array(prefix), cfg)[0][-1], f"request {r} at {prefix}")
    for cache in caches:
        cache.release()
    assert len(pool.free) == pool.num_pages


@prop(12)
@given(data=st.data(), cfg=small_configs(max_heads=2, max_head_dim=2))
def test_float64_gradient_check_passes_on_random_small_configs(data, cfg):
    shape = (data.draw(st.integers(1, 2)), data.draw(st.integers(1, cfg.context_len)))
    token = st.integers(0, cfg.vocab_size - 1)
    ids = np.array(data.draw(st.lists(token, min_size=shape[0] * shape[1], max_size=shape[0] * shape[1]))).reshape(shape)
    targets = np.array(data.draw(st.lists(token, min_size=ids.size, max_size=ids.size))).reshape(shape)
    report = gradcheck_model(cfg, ids, targets, seed=data.draw(st.integers(0, 9)), perturb=0.1)
    failing = {name: gaps for name, gaps in report.items() if not check_passes(*gaps)}
    assert not failing, f"{cfg}: {failing}"
