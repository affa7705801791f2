"""The claims of the Optim, Training loop, KV cache, Sampling and Gradient checking pages, and of the why_ffn and
Shakespeare notebooks, read as a test would: each generated sentence reads the arrays it interprets, and the
checks the pages show can fail."""

import re

import numpy as np
import pytest

from site_scripts import sections
from site_scripts.common import ROOT
from site_scripts.pages import gradcheck, kvcache, optim, sampling, training
from site_scripts.sections import GradRow
from transformer.config import PRESETS
from transformer.gradcheck import ABS_FLOOR, REL_TOL, check_passes, numerical_grad, relative_gap
from transformer.model import init_params
from transformer.optim import AdamWConfig, adamw_init, adamw_update, global_norm, lr_at
from transformer.train_config import TrainConfig


# ---------------------------------------------------------------- optim

def test_the_clipping_threshold_of_the_example_is_half_the_norm_and_the_default_is_named():
    table, values = optim.clip()
    norm = global_norm(optim.tiny_grads()[1])
    assert values["limit"] == round(norm / 2, 3) and values["norm"] == norm
    assert f"| {round(norm / 2, 3):g} | this example: half of" in table
    assert f"| {TrainConfig().grad_clip:g} | the training default, `TrainConfig().grad_clip` |" in table
    assert "no (the same arrays back)" in table  # the threshold above the norm leaves the gradients alone


def test_the_decay_fraction_is_the_schedules_rate_times_lambda_and_is_not_fixed():
    tc, (table, values) = TrainConfig(), optim.schedule()
    for s in (0, tc.warmup, tc.steps):
        rate = lr_at(s, tc.lr, tc.warmup, tc.steps, tc.min_lr)
        assert f"| {s} | {optim.schedule_branch(s, tc)} | {rate:.6f} | {rate * tc.weight_decay:.2e} |" in table
    assert values["hi"] / values["lo"] > 10  # "the shrinking follows the schedule"


def test_the_whole_schedule_is_continuous_where_its_branches_meet():
    """The page says so; a warm-up ending below the peak or a cosine missing the floor would break it."""
    tc = TrainConfig()
    at = lambda s: lr_at(s, tc.lr, tc.warmup, tc.steps, tc.min_lr)  # noqa: E731
    assert at(tc.warmup - 1) == pytest.approx(tc.lr) and at(tc.warmup) == pytest.approx(tc.lr)
    assert at(tc.steps - 1) == pytest.approx(tc.min_lr, rel=1e-3) and at(tc.steps) == tc.min_lr
    assert [optim.schedule_branch(s, tc) for s in (tc.warmup - 1, tc.warmup, tc.steps)] == ["warm-up", "cosine",
                                                                                           "floor"]


def test_the_first_update_is_written_out_from_the_arrays_and_its_formula_needs_the_decay_term():
    tables, values = optim.example()
    assert re.search(r"\| `head_w` \| yes \| \S+ \| pass \|", tables["agreement"])
    entry = values["entry"]
    assert entry["decay"] + entry["adam"] == pytest.approx(entry["total"], abs=1e-15)
    assert f"{entry['total']:.6f}" == f"{entry['change']:.6f}"  # the sum the page writes is the table's change
    params, grads = optim.tiny_grads()
    theta, opt = params["head_w"].copy(), AdamWConfig()
    adamw_update(params, grads, adamw_init(params), opt.lr, opt)
    without_decay = optim.first_update(theta, grads["head_w"], opt.lr, opt, decayed=False)  # negative control
    assert "FAIL" in sections.agreement(params["head_w"] - theta, without_decay)[1]
    assert f"| {theta[0, 0]:.4f} |" in tables["theta_head_w"]  # θ before the step is shown
    assert values["against"] == "yes" and values["lnf_hi"] <= opt.lr  # "about η_s against the sign of g"


def test_the_pictures_run_shows_what_its_sentences_say():
    """The trajectory's sentences: the loss falls, the step stays near η while |g| shrinks, m changes sign after g
    (momentum), the dots sit off the line by λθ, and its first step is the example's written-out change."""
    rec, opt = optim.adamw_run(), AdamWConfig()
    _, values = optim.trajectory()
    assert values["loss_last"] < values["loss_first"]
    assert values["g_flip"] is not None and values["m_flip"] is not None and values["m_flip"] > values["g_flip"]
    assert values["ratio_at_lo"] > 10 * values["g_lo"] / values["g_hi"]  # the step shrank far less than |g|
    n = np.arange(1, len(rec["g"]) + 1)
    adam = -(rec["m"] / (1 - opt.beta1 ** n)) / (np.sqrt(rec["v"] / (1 - opt.beta2 ** n)) + opt.eps)
    theta_before = rec["theta"] - rec["step"]
    np.testing.assert_allclose(rec["step"] / opt.lr - adam, -opt.weight_decay * theta_before, atol=1e-9)
    assert rec["step"][0] == pytest.approx(optim.example()[1]["entry"]["change"], abs=1e-15)


def test_the_optim_prose_binds_to_its_values():
    from site_scripts import prose

    text = (ROOT / "docs" / "training" / "optim.md").read_text()
    assert prose.typed_numbers(text) == []
    prose.bind(text, prose.plain(optim.generate({})["values"]), "optim")


def test_lr_at_tests_the_floor_before_the_cosine_and_the_max_never_changes_a_value():
    """The page's order of the branches and its claim about max(1, ·), on runs where the order matters."""
    assert lr_at(5, 1.0, 5, 5, 0.1) == 0.1  # N_w = N_s: s = N_s takes the floor, before any division
    assert lr_at(7, 1.0, 10, 5, 0.1) == pytest.approx(0.8)  # N_w > N_s: still warming up past N_s
    for warmup, total in [(1, 2), (3, 10), (200, 2000)]:
        for s in range(warmup, total):
            cosine = 0.1 + 0.45 * (1 + np.cos(np.pi * (s - warmup) / (total - warmup)))  # no max(1, ·)
            assert lr_at(s, 1.0, warmup, total, 0.1) == pytest.approx(cosine, abs=1e-15)


# ---------------------------------------------------------------- training

def test_the_first_loss_is_recomputed_from_the_runs_own_start_and_splits_exactly():
    cfg, tc = training.run_config()
    steps, _ = training.run_records(cfg, tc)
    first = training.initial_loss(cfg, tc, steps[0]["loss"])
    assert first["diff"] < 1e-12
    loss, spread, lead, _ = training.first_batch_loss_parts(cfg, tc)
    assert spread >= 0 and loss == pytest.approx(first["first"], abs=1e-12)
    assert np.log(cfg.vocab_size) + spread - lead == pytest.approx(loss, abs=1e-12)
    # the page's words: the loss is above log n_V, the targets' logits stand above their rows' means, and the
    # spread costs more than that lead gains
    assert first["first"] > first["log_v"] and spread > lead > 0


def test_the_training_pages_sentences_hold_for_its_numbers():
    """The split's sizes, the last start and the validation windows' targets, as the page states them; and the
    run's validation loss falls."""
    _, corpus = training.example()
    assert corpus["train"] + corpus["val"] == corpus["n_c"] and corpus["cut"] == int(corpus["n_c"] * corpus["fraction"])
    assert corpus["last_start"] == corpus["train"] - corpus["window"] - 1
    assert corpus["val_targets"] == corpus["val"] - 1  # every token of the split but the first
    cfg, tc = training.run_config()
    _, evals = training.run_records(cfg, tc)
    assert evals[-1]["val_loss"] < evals[0]["val_loss"]


def test_a_first_batch_from_another_start_does_not_reproduce_the_recorded_loss():
    """Negative control: the match above is not automatic."""
    cfg, tc = training.run_config()
    other = training.first_batch_loss_parts(cfg, tc.__class__(**{**tc.__dict__, "seed": tc.seed + 1}))[0]
    assert abs(other - training.first_batch_loss_parts(cfg, tc)[0]) > 1e-6


# ---------------------------------------------------------------- kv cache

def follows_the_formula(counts, d):
    """The page's sentence: step t costs exactly 2(t+1)d multiply-adds with the cache and 2(t+1)²d without."""
    return counts == [(2 * (t + 1) * d, 2 * (t + 1) ** 2 * d) for t in range(len(counts))]


@pytest.mark.parametrize("preset", ["tiny", "default"])
def test_the_attention_counts_read_off_the_arrays_are_linear_with_the_cache_and_quadratic_without(preset):
    cfg = PRESETS[preset]
    counts = kvcache.attention_counts(init_params(cfg, seed=0), cfg)
    assert len(counts) == cfg.context_len and follows_the_formula(counts, cfg.emb_dim)
    assert not follows_the_formula([(a, a) for a, _ in counts], cfg.emb_dim)  # negative control


def test_the_cost_values_are_the_sums_of_the_counts():
    cfg = PRESETS["default"]
    counts = kvcache.attention_counts(init_params(cfg, seed=0), cfg)
    _, values = kvcache.cost()
    assert values["with"] == sum(c[0] for c in counts) and values["without"] == sum(c[1] for c in counts)
    assert values["cache_size"] == 2 * cfg.num_layers * cfg.context_len * cfg.emb_dim  # "2 L d per position"


def test_the_kv_symbol_records_the_slice_attended_and_names_the_buffer_apart():
    cfg, text = PRESETS["default"], kvcache.symbols_md()
    row = next(line for line in text.splitlines() if line.startswith("| \\(K_{0:t}"))
    t = kvcache.SYMBOL_STEPS - 1
    assert row.endswith(f"| `{(cfg.num_heads, t + 1, cfg.head_dim)}` |")
    assert f"shape `{(cfg.num_heads, cfg.context_len, cfg.head_dim)}`" in row


# ---------------------------------------------------------------- sampling

def test_the_sampling_symbols_are_the_notation_pages():
    text = sampling.symbols_md()
    for symbol in (r"\(\tau\)", r"\(k_{\mathrm{top}}\)", r"\(j\)", r"\(z\)", r"\(p\)"):
        assert f"| {symbol} |" in text


def test_the_sampling_example_says_what_its_draws_show():
    """Each frequency within the page's bound of its probability, lower temperatures sharper, top-k leaving the
    others nothing, and several rows drawn together as each alone in every round."""
    logits, found, _, values = sampling.example()
    assert values["worst"] < values["bound"]
    top = values["top"]
    assert top["low"]["p"] > top["mid"]["p"] > top["high"]["p"]
    probs = found[1.0, values["top_k"]][0]
    assert np.count_nonzero(probs) == values["top_k"]
    together = sampling.rows_together(logits)
    assert together["same"] == together["rounds"]


def test_rows_drawn_with_other_generators_are_caught(monkeypatch):
    """Negative control of rows_together: a sample_rows that shuffles its generators draws other tokens."""
    real = sampling.sample_rows
    monkeypatch.setattr(sampling, "sample_rows", lambda z, t, k, rngs: real(z, t, k, rngs[::-1]))
    logits = sampling.example()[0]
    together = sampling.rows_together(logits)
    assert together["same"] < together["rounds"]


def test_the_sampling_prose_binds_to_its_values():
    from site_scripts import prose

    text = (ROOT / "docs" / "generation" / "sampling.md").read_text()
    assert prose.typed_numbers(text) == []
    prose.bind(text, prose.plain(sampling.generate({})["values"]), "sampling")


# ---------------------------------------------------------------- gradient checking

GRADCHECK_PAGE = ROOT / "docs" / "verification" / "gradcheck.md"


def test_the_verdict_says_when_the_floor_alone_decides():
    assert gradcheck.verdict(1e-10, 1.0) == "pass, **on the floor alone**"
    assert gradcheck.verdict(1e-10, REL_TOL / 10) == "pass"
    assert gradcheck.verdict(10 * ABS_FLOOR, 10 * REL_TOL) == "**fails**"


def test_a_backward_without_the_gain_passes_at_initialisation_and_fails_once_the_gain_is_moved():
    lines = gradcheck.gain_forgotten_md().splitlines()
    rows = [line for line in lines if line.startswith("|") and "the gain left out" in line]
    assert rows[0].endswith("| pass |") and rows[1].endswith("| **fails** |")


def test_the_floor_lets_a_flipped_gradient_through_once_it_is_tiny():
    table, values = gradcheck.floor_blind()
    rows = [line for line in table.splitlines() if line.startswith("|") and "sign flipped" in line]
    assert rows[0].endswith("| **fails** |") and rows[1].endswith("| pass, **on the floor alone** |")
    assert values["rel"] == pytest.approx(2, rel=1e-6) and values["rel_tiny"] == pytest.approx(2, rel=1e-6)


def test_the_floor_values_name_every_row_small_enough_for_the_floor_to_matter():
    """A planted tiny, wrong gradient (gap under the floor, relative gap 2) is listed as floor-decided."""
    rows = [GradRow("big", (4,), 1e-10, 1e-10, "float64", 1e-5), GradRow("planted", (4,), 5e-10, 2.0, "float64", 1e-5)]
    values = gradcheck.floor_values(rows)
    assert (values["count"], values["decided"], values["small"]) == (1, ["planted"], ["planted"])
    assert values["rel_min"] == 2.0 and values["scale_max"] == pytest.approx(2.5e-10)


def test_the_floor_decides_only_the_key_biases_and_every_other_row_passes_on_its_relative_gap():
    """The page says the rows the floor decides are the key biases, and that every other row passes on its
    relative gap."""
    _, rows = gradcheck.model_rows()
    values = gradcheck.floor_values(rows)
    assert values["decided"] == values["small"] == [r.label for r in rows if r.label.endswith(".bk")]
    assert all(r.rel < REL_TOL for r in rows if not r.label.endswith(".bk"))


def test_the_key_bias_sentence_gives_head_hs_score_shift():
    assert "\\(Q^{(h)}_{w,t} \\cdot b_k^{(h)} / \\sqrt{d_h}\\)" in GRADCHECK_PAGE.read_text()


def test_the_steps_read_as_the_page_says():
    """Smooth: the gap falls like Δ² from the largest step to the next and rises again below the best one.
    ReLU: far off while the step straddles its corner, exact up to rounding once it does not."""
    ln, relu = gradcheck.step_gaps(gradcheck.STEPS)
    steps = np.array(gradcheck.STEPS)
    assert 50 < ln[0] / ln[1] < 200 and (steps[0] / steps[1]) ** 2 == pytest.approx(100)
    best = int(np.argmin(ln))
    assert 0 < best < len(steps) - 1 and steps[best] == gradcheck.H_STEP and ln[-1] > ln[best]
    assert all(relu[steps > gradcheck.CORNER] > 1e-3) and relu[best] < REL_TOL


def test_the_worked_entry_passes_and_a_wrong_gradient_fails_by_the_margins_the_page_gives():
    worked = gradcheck.worked()
    assert worked["rel"] < REL_TOL and worked["numeric"] == pytest.approx(worked["analytic"], rel=1e-8)
    _, wrong = gradcheck.wrong_dg()
    assert wrong["times"] > 1 and wrong["real_below"] > 1


def test_the_gradcheck_prose_binds_to_its_values():
    from site_scripts import prose
    text = GRADCHECK_PAGE.read_text()
    assert prose.typed_numbers(text) == []
    prose.bind(text, prose.plain(gradcheck.generate({})["values"]), "gradcheck")


def test_an_error_orthogonal_to_r_cancels_and_a_random_r_catches_it():
    """The page's reason why R is random: a backward off by ξ in the derivatives of the output entries with
    respect to input entry 0 is off by Σ ξ ⊙ R; ξ = (c, −c) cancels against R = 1, not against a random R."""
    rng = np.random.default_rng(0)
    a, x = rng.standard_normal((2, 3)), rng.standard_normal(3)
    xi = np.zeros_like(a)
    xi[:, 0] = [0.5, -0.5]
    verdicts = []
    for r in (np.ones(2), rng.standard_normal(2)):
        numeric = numerical_grad(lambda: float(np.sum((a @ x) * r)), x, 1e-5)
        wrong = (a + xi).T @ r
        verdicts.append(check_passes(float(np.abs(wrong - numeric).max()), relative_gap(wrong, numeric)))
    assert verdicts == [True, False]


# ---------------------------------------------------------------- notebooks and Home

def test_why_ffn_no_longer_claims_a_hyperplane_in_the_input_and_tabulates_its_settings():
    source = (ROOT / "notebooks" / "why_ffn.py").read_text()
    assert "must be separated by a\n# single hyperplane" not in source and "single hyperplane" not in source
    assert 'table(["setting", "value", "what it sets"]' in source
    for name in ("D", "F", "HEADS", "STEPS", "SEEDS", "RATES"):
        assert f'["`{name}`"' in source


def test_the_shakespeare_notebook_quotes_only_what_a_reader_can_find():
    source = (ROOT / "notebooks" / "shakespeare.py").read_text()
    assert "1.84" not in source and "this project's plan" not in source
    assert "https://github.com/karpathy/nanoGPT" in source and "quoted, not rerun" in source


def test_home_no_longer_says_nothing_is_typed_by_hand():
    home = (ROOT / "docs" / "index.md").read_text()
    assert "Nothing is\ntyped in by hand" not in home and "quoted" in home


def test_why_ffn_necessary_and_sufficient_read_the_counts_as_logic():
    from notebooks._ffn_models import ALL_PARTS, necessary_and_sufficient

    with_ffn = {p: p.ffn for p in ALL_PARTS}
    assert necessary_and_sufficient(with_ffn) == ([("FFN",)], [("FFN",)])
    either = {p: p.ln or p.ffn for p in ALL_PARTS}  # neither part is needed, one of them is
    assert necessary_and_sufficient(either) == ([("LN", "FFN")], [("LN",), ("FFN",)])
    only_b = {p: all(p) for p in ALL_PARTS}
    assert necessary_and_sufficient(only_b) == ([("LN",), ("FFN",), ("residual",)], [("LN", "FFN", "residual")])
    assert necessary_and_sufficient({p: False for p in ALL_PARTS}) == ([], [])
    assert necessary_and_sufficient({p: True for p in ALL_PARTS}) == ([], [()])


def test_why_ffn_other_relu_corner_passes_the_gradient_exactly_at_zero():
    from notebooks._ffn_models import relu_backward_at_zero_one
    from transformer.activations import relu_backward, relu_forward

    pre, dy = np.array([-1.5, 0.0, 2.0]), np.array([1.0, 2.0, 3.0])
    assert relu_backward(dy, relu_forward(pre)[1]).tolist() == [0.0, 0.0, 3.0]
    assert relu_backward_at_zero_one(dy, pre).tolist() == [0.0, 2.0, 3.0]


def test_why_ffn_power_iteration_finds_the_largest_eigenvalue_of_the_dense_hessian():
    from notebooks import _ffn_models as m

    sequences, labels = m.task()
    ids, y = sequences[::9], labels[::9]
    p = m.init(3, m.A)
    theta, eps = m.flat(p), 1e-4

    def grad(v):
        return m.flat(m.loss_and_grads(m.unflat(v, p), ids, y, m.A)[1])

    hessian = np.stack([(grad(theta + eps * e) - grad(theta - eps * e)) / (2 * eps) for e in np.eye(theta.size)])
    eigenvalues = np.linalg.eigvalsh((hessian + hessian.T) / 2)
    top = eigenvalues[np.argmax(np.abs(eigenvalues))]
    assert m.top_hessian_eigenvalue(p, ids, y, m.A, iters=200) == pytest.approx(top, rel=1e-3)


def test_why_ffn_outcomes_follow_their_definitions():
    from notebooks import _ffn_models as m

    sequences, labels = m.task()
    train = np.arange(len(sequences))
    p = m.init(0, m.A)
    right = m.predictions(p, sequences, m.A) == labels
    kinds = [m.outcome(m.Run(p, np.array(losses), None, 0), m.A, sequences, labels, train, 3).kind
             for losses in ([0.7, 0.6, 0.5], [0.7, 0.6, np.inf], [0.7, 0.6], [0.7, 0.8, 0.9])]
    assert kinds == [m.FITTED if right.all() else m.STALLED, m.DIVERGED, m.DIVERGED, m.DIVERGED]


def test_why_ffn_calls_a_variant_reliable_only_when_nothing_diverges_and_some_rate_always_fits():
    from notebooks import _ffn_models as m

    def results(kinds):  # kinds[rate index][seed]
        return {(lr, s): m.Outcome(kind, 0.1, None, 1) for lr, row in zip((0.5, 1.0), kinds)
                for s, kind in enumerate(row)}

    F, S, D = m.FITTED, m.STALLED, m.DIVERGED
    text = m.reliability_text(results([[F, F], [S, F]]), "clipped", [0, 1], [0.5, 1.0])
    assert "rate 1: 1 fit, 1 stall, 0 diverge" in text and "**Reliable** on this task" in text
    assert "fits at rate 0.5." in text
    assert "**Not reliable** on this task: 1 run(s) diverge" in m.reliability_text(
        results([[F, F], [S, D]]), "clipped", [0, 1], [0.5, 1.0])
    assert "at no rate does every seed fit" in m.reliability_text(
        results([[F, S], [S, F]]), "clipped", [0, 1], [0.5, 1.0])


def test_why_ffn_power_iteration_gives_nan_where_the_gradient_overflows():
    from notebooks import _ffn_models as m

    sequences, labels = m.task()
    p = {k: v * 1e150 for k, v in m.init(0, m.B).items()}
    with np.errstate(all="ignore"):
        assert np.isnan(m.top_hessian_eigenvalue(p, sequences[:4], labels[:4], m.B, iters=2))


# ---------------------------------------------------------------- softmax and cross-entropy

def test_the_softmax_pages_sentences_hold_for_its_numbers():
    """What the Softmax page says of its numbers: the pictured row's target has its lowest logit; the largest
    Jacobian entry is that of the probability closest to 1/2; the loss is above the rows' average, itself above
    log n_V; the diagonal of the Jacobian is positive and the rest negative; some targets underflow to 0."""
    from site_scripts.examples import TINY_TARGETS
    from site_scripts.pages import softmax

    values = softmax.generate({})["values"]
    ex = softmax.tiny()
    z = ex.trace["logits"][0]
    t = values["backward"]["t"]
    assert int(np.argmin(z[t])) == TINY_TARGETS[t] == values["backward"]["y"]
    forward = values["forward"]
    assert forward["loss"] > forward["over_mean"] > forward["log_nv"]
    row = values["jacobian"]["row"]
    p = softmax.softmax(z[row])
    assert int(np.argmin(np.abs(p - 0.5))) == values["jacobian"]["top"]
    jacobian = softmax.formula_jacobian(p)
    assert np.all(np.diag(jacobian) > 0) and np.all(jacobian[~np.eye(p.size, dtype=bool)] < 0)
    assert 0 < values["fused"]["zeros"] <= values["fused"]["n"]


def test_the_softmax_prose_binds_to_its_values():
    """Every placeholder of docs/model/softmax.md names a value the generator returns, and every value is shown."""
    from site_scripts import prose
    from site_scripts.pages import softmax

    values = softmax.generate({})["values"]
    text = (ROOT / "docs" / "model" / "softmax.md").read_text()
    assert prose.typed_numbers(text) == []
    prose.bind(text, prose.plain(values), "softmax")
