"""The Attention and Transformer Block pages: their step-by-step derivations agree with the code and with
central differences, their checks catch planted mistakes, and the arithmetic they write out gives the
results they state."""

import dataclasses
import math
import re

import numpy as np
import pytest

from site_scripts import prose, sections
from site_scripts.common import ROOT
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
    text = re.sub(r"\\tfrac\{1\}\{\\sqrt\{\s*(\d+)\s*\}\}", r"(1/math.sqrt(\1))*", text)
    text = re.sub(r"e\^\{([^}]*)\}", r"math.exp(\1)", text)
    text = text.replace("\\cdot", "*").replace("\\times", "*").replace("\\,", "").replace("&", "")
    text = text.replace("\\quad", "").replace("+ +", "+")
    return eval(text, {"math": math})  # the page's own digits and operators, nothing else


def attention_page():
    """docs/model/attention.md with its placeholders bound to what the generator returns (the build's binding)."""
    made = attention.generate({})
    return prose.bind((ROOT / "docs" / "model" / "attention.md").read_text(), prose.plain(made["values"]), "attention")


def attention_arithmetic():
    """The arithmetic the Attention page writes out: its display maths after each "Follow one number"."""
    return "\n".join(f"$$\n{body}$$\n" for body in re.findall(r"Follow one number.*?\$\$\n(.*?)\$\$", attention_page(),
                                                                flags=re.S))


def block_arithmetic():
    """The arithmetic the Transformer Block page writes out: its three display-maths fragments."""
    fw, steps = block.forward_steps(), tiny_backward().steps
    return block.follow_forward_md(fw) + "\n".join(block.follow_backward(fw, steps).values())


@pytest.mark.parametrize("fragment", [attention_arithmetic, block_arithmetic])
def test_the_arithmetic_written_out_on_a_page_gives_the_result_it_states(fragment):
    lines = written_out(fragment())
    assert len(lines) >= 5
    for expression, result, decimals in lines:
        # factors rounded to `decimals` places: a few units of the last place, summed over a handful of terms
        assert evaluate(expression) == pytest.approx(result, abs=3 * 10.0 ** (1 - decimals)), expression


def test_the_arithmetic_check_itself_catches_a_wrong_result():
    """Negative control for the test above: a stated result off by one unit of its second place fails it."""
    (expression, result, decimals), *_ = written_out(attention_arithmetic())
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


def attention_checks_text():
    """The Attention page's check tables and its values (verdicts among them), as one text."""
    made = attention.generate({})
    names = ("against_code", "central", "jacobian", "zeros", "three_terms", "gradcheck")
    return "\n".join(made[name] for name in names) + str(made["values"])


def block_checks_text():
    """The Transformer Block page's two check tables, as one text."""
    return "\n".join(block.check_tables(block.forward_steps(), tiny_backward().steps).values())


def test_every_check_on_the_two_pages_passes_and_every_planted_mistake_is_caught():
    for name, text in (("attention", attention_checks_text()), ("block", block_checks_text())):
        for bad in ("**FAIL", "**DIFFER**", "**NOT CAUGHT**", "**not zero**"):
            assert bad not in text, (name, bad)
        assert text.count("caught") == 3, name


def test_a_planted_mistake_that_changes_nothing_would_be_reported_as_not_caught():
    """The verdict of a planted mistake reads its gap: a 'mistake' equal to the truth is not caught."""
    assert attention.caught(0.0, 0.0) == "**NOT CAUGHT**" and attention.caught(0.3, 0.5) == "caught"


def test_the_block_page_interprets_its_numbers_from_the_same_arrays():
    """The values the Block page's prose binds are read from the arrays its tables show; and its words hold: the
    rows LayerNorm hands each branch have a root mean square of 1 (up to epsilon), the attention branch's
    backward term is larger than the identity path's, and the hidden unit followed by hand is one ReLU passes."""
    fw, replay = block.forward_steps(), tiny_backward()
    forward, backward = block.forward_values(fw), block.backward_values(fw, replay.steps, replay.loss)
    assert forward["growth"]["ratio"] == pytest.approx(np.linalg.norm(fw.out - fw.x) / np.linalg.norm(fw.x))
    share = replay.steps["b0.din"] - replay.steps["b0.dout"]
    assert (backward["shares"]["both_lo"], backward["shares"]["both_hi"]) == (share.min(), share.max())
    assert relative_gap(fw.out, block.tiny().trace["b0.out"][0]) < 1e-12
    assert forward["growth"]["sub_dev"] < 1e-3 and backward["shares"]["attn_ratio"] > 1
    assert backward["follow"]["slope"] == 1 and backward["follow"]["g"] > 0


def test_the_block_page_prints_the_branch_terms_its_backward_trace_adds():
    """The trace of ∂ℓ/∂X_00 adds two branch terms: each is an entry of a table the page prints (and the table of
    another difference, ∂ℓ/∂X − ∂ℓ/∂X^(l+1), is not what it prints)."""
    steps = tiny_backward().steps
    text = "\n".join(block.backward_tables(block.forward_steps(), steps).values())
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
    made = attention.generate({})
    texts = [attention.weights_md(p), "\n".join(v for v in made.values() if isinstance(v, str)),
             "\n".join(block.forward_tables(block.forward_steps()).values())]
    for text in texts:
        assert "\\(\\)" not in text and "column \\(j\\)" not in text
    assert texts[0].count("row \\(i\\) (input unit), column \\(i'\\) (output unit)") == 4
    assert texts[0].count("entry \\(i'\\) (output unit)") == 4
    assert texts[2].count("row \\(i\\) (input unit), column \\(i'\\) (output unit)") == 2


def test_the_attention_pages_sentences_hold_for_its_numbers():
    """What the Attention page says of its numbers: the masked weights are exactly 0 and row 0's one weight is 1
    (in the picture and in the tiny example); every bias is 0 at initialisation, so Q = U_1 W_q; row 0 of
    ∂ℓ/∂S is exactly 0 in every head; the steps recomputed from the equations are the code's."""
    values = attention.generate({})["values"]
    picture, forward, backward = values["picture"], values["forward"], values["backward"]
    assert picture["upper"] == 0 and picture["first"] == 1 and picture["uneven"] > 0
    assert forward["upper"] == 0 and forward["bias_max"] == 0 and forward["other_heads"]
    assert backward["row0"] == 0 and backward["du1_verdict"] == "agree"
    assert values["checks"]["jacobian"]["verdict"] == "agree"
    assert forward["y_gap"] < 1e-12 and forward["alpha_gap"] < 1e-12


def test_the_attention_prose_binds_and_types_no_measured_number():
    text = (ROOT / "docs" / "model" / "attention.md").read_text()
    assert prose.typed_numbers(text) == []
    assert "{{" not in attention_page()


def test_the_attention_arithmetic_by_hand_is_refused_when_it_disagrees_with_the_code():
    """Negative control of the generator's own check: a forward whose weights were not the code's is refused."""
    fw, _ = attention.tiny_steps()
    wrong = dataclasses.replace(fw, alpha=fw.alpha * 1.01)
    with pytest.raises(RuntimeError, match="by hand disagrees"):
        attention.follow_forward(wrong)
