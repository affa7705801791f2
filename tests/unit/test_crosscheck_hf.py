"""transformers' GPT-2 in the cross-check: compared in GPT-2's layout on every parameter, skipped with a reason in
another layout, and a wrong gradient shows in its own column."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformer.cli import main  # noqa: E402
from transformer.config import GPT2_LAYOUT, PRESETS  # noqa: E402
from transformer.crosscheck import run_crosscheck  # noqa: E402
from transformer.model import param_shapes  # noqa: E402

GPT2_FLAGS = ["--activation", "gelu_tanh", "--tied-head", "--no-head-bias"]


def test_in_gpt2_layout_every_gradient_logits_and_loss_match_transformers():
    report = run_crosscheck(["cpu"], **GPT2_LAYOUT)
    rows = [r for r in report["rows"] if r["check"].startswith("transformers")]
    names = set(param_shapes(PRESETS["default"].with_(**GPT2_LAYOUT)))
    assert {r["tensor"] for r in rows if r["check"] == "transformers gradient"} == names
    assert {r["tensor"] for r in rows if r["check"] == "transformers"} == {"logits", "loss"}
    # float64 rounding; the key bias's gradient is zero in exact arithmetic (softmax ignores a shift shared by
    # a query's scores), so both sides hold noise there and only its absolute gap is small
    key_bias = [r for r in rows if r["tensor"].endswith(".bk")]
    assert key_bias and max(r["max_abs"] for r in key_bias) < 1e-15
    assert max(r["max_rel"] for r in rows if r not in key_bias) < 1e-12 and all(r["passed"] for r in rows)
    assert report["transformers"].startswith("transformers ") and report["passed"]


def test_another_layout_is_not_compared_and_the_report_says_why():
    report = run_crosscheck(["cpu"])
    assert not any(r["check"].startswith("transformers") for r in report["rows"])
    assert report["transformers"].startswith("not compared") and "head_bias=True" in report["transformers"]


def test_a_wrong_gradient_fails_only_the_transformers_column(monkeypatch, capsys):
    """Negative control: the reference's tok_emb gradient 1e-6 too large, as the NumPy side of the transformers
    rows sees it, fails "NumPy vs HF" for tok_emb and nothing else."""
    import transformer.crosscheck_hf as crosscheck_hf

    real = crosscheck_hf.loss_and_grads

    def one_gradient_wrong(*args, **kwargs):
        loss, grads = real(*args, **kwargs)
        return loss, {**grads, "tok_emb": grads["tok_emb"] * (1 + 1e-6)}

    monkeypatch.setattr(crosscheck_hf, "loss_and_grads", one_gradient_wrong)
    code = main(["crosscheck", "--devices", "cpu", "--verbose", *GPT2_FLAGS])
    out = capsys.readouterr().out
    assert code == 1
    header = next(line for line in out.splitlines() if line.startswith("device") and "engine vs torch" in line)
    assert header.split()[-4:] == ["NumPy", "vs", "HF", "result"]
    failing = [line for line in out.splitlines() if line.startswith("cpu ") and "FAIL" in line]
    assert len(failing) == 2 and failing[0].startswith("cpu    tok_emb ") and failing[0].endswith("FAIL: NumPy vs HF")
    assert "tok_emb (closest of" in failing[1] and failing[1].endswith("FAIL: 1 of 36")


def test_a_device_without_the_transformers_rows_shows_n_a_in_that_column():
    """The columns are the report's; a device that lacks one (a run cut short, say) shows n/a there and is judged
    by its other comparisons."""
    from transformer.crosscheck_report import format_report

    report = run_crosscheck(["cpu"], **GPT2_LAYOUT)
    other = [dict(r, device="other") for r in report["rows"] if r["check"] != "transformers gradient"]
    report["rows"] += other
    lines = [line for line in format_report(report).splitlines() if line.startswith("other ") and "closest" in line]
    gradient_line = next(line for line in lines if line.split()[1] in param_shapes(PRESETS["default"]))
    gaps = gradient_line.split("(closest of 36)")[1].split()
    assert gaps[3] == "n/a" and gaps[4] == "pass" and all(float(g) < 1e-12 for g in gaps[:3])

