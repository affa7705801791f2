import numpy as np
import pytest

from transformer.config import PRESETS
from transformer.errors import InputError
from transformer.generate import KVCache, decode_step, generate, sample_next, sample_rows
from transformer.model import forward, init_params


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_kv_cache_logits_equal_full_recomputation(activation):
    """Each cached step must give the logits of running the whole prefix again."""
    cfg = PRESETS["default"].with_(vocab_size=11, context_len=12, activation=activation)
    params = init_params(cfg, seed=1)
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, cfg.context_len)
    cache = KVCache(cfg, np.float64)
    full_logits, _ = forward(params, ids, cfg)
    for t, token in enumerate(ids):
        step_logits = decode_step(params, int(token), cache, cfg)
        np.testing.assert_allclose(step_logits, full_logits[t], rtol=0, atol=1e-10)
    with pytest.raises(InputError, match="cache is full"):
        decode_step(params, 0, cache, cfg)


def test_generation_beyond_the_context_slides_the_window_and_matches_recomputation():
    cfg = PRESETS["tiny"]
    params = init_params(cfg, seed=2)
    prompt = [1, 2]
    new, drawn_from = generate(params, cfg, prompt, 9, temperature=1.0, seed=5, return_logits=True)
    ids = prompt + new
    assert len(new) == 9 and all(0 <= i < cfg.vocab_size for i in new)
    for i, logits in enumerate(drawn_from):
        window = ids[:len(prompt) + i][-cfg.context_len:]  # what the model may see
        expected = forward(params, np.array(window), cfg)[0][-1]
        np.testing.assert_allclose(logits, expected, rtol=0, atol=1e-10)


def test_a_prompt_longer_than_the_context_uses_its_last_window():
    cfg = PRESETS["tiny"]
    params = init_params(cfg, seed=2)
    long_prompt = [0, 1, 2, 3, 4, 0, 1]
    _, drawn = generate(params, cfg, long_prompt, 1, return_logits=True)
    np.testing.assert_allclose(drawn[0], forward(params, np.array(long_prompt[-4:]), cfg)[0][-1], atol=1e-12)


def test_generation_is_reproducible_per_seed():
    cfg = PRESETS["tiny"]
    params = init_params(cfg, seed=0)
    a = generate(params, cfg, [0], 20, seed=3)
    assert a == generate(params, cfg, [0], 20, seed=3)
    assert a != generate(params, cfg, [0], 20, seed=4)


def test_temperature_zero_is_greedy_and_top_1_is_greedy_too():
    logits = np.array([0.1, 2.0, -1.0, 1.9])
    rng = np.random.default_rng(0)
    assert sample_next(logits, 0, None, rng) == 1
    assert {sample_next(logits, 1.0, 1, rng) for _ in range(50)} == {1}


def test_top_k_never_draws_outside_the_k_largest():
    logits = np.array([3.0, 2.9, 0.0, -1.0, 2.8])
    rng = np.random.default_rng(0)
    draws = {sample_next(logits, 5.0, 3, rng) for _ in range(400)}
    assert draws == {0, 1, 4}


def test_sampling_frequencies_follow_the_softmax_of_scaled_logits():
    logits = np.log(np.array([0.5, 0.3, 0.2]))
    rng = np.random.default_rng(0)
    n = 20000
    counts = np.bincount([sample_next(logits, 1.0, None, rng) for _ in range(n)], minlength=3)
    # Binomial standard error is at most sqrt(0.25 / n) ~ 0.0035; allow 4 of them.
    np.testing.assert_allclose(counts / n, [0.5, 0.3, 0.2], atol=0.014)
    hot = np.bincount([sample_next(logits, 2.0, None, rng) for _ in range(n)], minlength=3) / n
    expected = np.array([0.5, 0.3, 0.2]) ** 0.5
    np.testing.assert_allclose(hot, expected / expected.sum(), atol=0.014)


@pytest.mark.parametrize("kwargs, message", [
    ({"temperature": -1.0}, "temperature must be a finite number >= 0"),
    ({"temperature": float("nan")}, "temperature must be a finite number >= 0"),
    ({"temperature": True}, "temperature must be a finite number >= 0"),
    ({"top_k": 0}, r"top_k must be an integer in \[1, 5\]"),
    ({"top_k": 6}, r"top_k must be an integer in \[1, 5\]"),
    ({"num_tokens": -3}, "number of tokens must be a non-negative integer"),
    ({"prompt_ids": []}, "prompt must be a non-empty sequence"),
    ({"prompt_ids": [0, 5]}, r"prompt ids must lie in \[0, 5\), found 5"),
    ({"prompt_ids": [0, -1]}, r"prompt ids must lie in \[0, 5\), found -1"),
])
def test_bad_generation_arguments_are_named(kwargs, message):
    cfg = PRESETS["tiny"]
    params = init_params(cfg, seed=0)
    args = {"prompt_ids": [0, 1], "num_tokens": 3, **kwargs}
    with pytest.raises(InputError, match=message):
        generate(params, cfg, **args)


def test_every_prompt_id_is_checked_not_only_the_window():
    cfg = PRESETS["tiny"]
    params = init_params(cfg, seed=0)
    with pytest.raises(InputError, match=r"found -3"):
        generate(params, cfg, [-3] + [1] * 10, 2)


def test_numpy_integers_are_accepted_where_integers_are():
    cfg = PRESETS["tiny"]
    params = init_params(cfg, seed=0)
    assert len(generate(params, cfg, [1], np.int64(3), top_k=np.int64(2))) == 3


def test_parameters_that_do_not_fit_the_config_are_named():
    from transformer.errors import ConfigError

    cfg = PRESETS["tiny"]
    params = init_params(cfg, seed=0)
    with pytest.raises(ConfigError, match="'head_b' is missing"):
        forward({k: v for k, v in params.items() if k != "head_b"}, [1, 2], cfg)
    with pytest.raises(ConfigError, match=r"'head_w' has shape \(4, 4\), the config needs \(4, 5\)"):
        forward({**params, "head_w": np.zeros((4, 4))}, [1, 2], cfg)
    with pytest.raises(ConfigError, match="parameters not in this config: extra"):
        forward({**params, "extra": np.zeros(3)}, [1, 2], cfg)
    with pytest.raises(ConfigError, match="'head_b' is missing"):
        generate({k: v for k, v in params.items() if k != "head_b"}, cfg, [1], 2)


@pytest.mark.parametrize("temperature,top_k", [(1.0, None), (0.7, 5), (2.0, 1), (1e-3, None)])
def test_sample_next_draws_what_rng_choice_draws_from_the_same_stream(temperature, top_k):
    """sample_next draws by the inverse CDF, as Generator.choice(n, p=...) does: two generators with one
    seed, one through sample_next and one through choice on the same probabilities, agree token by token."""
    ours, theirs = np.random.default_rng(7), np.random.default_rng(7)
    logits = np.random.default_rng(0).standard_normal((300, 11))
    for z in logits:
        w = (z - z.max()) / temperature
        if top_k is not None:
            w = np.where(w >= np.partition(w, -top_k)[-top_k], w, -np.inf)
        with np.errstate(under="ignore"):
            p = np.exp(w - w.max())
        assert sample_next(z, temperature, top_k, ours) == theirs.choice(z.size, p=p / p.sum())


@pytest.mark.parametrize("temperature,top_k", [(0, None), (1.0, None), (0.7, 5), (2.0, 1), (1e-3, None),
                                               (1e-320, None)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sample_rows_draws_what_sample_next_draws_from_each_row_alone(temperature, top_k, dtype):
    """Every step of sample_rows works row by row, so 37 rows drawn together for 20 rounds, each row with its
    own generator, give the tokens that sample_next gives on each row alone with a generator of the same seed."""
    logits = (4 * np.random.default_rng(1).standard_normal((37, 65))).astype(dtype)
    together = [np.random.default_rng(i) for i in range(len(logits))]
    alone = [np.random.default_rng(i) for i in range(len(logits))]
    for _ in range(20):
        assert sample_rows(logits, temperature, top_k, together) == [
            sample_next(z, temperature, top_k, rng) for z, rng in zip(logits, alone)]


def test_sample_rows_refuses_logits_that_are_not_rows_and_generators_that_are_not_one_per_row():
    logits = np.zeros((3, 5))
    with pytest.raises(InputError, match=r"shape \(3, 5\) and 2 generator"):
        sample_rows(logits, 0, None, [np.random.default_rng(0)] * 2)  # temperature 0 draws nothing, and still
    with pytest.raises(InputError, match=r"shape \(5,\) and 1 generator"):
        sample_rows(logits[0], 1.0, None, [np.random.default_rng(0)])
    with pytest.raises(InputError, match=r"one row of logits, shape \(n_V,\); got shape \(1, 5\)"):
        sample_next(logits[:1], 1.0, None, np.random.default_rng(0))


@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("temperature,top_k", [(0, None), (1.0, None), (0.7, 2)])
def test_a_nan_or_plus_inf_logit_is_refused_by_name_not_drawn_as_token_zero(bad, temperature, top_k):
    """Left in, either makes every probability of its row NaN, and the draw then returned token 0 (and the
    argmax the NaN's index, or the first +inf) without a word; a diverged model's output must be refused."""
    logits = np.array([[0.5, 1.0, 2.0, -np.inf], [1.0, 2.0, 3.0, bad]], dtype=np.float32)
    with pytest.raises(InputError, match=rf"the logit of token 3 in row 1 is {bad}: a token can be drawn only "):
        sample_rows(logits, temperature, top_k, [np.random.default_rng(0), np.random.default_rng(1)])
    with pytest.raises(InputError, match="in row 0 is"):
        sample_next(logits[1], temperature, top_k, np.random.default_rng(0))


def test_minus_inf_logits_are_masked_tokens_that_are_never_drawn():
    logits = np.array([[-np.inf, 0.0, -np.inf, 0.0]])
    rng = np.random.default_rng(0)
    assert {sample_rows(logits, 1.0, None, [rng])[0] for _ in range(200)} == {1, 3}
