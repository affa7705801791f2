"""The PyTorch cross-check: every device found agrees with the NumPy reference,
missing devices are listed with a reason, and a wrong backward is caught."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from transformer.cli import main  # noqa: E402
from transformer.crosscheck import DEVICES, TOLERANCES, Row, discover_devices, run_crosscheck  # noqa: E402
from transformer.model import param_shapes  # noqa: E402
from transformer.config import PRESETS  # noqa: E402

FOUND = {name: (dev, dtype, reason) for name, dev, dtype, reason in discover_devices(DEVICES)}


def require(device):
    dev, _, reason = FOUND[device]
    if dev is None:
        pytest.skip(f"{device}: {reason}")


def categories(report):
    """(check as a reader names it, tensor) of every row: ("adamw step 3", "b0.wq")."""
    return {(Row(**r).label, r["tensor"]) for r in report["rows"]}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_device_agrees_with_the_numpy_reference(device, activation):
    require(device)
    report = run_crosscheck([device], activation=activation)
    failed = [r for r in report["rows"] if not r["passed"]]
    assert report["passed"], failed[:5]
    seen = categories(report)
    names = list(param_shapes(PRESETS["default"]))
    assert ("forward", "logits") in seen and ("loss", "loss") in seen
    assert all(("gradient", n) in seen for n in names)
    assert all(("autograd", n) in seen for n in names)  # the engine's gradients, a third computation
    assert report["autograd"]["passed"] and report["autograd"]["max_rel"] < 1e-12
    assert all((f"adamw step {s}", n) in seen for s in range(1, 11) for n in names)
    if FOUND[device][1] == "float64":
        assert all((f"train step {s}", n) in seen for s in range(1, 11) for n in names)
    intermediates = {t for c, t in seen if c == "intermediate"}
    assert intermediates == {"embedding", "lnf"} | {f"b{l}.{k}" for l in range(2)
                                                   for k in ("ln1", "attention", "ln2", "out")}
    assert any(c == "kv-cache" for c, _ in seen)


def test_float32_path_passes_on_the_cpu_with_its_own_tolerance():
    """MPS and TPU run in float32; the CPU can run that path too, so it is tested everywhere."""
    report = run_crosscheck(["cpu"], dtype="float32")
    assert report["passed"], [r for r in report["rows"] if not r["passed"]][:5]
    assert {r["tol_rel"] for r in report["rows"]} == {TOLERANCES["float32"].rel}
    # float32 really was used: the gaps are far above float64's.
    assert max(r["max_rel"] for r in report["rows"]) > 1e-8


def test_float64_gaps_are_near_rounding_level():
    """The tolerance (1e-9) is not what makes float64 pass: the gaps are rounding.

    The exception is the training trajectory of the key biases, whose zero
    gradient lets Adam amplify rounding noise (see crosscheck.check_training).
    """
    report = run_crosscheck(["cpu"])
    def zero_gradient(r):  # the key-bias gradient is rounding noise on both sides
        return r["check"] in ("gradient", "autograd", "flash", "checkpointed") and r["tensor"].endswith(".bk")

    rows = [r for r in report["rows"] if not r["check"].startswith("train step") and not zero_gradient(r)]
    assert len(rows) > 400 and max(r["max_rel"] for r in rows) < 1e-13
    trajectory = [r for r in report["rows"] if r["check"].startswith("train step")]
    assert max(r["max_rel"] for r in trajectory if not r["tensor"].endswith(".bk")) < 1e-11


def test_missing_devices_are_listed_with_a_reason():
    report = run_crosscheck(list(DEVICES))
    listed = {d["device"]: d for d in report["devices"]}
    assert set(listed) == set(DEVICES)
    for name, (dev, _, _) in FOUND.items():
        if dev is None:
            assert listed[name]["status"] == "not available"
            assert "not available on this machine" in listed[name]["reason"]
        else:
            assert listed[name]["status"] == "checked"


def layer_norm_backward_without_mean_term(dy, cache):
    """LayerNorm backward with term 2 (the path through the mean) dropped."""
    xhat, rstd, g = cache.xhat, cache.rstd, cache.g
    d = xhat.shape[-1]
    dxhat = dy * g
    dx = rstd * (dxhat - xhat * (dxhat * xhat).sum(axis=-1, keepdims=True) / d)
    dg = (dy * xhat).reshape(-1, d).sum(axis=0)
    db = dy.reshape(-1, d).sum(axis=0)
    return dx, dg, db


def test_a_wrong_layer_norm_backward_is_reported(monkeypatch):
    """Negative control: drop one term of the blocks' LayerNorm backward."""
    import transformer.block as block

    monkeypatch.setattr(block, "layer_norm_backward", layer_norm_backward_without_mean_term)
    report = run_crosscheck(["cpu"])
    assert not report["passed"]
    failed = {(r["check"], r["tensor"]) for r in report["rows"] if not r["passed"]}
    assert ("gradient", "tok_emb") in failed and ("gradient", "b0.wq") in failed
    assert ("forward", "logits") not in failed  # the forward pass is still right
    assert ("gradient", "head_w") not in failed  # above the first wrong LayerNorm


def test_optimizer_mistakes_in_the_reference_show_in_the_training_steps(monkeypatch):
    """Negative controls for the torch side's own decay rule, schedule and clipping: a LayerNorm gain
    added to the decayed names, a warm-up that starts at 0, clipping switched off."""
    import transformer.crosscheck as crosscheck
    import transformer.optim as optim

    def failed_checks():
        report = run_crosscheck(["cpu"])
        return {r["check"] for r in report["rows"] if not r["passed"]}

    monkeypatch.setattr(optim, "DECAYED_SUFFIXES", optim.DECAYED_SUFFIXES + ("ln1_g",))
    assert failed_checks() == {"adamw step", "train step"}
    monkeypatch.undo()
    monkeypatch.setattr(crosscheck, "lr_at", lambda step, *args: optim.lr_at(step + 1, *args))
    assert failed_checks() == {"train step"}
    monkeypatch.undo()
    monkeypatch.setattr(crosscheck, "clip_grads", lambda grads, max_norm: (grads, 0.0))
    assert failed_checks() == {"train step"}


def test_the_torch_side_never_calls_our_backward_functions(monkeypatch):
    """Independence: with every NumPy backward broken, torch still computes its gradients."""
    import transformer.block as block
    import transformer.model as model
    from transformer.torch_mirror import to_torch, torch_loss
    from transformer.model import init_params

    def broken(*args, **kwargs):
        raise AssertionError("the torch mirror called a NumPy backward")

    for module in (block, model):
        for name in dir(module):
            if name.endswith("_backward") or name == "backward":
                monkeypatch.setattr(module, name, broken)
    cfg = PRESETS["tiny"]
    tparams = to_torch(init_params(cfg), dtype=torch.float64)
    torch_loss(tparams, np.array([[1, 2, 3]]), np.array([[2, 3, 4]]), cfg).backward()
    assert all(t.grad is not None for t in tparams.values())


def test_crosscheck_command_prints_a_table_writes_json_and_sets_the_status(tmp_path, capsys, monkeypatch):
    path = tmp_path / "report.json"
    code = main(["crosscheck", "--devices", "cpu", "mps", "xla", "--json", str(path)])
    out = capsys.readouterr().out
    assert code == 0 and "PASS" in out and "cpu" in out
    for name in ("mps", "xla"):
        if FOUND[name][0] is None:
            assert f"{name:<5} not available on this machine" in out
    report = json.loads(path.read_text())
    assert report["passed"] and len(report["rows"]) > 100

    import transformer.block as block
    monkeypatch.setattr(block, "layer_norm_backward", layer_norm_backward_without_mean_term)
    code = main(["crosscheck", "--devices", "cpu"])
    out = capsys.readouterr().out
    assert code == 1 and "FAIL" in out


def test_the_memory_policies_are_checked_against_torchs_own():
    """flash against scaled_dot_product_attention, checkpointed against torch.utils.checkpoint, our tiled
    core against torch's flash kernel: every parameter, and the kernel's four tensors."""
    report = run_crosscheck(["cpu"])
    seen = categories(report)
    names = list(param_shapes(PRESETS["default"]))
    for check in ("flash", "checkpointed"):
        assert {"logits", "loss", *names} == {t for c, t in seen if c == check}
    assert {t for c, t in seen if c == "flash kernel"} == {"out", "dq", "dk", "dv"}
    assert "flash kernel in float64" in report["devices"][0]["flash_kernel"]
    assert report["passed"]


def test_a_wrong_flash_backward_and_a_wrong_replay_are_reported(monkeypatch):
    """Negative controls: the tiled backward without its D term fails the flash rows and only those; a
    replay from a nudged input fails the checkpointed rows and only those."""
    import transformer.activation_checkpoint as activation_checkpoint
    import transformer.crosscheck_memory as crosscheck_memory
    import transformer.flash_attention as flash

    real_backward = flash.flash_core_backward

    def without_d(dout, q, k, v, out, *rest):  # out is read for D = rowsum(dO * O) only: D becomes 0
        return real_backward(dout, q, k, v, np.zeros_like(out), *rest)

    def failed_checks():
        return {r["check"] for r in run_crosscheck(["cpu"])["rows"] if not r["passed"]}

    monkeypatch.setattr(flash, "flash_core_backward", without_d)
    monkeypatch.setattr(crosscheck_memory, "flash_core_backward", without_d)
    assert failed_checks() == {"flash", "flash kernel"}
    monkeypatch.undo()
    real_forward = activation_checkpoint.block_forward
    monkeypatch.setattr(activation_checkpoint, "block_forward",
                        lambda x, p, cfg, trace=None: real_forward(x * (1 + 1e-6), p, cfg, trace))
    assert failed_checks() == {"checkpointed"}


def test_paged_decoding_of_several_requests_is_checked_and_a_crossed_table_fails(monkeypatch):
    """Three requests decoded together over pages, past the context limit, against torch's full forward;
    negative control: each request gathers through another request's page table."""
    from transformer.kv_cache import PagePool

    rows = [r for r in run_crosscheck(["cpu"])["rows"] if r["check"] == "paged"]
    assert len(rows) == 3 and all(r["passed"] for r in rows)
    assert any("0 replays" not in r["tensor"] for r in rows)  # the context limit was crossed
    real_table = PagePool.table
    monkeypatch.setattr(PagePool, "table", lambda self, tables, n: real_table(self, tables[::-1], n))
    failed = {r["check"] for r in run_crosscheck(["cpu"])["rows"] if not r["passed"]}
    assert failed == {"paged"}


def test_the_report_shows_every_gradient_three_ways_and_names_the_failing_comparison(monkeypatch, capsys):
    """The engine's gradients are a third column beside NumPy's and torch's. Negative control: one engine
    gradient 1e-6 too large fails "engine vs torch" and "engine vs NumPy" in its row, and nothing else."""
    import transformer.crosscheck as crosscheck

    real = crosscheck.autograd_loss_and_grads

    def one_gradient_wrong(*args, **kwargs):
        loss, grads = real(*args, **kwargs)
        grads["b1.ff1_w"] = grads["b1.ff1_w"] * (1 + 1e-6)
        return loss, grads

    monkeypatch.setattr(crosscheck, "autograd_loss_and_grads", one_gradient_wrong)
    code = main(["crosscheck", "--devices", "cpu", "--verbose"])
    out = capsys.readouterr().out
    assert code == 1
    header = next(line for line in out.splitlines() if "engine vs torch" in line and line.startswith("device"))
    assert header.split()[2:] == ["NumPy", "vs", "torch", "engine", "vs", "torch", "engine", "vs", "NumPy", "result"]
    rows = {line.split()[1]: line for line in out.splitlines() if line.startswith("cpu ") and "closest" not in line
            and len(line.split()) >= 6 and line.split()[1] in param_shapes(PRESETS["default"])}
    assert len(rows) == len(param_shapes(PRESETS["default"]))  # every parameter, one row each
    assert rows["b1.ff1_w"].endswith("FAIL: engine vs torch, engine vs NumPy")
    assert rows["head_w"].endswith("pass") and rows["b0.bk"].endswith("pass (abs)")
    assert "cpu    b1.ff1_w (closest of 38)" in out and "FAIL: 1 of 38" in out
