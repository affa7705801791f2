"""The Attention and Transformer Block pages: their step-by-step derivations agree with the code and with
central differences, their checks catch planted mistakes, and the arithmetic they write out gives the
results they state."""

import math
import re

import numpy as np
import pytest

from site_scripts import sections
from site_scripts.examples import H_STEP
from site_scripts.tiny_backward import tiny_backward
from site_scripts.pages import attention, block
from transformer.gradcheck import check_passes, relative_gap


def written_out(markdown):
    """(expression, stated result, decimals) of each line of the aligned arithmetic blocks of a fragment."""
    found = []
    for body in re.findall(r"\\begin\{aligned\}\n(.*?)\n\\end\{aligned\}", markdown, flags=re.S):
        equations, current = [], ""
        for line in body.split(" \\\\\n"):
            if line.startswith("&") and current:
                current += " " + line.lstrip("&").removeprefix("= ").removeprefix("\\quad ")
            else:
                equations.append(current)
                current = line
        equations.append(current)
        for equation in filter(None, equations):
            parts = equation.split("=")
            result = parts[-1].strip()
            found.append((parts[-2], float(result), len(result.split(".")[1])))
    return found


def evaluate(latex):
    """The number a written-out line of arithmetic stands for."""
    text = re.sub(r"\\underbrace\{(.*?)\}_\{\\text\{[^}]*\}\}", r"(\1)", latex)
    text = re.sub(r"\\tfrac\{1\}\{\\sqrt\{(\d+)\}\}", r"(1/math.sqrt(\1))*", text)
    text = re.sub(r"e\^\{([^}]*)\}", r"math.exp(\1)", text)
    text = text.replace("\\cdot", "*").replace("\\times", "*").replace("\\,", "").replace("&", "")
    text = text.replace("\\quad", "").replace("+ +", "+")
    return eval(text, {"math": math})  # the page's own digits and operators, nothing else


@pytest.mark.parametrize("fragment", [attention.example_md, block.example_md])
def test_the_arithmetic_written_out_on_a_page_gives_the_result_it_states(fragment):
    lines = written_out(fragment())
    assert len(lines) >= 5
    for expression, result, decimals in lines:
        # factors rounded to `decimals` places: a few units of the last place, summed over a handful of terms
        assert evaluate(expression) == pytest.approx(result, abs=3 * 10.0 ** (1 - decimals)), expression


def test_the_arithmetic_check_itself_catches_a_wrong_result():
    """Negative control for the test above: a stated result off by one unit of its second place fails it."""
    (expression, result, decimals), *_ = written_out(attention.example_md())
    assert evaluate(expression) != pytest.approx(result + 0.01, abs=3 * 10.0 ** (1 - decimals))


def test_the_attention_steps_from_the_equations_are_what_attention_backward_computes():
    fw, bw = attention.tiny_steps()
    replay = tiny_backward()
    np.testing.assert_allclose(bw.du1, replay.steps["b0.dln1"][0], rtol=1e-12, atol=1e-15)
    for name, g in bw.grads.items():
        np.testing.assert_allclose(g, replay.grads[f"b0.{name}"], rtol=1e-12, atol=1e-15, err_msg=name)
    np.testing.assert_allclose(sum(bw.terms.values()), bw.du1, rtol=1e-12, atol=1e-15)


def test_the_masked_scores_get_exactly_zero_gradient_and_their_weights_do_not():
    fw, bw = attention.tiny_steps()
    upper = np.triu(np.ones(fw.scores.shape[-2:], dtype=bool), 1)
    assert not bw.dscores[:, upper].any()
    assert np.abs(bw.dalpha[:, upper]).min() > 0  # the zero comes from α = 0, not from ∂ℓ/∂α
    assert "exactly 0" in attention.zeros_md(fw, bw) and "**not zero**" not in attention.zeros_md(fw, bw)


def test_a_softmax_step_without_its_row_sum_term_is_caught_by_the_central_differences():
    """Negative control of the page's central-difference table: ∂ℓ/∂S = α ⊙ ∂ℓ/∂α (the second term dropped)."""
    fw, bw = attention.tiny_steps()
    scores = fw.scores.copy()
    loss = lambda: float(np.sum(attention.from_scores(scores, fw.v, fw.p) * bw.dy))  # noqa: E731
    right, wrong = sections.gradcheck_rows(loss, [("right", bw.dscores, scores),
                                                  ("wrong", fw.alpha * bw.dalpha, scores)], H_STEP)
    assert check_passes(right.gap, right.rel) and not check_passes(wrong.gap, wrong.rel)


def test_every_check_on_the_two_pages_passes_and_every_planted_mistake_is_caught():
    for page in (attention, block):
        text = page.derivation_checks_md()
        for bad in ("**FAIL", "**DIFFER**", "**NOT CAUGHT**", "**not zero**"):
            assert bad not in text, (page.__name__, bad)
        assert text.count("caught") == 3, page.__name__


def test_a_planted_mistake_that_changes_nothing_would_be_reported_as_not_caught():
    """The verdict of a planted mistake reads its gap: a 'mistake' equal to the truth is not caught."""
    assert attention.caught(0.0, 0.0) == "**NOT CAUGHT**" and attention.caught(0.3, 0.5) == "caught"


def test_the_block_page_interprets_its_numbers_from_the_same_arrays():
    fw, steps = block.forward_steps(), tiny_backward().steps
    ratio = np.linalg.norm(fw.out - fw.x) / np.linalg.norm(fw.x)
    assert f"= {ratio:.2f} (Frobenius" in block.growth_md(fw)
    share = steps["b0.din"] - steps["b0.dout"]
    assert f"ranges from {share.min():.4f} to {share.max():.4f}" in block.shares_md(steps)
    assert relative_gap(fw.out, block.tiny().trace["b0.out"][0]) < 1e-12


def test_the_block_page_prints_the_branch_terms_its_backward_trace_adds():
    """The trace of ∂ℓ/∂X_00 adds two branch terms: each is an entry of a table the page prints (and the table of
    another difference, ∂ℓ/∂X − ∂ℓ/∂X^(l+1), is not what it prints)."""
    steps, text = tiny_backward().steps, block.example_md()
    ffn_part, attn_part = block.branch_terms(steps)
    for label, term in ((r"\partial\ell/\partial M - \partial\ell/\partial X^{(l+1)}", ffn_part),
                        (r"\partial\ell/\partial X - \partial\ell/\partial M", attn_part)):
        assert attention.latex_table(label, term, decimals=attention.BACK) in text, label
    both = (steps["b0.din"] - steps["b0.dout"])[0]
    assert attention.latex_table("x", both, decimals=attention.BACK).split("\n", 2)[2] not in text


def test_weight_and_bias_tables_name_input_and_output_units_and_no_empty_symbol():
    """Weights are read W_{i,i'} (row i the input unit) on both pages; a 1-D bias has no row symbol. The attention
    page's bias tables appear only when the biases are not zero, so they are drawn here with moved biases."""
    from site_scripts.examples import biases_moved
    from transformer.block import block_params
    p = biases_moved(block_params(attention.tiny().params, 0), np.random.default_rng(0))
    texts = [attention.weights_md(p), attention.example_md(), block.example_md()]
    for text in texts:
        assert "\\(\\)" not in text and "column \\(j\\)" not in text
    assert texts[0].count("row \\(i\\) (input unit), column \\(i'\\) (output unit)") == 4
    assert texts[0].count("entry \\(i'\\) (output unit)") == 4
    assert texts[2].count("row \\(i\\) (input unit), column \\(i'\\) (output unit)") == 2
