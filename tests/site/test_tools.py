"""The developer tools work: the two mutation runners, the step benchmark's models and the rebuild
benchmark's edit and bookkeeping."""

import ast
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from site_scripts.common import ROOT, cached_json
from site_scripts import bench_rebuild
from tools import bench_kernels, bench_step, bench_train_loop, scale_backward_outputs, vendor
from tools.mutant_catalogue import edit


def test_every_backward_output_becomes_a_mutant_that_compiles():
    found = scale_backward_outputs.find_mutants()
    names = {m.name for m in found}
    for expected in ["layer_norm_backward:dg", "linear_backward:db", "embedding_backward:dtok_emb",
                     "qkv_backward:dx", "attention_backward:grads['wo']",
                     "flash_core_backward:dk", "block_backward:grads['ff2_b']", "block_backward:dx"]:
        assert expected in names
    # A backward that returns another backward's outputs unchanged adds no mutant of its own.
    assert not any(m.function == "checkpointed_block_backward" for m in found)
    for m in found:
        source = (ROOT / m.path).read_text()
        mutated = m.apply(source)
        assert mutated != source and f"* {scale_backward_outputs.FACTOR})" in mutated
        compile(mutated, m.path, "exec")


def test_the_mutation_runner_reports_a_caught_mutant():
    """Negative control of the runner itself: a 0.1% wrong linear db must fail the linear test."""
    mutant = next(m for m in scale_backward_outputs.find_mutants() if m.name == "linear_backward:db")
    _, code, failed = scale_backward_outputs.run_mutant(mutant, ["tests/unit/test_layers.py", "-k", "linear"])
    assert code == 1 and any("linear" in f for f in failed)


def test_benchmark_torch_step_trains_the_same_model():
    """The benchmark's PyTorch step and the NumPy step give the same loss on the same batch."""
    torch = pytest.importorskip("torch")
    from transformer.config import PRESETS
    from transformer.model import init_params, loss_and_grads
    from transformer.torch_mirror import to_torch, torch_loss

    cfg = PRESETS["default"].with_(vocab_size=11)
    params = init_params(cfg, seed=0, dtype=np.float64)
    rng = np.random.default_rng(0)
    ids, targets = rng.integers(0, 11, (3, 8)), rng.integers(0, 11, (3, 8))
    ours, _ = loss_and_grads(params, ids, targets, cfg)
    theirs = torch_loss(to_torch(params, dtype=torch.float64), torch.as_tensor(ids), targets, cfg)
    np.testing.assert_allclose(theirs.item(), ours, rtol=1e-12)


def test_the_step_benchmark_counts_the_matmul_flops_issue_18_counted_by_hand():
    """Issue 18 gives 2.17 GFLOP (config A) and 3.96 GFLOP (config B) of matmuls per training step."""
    from transformer.config import PRESETS

    for name, gflop in (("A", 2.17), ("B", 3.96)):
        assert bench_step.matmul_flops(PRESETS[name], bench_step.BATCH[name]) / 1e9 == pytest.approx(gflop, abs=0.005)


def test_the_step_benchmark_reports_medians_ratio_range_and_floor():
    def runs(*step_ms):
        return [{"times": [t / 1e3] * 5, "pools": ["a pool"], "matmul_rate": 1e11} for t in step_ms]

    lines = bench_step.summary("A", {"numpy": runs(30, 40, 50), "torch": runs(60, 40, 100)})
    text = "\n".join(lines)
    assert "numpy: median 40.0 ms over 3 rounds of 5 steps" in text and "torch: median 60.0 ms" in text
    assert "ratio numpy / torch: 0.67 (rounds 0.50 to 1.00)" in text
    floor_ms = bench_step.matmul_flops(bench_step.PRESETS["A"], 32) / 1e11 * 1e3
    assert f"matmul floor: {floor_ms:.1f} ms at numpy's 100 GFLOP/s" in text
    three = "\n".join(bench_step.summary("A", {"numpy": runs(30, 40, 50), "numpy-threads": runs(45, 60, 75),
                                               "torch": runs(60, 40, 100)}))
    assert "ratio numpy / torch: 0.67" in three and "ratio numpy-threads / torch: 1.00 (rounds 0.75 to 1.50)" in three


def test_the_step_benchmark_reports_each_part_of_the_step_with_its_share():
    def run(shards, clip, adamw, alone):
        return {"parts": {"shards": [shards / 1e3] * 3, "clip": [clip / 1e3] * 3, "AdamW": [adamw / 1e3] * 3},
                "first shard alone": [alone / 1e3] * 3}

    text = "\n".join(bench_step.phases_summary("B", [run(30, 1, 9, 26), run(31, 1, 8, 27), run(29, 2, 10, 25)]))
    assert "medians over 3 rounds of 3 steps, 40.0 ms together" in text  # 30 + 1 + 9
    assert "shards   30.00 ms   75%" in text and "clip      1.00 ms    2%" in text and "AdamW     9.00 ms   22%" in text
    assert "the first shard alone, the other cores idle: 26.00 ms; the shards' 30.00 ms add 4.00 ms to it" in text


def test_the_step_benchmark_times_the_parts_of_the_step_in_fresh_workers(tmp_path):
    """`--phases` prints the three parts of numpy_step's step, each timed (numpy_step is that step without the
    timings)."""
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "bench_step.py"), "--phases", "--configs", "A",
                           "--steps", "2", "--rounds", "1"], capture_output=True, text=True, cwd=tmp_path, check=True)
    parts = re.findall(r"^  (shards|clip|AdamW) +(\d+\.\d+) ms", done.stdout, flags=re.M)
    assert [name for name, _ in parts] == ["shards", "clip", "AdamW"] and all(float(ms) > 0 for _, ms in parts)


def test_each_kernel_the_step_uses_computes_what_the_plain_way_computes():
    """tools/bench_kernels.py times each layout choice of the step against the plain way; both must give the same
    result: the same bits where only the layout or an exact power-of-two scaling differs, and float32 rounding
    where a sum adds in another order: the softmax's row sums, a bias's gradient (1ᵀ dY, BLAS) and LayerNorm's
    row means (einsum). For the last two, both ways stay within the classic bound of a float32 sum of n terms,
    n * eps * sum |x|, of the exact sum, and ours errs by at most 4 times numpy's own sum."""
    for name in ("A", "B"):
        results = {what: (np.asarray(ours()), np.asarray(plain()))
                   for what, ours, plain in bench_kernels.comparisons(name)}
        assert set(results) == {"softmax of the scores", "causal mask added to the scores", "token table's gradient",
                                "global norm", "a bias's gradient, 1ᵀ dY", "LayerNorm's row means"}
        _, _, _, _, dx, _ = bench_kernels.shard_arrays(name)
        rows = dx.reshape(-1, dx.shape[-1]).astype(np.float64)
        sums = {"a bias's gradient, 1ᵀ dY": (rows.sum(axis=0), len(rows) * np.abs(rows).sum(axis=0)),
                "LayerNorm's row means": (dx.astype(np.float64).mean(axis=-1, keepdims=True),
                                          np.abs(dx.astype(np.float64)).sum(axis=-1, keepdims=True))}
        for what, (exact, bound) in sums.items():
            ours, plain = results[what]
            eps = np.finfo(np.float32).eps
            assert ours.shape == plain.shape == exact.shape and ours.dtype == np.float32, what
            assert (np.abs(ours - exact) <= eps * bound).all() and (np.abs(plain - exact) <= eps * bound).all(), what
            # and, far tighter than that bound: no worse than numpy's own sum's error, within a factor of 4
            tiny = eps * np.abs(exact).max()
            assert np.abs(ours - exact).max() <= 4 * np.abs(plain - exact).max() + tiny, what
        for what, (ours, plain) in results.items():
            if what in sums:
                continue
            if what == "softmax of the scores":
                np.testing.assert_allclose(ours, plain, rtol=1e-6, atol=1e-7)
                assert ours.strides != np.ascontiguousarray(ours).strides  # the rows lie down columns
            else:
                assert np.array_equal(ours, plain), what
    assert bench_kernels.gap_text(np.zeros(3), np.zeros(3)) == "same bits"
    assert bench_kernels.gap_text(np.zeros(3), np.array([0.0, 2e-3, 0.0])) == "largest gap 2.0e-03"


def test_the_kernel_benchmark_prints_one_row_per_comparison(capsys):
    bench_kernels.main(["--repeats", "1", "--configs", "A"])
    out = capsys.readouterr().out
    assert "config A, one shard of 16 windows (T=64, d=64, H=4)" in out
    assert out.count("x faster") == 6 and out.count("same bits") >= 3  # the softmax's may differ in the last bit



def test_a_trick_undone_runs_the_plain_way_in_every_caller_and_is_restored_after():
    """`bench_kernels --step` times a step with each layout trick undone by swapping the code of the functions it
    names: inside, the package computes the plain way (a bias's gradient is numpy's row sum, to the bit), callers
    that imported the function by name see it, and on leaving the package's own code is back. An edit that no
    longer fits the code is refused rather than timing the package unchanged."""
    from transformer import linear

    dy = np.random.default_rng(0).standard_normal((5, 7, 3), dtype=np.float32)
    x, w, b = np.ones((5, 7, 2), np.float32), np.ones((2, 3), np.float32), np.zeros(3, np.float32)
    cache = linear.linear_forward(x, w, b)[1]
    ours = linear.linear_backward(dy, cache)[2]
    code = linear.linear_backward.__code__
    edits = dict(bench_kernels.TRICKS)["a bias's gradient as 1ᵀ dY"]
    with bench_kernels.undone(edits):
        plain = linear.linear_backward(dy, cache)[2]
        assert linear.linear_backward.__code__ is not code
    rows = dy.reshape(-1, 3)
    assert np.array_equal(plain, rows.sum(axis=0)) and np.array_equal(ours, np.ones(len(rows), np.float32) @ rows)
    assert linear.linear_backward.__code__ is code
    with pytest.raises(ValueError, match="occurs 0 times"):
        with bench_kernels.undone([edit("transformer/linear.py:linear_backward", "no such text", "x")]):
            pass


def test_the_step_benchmark_of_the_tricks_prints_one_row_per_trick(capsys):
    bench_kernels.main(["--step", "--rounds", "1", "--configs", "A"])
    out = capsys.readouterr().out
    assert out.count("plain/ours") == len(bench_kernels.TRICKS) == 4


# ---------------------------------------------------------------- tools/vendor.py: the site's JavaScript

def _tarball(path, members):
    import io
    import tarfile

    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_the_training_loop_benchmark_starts_both_frameworks_from_the_same_model_and_batch():
    """The demo's first step in both loops: the same initial parameters and the same first batch give the same
    loss, to float32 rounding (torch computes it by its own operations), before any timing is compared."""
    pytest.importorskip("torch")
    times, numpy_loss = bench_train_loop.numpy_loop(2)
    torch_times, torch_loss = bench_train_loop.torch_loop(2)
    assert len(times) == len(torch_times) == 2 and all(t > 0 for t in times + torch_times)
    assert numpy_loss == pytest.approx(torch_loss, rel=1e-5)


def test_the_training_loop_benchmark_reports_medians_after_the_warm_up_and_the_ratio():
    warm = [1.0] * bench_train_loop.WARMUP  # left out: they would otherwise decide the medians
    runs = {"numpy": [{"times": warm + [0.03, 0.03, 0.05], "first_loss": 4.0}],
            "torch": [{"times": warm + [0.02, 0.02, 0.02], "first_loss": 4.0}]}
    lines = bench_train_loop.report(runs)
    assert "numpy: median step 30.0 ms over 1 rounds of 13 steps" in lines[0]
    assert "torch: median step 20.0 ms" in lines[1]
    assert lines[2].startswith("  ratio numpy / torch: 1.50 (rounds 1.50 to 1.50)")


def test_vendor_integrity_is_npms_sha512_string(tmp_path):
    """npm's own record for mathjax 3.2.2 (the registry's dist.integrity) is the hash of the bytes it names;
    here checked on a known input: the SHA-512 of b"abc" from FIPS 180-2, in base64."""
    (tmp_path / "abc").write_bytes(b"abc")
    assert vendor.integrity(tmp_path / "abc") == ("sha512-3a81oZNherrMQXNJriBBMRLm+k6JqX6iCp7u5ktV05ohkpkqJ0/BqDa6PCOj"
                                                  "/uu9RU1EI2Q86A4qmslPpUyknw==")


def test_vendor_refuses_a_tarball_whose_hash_is_not_the_locked_one(tmp_path):
    tarball = _tarball(tmp_path / "p.tgz", {"package/a.js": b"one"})
    locked = vendor.integrity(tarball)
    vendor.check(tarball, "p", locked)
    _tarball(tarball, {"package/a.js": b"two"})  # the same name and version, other bytes
    with pytest.raises(vendor.VendorError, match=f"p: the tarball's SHA-512 is sha512-.*, the lock records {re.escape(locked)}"):
        vendor.check(tarball, "p", locked)


def test_vendor_unpacks_only_the_listed_files_to_the_places_the_lock_names(tmp_path):
    tarball = _tarball(tmp_path / "p.tgz", {"package/dist/x.min.js": b"x", "package/dist/other.js": b"o",
                                            "package/fonts/a.woff": b"a", "package/fonts/sub/b.woff": b"b",
                                            "../escape.js": b"e"})
    vendor.unpack(tarball, {"package/dist/x.min.js": "x.min.js", "package/fonts/": "f/"}, tmp_path / "out")
    got = sorted(str(p.relative_to(tmp_path / "out")) for p in (tmp_path / "out").rglob("*") if p.is_file())
    assert got == ["f/a.woff", "f/sub/b.woff", "x.min.js"]
    with pytest.raises(vendor.VendorError, match="p.tgz has no package/missing.js"):
        vendor.unpack(tarball, {"package/missing.js": "m.js"}, tmp_path / "out")


def test_vendor_refuses_a_file_whose_sha256_is_not_the_locked_one(tmp_path):
    """GPT-2's tokenizer files carry tiktoken's published SHA-256 besides the tarball's hash; here on a known
    input, the SHA-256 of b"abc" from FIPS 180-2."""
    (tmp_path / "vocab.bpe").write_bytes(b"abc")
    abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    vendor.check_files(tmp_path, {"vocab.bpe": abc}, "p")
    (tmp_path / "vocab.bpe").write_bytes(b"abd")
    with pytest.raises(vendor.VendorError, match=f"p: vocab.bpe has SHA-256 [0-9a-f]{{64}}, the lock records {abc}"):
        vendor.check_files(tmp_path, {"vocab.bpe": abc}, "p")


def test_vendor_puts_each_package_in_its_own_folder_and_replaces_only_those(tmp_path, monkeypatch):
    import shutil

    (tmp_path / "src").mkdir()
    tarballs = {"a": _tarball(tmp_path / "src" / "a.tgz", {"package/a.js": b"a"}),
                "b": _tarball(tmp_path / "src" / "b.tgz", {"package/b.txt": b"b"})}
    monkeypatch.setattr(vendor, "npm_pack", lambda name, version, into: Path(shutil.copy(tarballs[name], into)))
    lock = {"a": {"version": "1.0.0", "integrity": vendor.integrity(tarballs["a"]), "files": {"package/a.js": "a.js"}},
            "b": {"version": "1.0.0", "integrity": vendor.integrity(tarballs["b"]), "files": {"package/b.txt": "b.txt"},
                  "into": "data/b"}}
    (tmp_path / "data" / "keep").mkdir(parents=True)
    vendor.install(lock, tmp_path)
    assert (tmp_path / vendor.VENDOR / "a.js").read_bytes() == b"a"
    assert (tmp_path / "data" / "b" / "b.txt").read_bytes() == b"b"
    assert (tmp_path / "data" / "keep").is_dir()  # a folder beside the package's is left alone


def test_vendor_lock_names_exact_versions_and_full_hashes():
    import json

    for name, entry in json.loads(vendor.LOCK.read_text()).items():
        assert re.fullmatch(r"\d+\.\d+\.\d+", entry["version"]), name
        assert re.fullmatch(r"sha512-[A-Za-z0-9+/]{86}==", entry["integrity"]), name


# ---------------------------------------------------------------- constraints.txt: the Python lock

def _lock_disagreements(pyproject_text, lock_text, installed=None):
    """What keeps a lock from being the complete pin set of a pyproject: each of its requirements
    unpinned or pinned outside its range, and each locked package installed at another version."""
    import importlib.metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import Version

    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads(pyproject_text)["project"]
    wanted = [*project["dependencies"], *(r for extra in project["optional-dependencies"].values() for r in extra)]
    pins = dict(line.split("==", 1) for line in lock_text.splitlines() if re.match(r"^[A-Za-z0-9._-]+==", line))
    pins = {canonicalize_name(name): Version(version) for name, version in pins.items()}
    problems = [f"the lock pins a path or URL: {line}" for line in lock_text.splitlines() if " @ " in line]
    for req in map(Requirement, wanted):
        name = canonicalize_name(req.name)
        if name == canonicalize_name(project["name"]):
            continue  # an extra naming other extras
        if name not in pins:
            problems.append(f"{req} is not pinned")
        elif not req.specifier.contains(pins[name], prereleases=True):
            problems.append(f"{req} excludes the pinned {pins[name]}")
    for name, pinned in pins.items():
        try:
            have = Version((installed or importlib.metadata.version)(name))
        except importlib.metadata.PackageNotFoundError:
            continue  # an extra this environment did not install (the browser tests')
        if have.public != pinned.public:
            problems.append(f"{name} {have} is installed, the lock pins {pinned}")
    return problems


def test_the_lock_pins_every_requirement_within_its_range_and_is_what_is_installed():
    assert _lock_disagreements((ROOT / "pyproject.toml").read_text(), (ROOT / "constraints.txt").read_text()) == [], (
        "run tools/lock")


def test_a_lock_that_disagrees_with_pyproject_is_caught():
    pyproject = '[project]\nname = "p"\ndependencies = ["numpy>=3", "tqdm"]\n[project.optional-dependencies]\nx = ["p[y]"]\n'
    problems = _lock_disagreements(pyproject, "numpy==2.4.6\nscipy==1.0\np @ file:///home/me/p\n",
                                   installed=lambda name: "1.0")
    assert problems == ["the lock pins a path or URL: p @ file:///home/me/p",
                        "numpy>=3 excludes the pinned 2.4.6", "tqdm is not pinned",
                        "numpy 1.0 is installed, the lock pins 2.4.6"]


# ---------------------------------------------------------------- the site's rebuild benchmark

def test_rebuild_benchmark_edit_lands_inside_the_function_and_changes_no_result(tmp_path):
    path, module = bench_rebuild.find_function(ROOT, "layer_norm_backward")
    assert (path.as_posix(), module) == ("transformer/layernorm.py", "layernorm")
    source = (ROOT / path).read_text()
    edited = bench_rebuild.insert_edit(source, "layer_norm_backward")
    assert len(edited.splitlines()) == len(source.splitlines()) + 1
    function = next(n for n in ast.parse(edited).body if getattr(n, "name", None) == "layer_norm_backward")
    assert bench_rebuild.EDIT_LINE in ast.get_source_segment(edited, function)

    (tmp_path / "edited_layernorm.py").write_text(edited)
    spec = importlib.util.spec_from_file_location("edited_layernorm", tmp_path / "edited_layernorm.py")
    copy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(copy)
    from transformer.layernorm import layer_norm_backward, layer_norm_forward

    rng = np.random.default_rng(0)
    x, g, b, dy = rng.normal(size=(3, 5)), rng.normal(size=5), rng.normal(size=5), rng.normal(size=(3, 5))
    _, cache = layer_norm_forward(x, g, b, 1e-5)
    for theirs, ours in zip(copy.layer_norm_backward(dy, cache), layer_norm_backward(dy, cache), strict=True):
        np.testing.assert_array_equal(theirs, ours)


def test_rebuild_benchmark_edit_goes_above_a_decorated_first_statement():
    source = "def f(x):\n    @staticmethod\n    def g():\n        pass\n    return x\n"
    edited = bench_rebuild.insert_edit(source, "f")
    assert edited.splitlines()[1] == "    " + bench_rebuild.EDIT_LINE
    compile(edited, "f.py", "exec")


def test_rebuild_benchmark_reports_extra_and_missing_reruns():
    before = {"page layernorm": (1, "k1"), "page tokenizer": (1, "k2"), "notebook why_ffn": (1, "k3")}
    after = {"page layernorm": (2, "k9"), "page tokenizer": (1, "k2"), "notebook why_ffn": (2, "k3"),
             "page cli": (2, "k4")}
    reran = bench_rebuild.reran_between(before, after)
    assert reran == {"page layernorm", "notebook why_ffn", "page cli"}  # changed key, rewritten stamp, new stamp
    assert bench_rebuild.compare(reran, {"page layernorm", "notebook why_ffn", "page gradcheck"}) == \
        (["page cli"], ["page gradcheck"])


def test_rebuild_benchmark_reads_where_the_time_went_from_the_build_log():
    log = ("INFO    -  generated page layernorm in 0.1 s\n"  # the hook's lines, as mkdocs prints them
           "INFO    -  generated page mutants in 550.9 s\n"
           "INFO    -  executed notebook shakespeare (full) in 234.6 s\n"
           "INFO    -  Documentation built in 800.2 seconds\n")
    steps = bench_rebuild.step_seconds(log)
    assert steps == {"page mutants": 550.9, "notebook shakespeare": 234.6, "page layernorm": 0.1}
    assert list(steps) == ["page mutants", "notebook shakespeare", "page layernorm"]  # slowest first
    assert bench_rebuild.slowest(steps, 800.0, count=2) == \
        "page mutants 551 s, notebook shakespeare 235 s, everything else 14 s"


def test_rebuild_benchmark_builds_as_scripts_site_does_nothing_when_the_site_is_current(monkeypatch, tmp_path):
    built = []
    monkeypatch.setattr(bench_rebuild, "mkdocs_build", lambda *args: built.append(args) or (1.0, "built"))
    for current, expected in ((0, ""), (1, "built")):
        monkeypatch.setattr(bench_rebuild.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(
            cmd, current if cmd[1:3] == ["-m", "site_scripts.site_state"] else 99))
        assert bench_rebuild.site_build("python", tmp_path, tmp_path / "site", {})[1] == expected
    assert len(built) == 1  # mkdocs ran only for the site that was not current


def test_rebuild_benchmark_names_each_file_two_built_sites_do_not_share_byte_for_byte(tmp_path):
    for site in ("a", "b"):
        (tmp_path / site / "page").mkdir(parents=True)
        (tmp_path / site / "index.html").write_text("same")
        (tmp_path / site / "page" / "index.html").write_text("one")
    assert bench_rebuild.differing_files(tmp_path / "a", tmp_path / "b") == []
    (tmp_path / "b" / "page" / "index.html").write_text("two")  # as long as before, other bytes
    (tmp_path / "a" / "only.txt").write_text("")
    assert bench_rebuild.differing_files(tmp_path / "a", tmp_path / "b") == ["only.txt", "page/index.html"]


def test_rebuild_benchmark_compares_the_contributors_page_without_its_build_profile(tmp_path):
    """Each build writes its own timings into the profile; the rest of the page must be the same bytes."""
    for site, seconds in (("a", "1.0"), ("b", "2.5")):
        (tmp_path / site).mkdir()
        (tmp_path / site / "index.html").write_text(f'<p>x</p><div id="build-profile">\n<td>{seconds}</td>\n</div>')
    assert bench_rebuild.differing_files(tmp_path / "a", tmp_path / "b") == []
    (tmp_path / "b" / "index.html").write_text('<p>y</p><div id="build-profile"><td>2.5</td></div>')
    assert bench_rebuild.differing_files(tmp_path / "a", tmp_path / "b") == ["index.html"]


def test_rebuild_benchmark_expects_the_pages_and_notebooks_that_reach_the_function():
    expected = bench_rebuild.expected_reruns(ROOT, "layernorm", "layer_norm_backward")
    assert {"page layernorm", "page gradcheck", "notebook gradcheck_by_hand"} <= expected
    assert "notebook attention_maps" in expected  # through `# depends-on: shakespeare`, which trains
    assert "page tokenizer" not in expected
    assert "page mutants" not in expected  # no report was rewritten
    rewritten = bench_rebuild.expected_reruns(ROOT, "layernorm", "layer_norm_backward", ["reports/mutants.json"])
    assert rewritten - expected == {"page mutants"}  # the page that reads the report, and no other


def test_rebuild_benchmark_usage_mistakes_exit_2_without_a_traceback(tmp_path, capsys):
    assert bench_rebuild.main(["--edit", "layer_norm_bakward"]) == 2
    assert "did you mean layer_norm_backward" in capsys.readouterr().err
    assert bench_rebuild.main(["--repo", str(tmp_path)]) == 2
    assert "not inside a git repository" in capsys.readouterr().err


def test_rebuild_benchmark_explains_an_extra_rerun_by_the_lines_the_edit_moved():
    """A line inserted in loss_fn moves loss_and_grads and loss_fn's own call of forward down one line;
    pages print both line numbers, so the pages that reach them rerun."""
    source = (ROOT / "transformer" / "model.py").read_text()
    moved, called = bench_rebuild.moved_by_edit(source, bench_rebuild.insert_edit(source, "loss_fn"))
    assert "loss_and_grads" in moved and "loss_fn" not in moved and "forward" not in moved
    assert "forward" in called
    reasons = bench_rebuild.why_extra(ROOT, "model", ["page sampling", "notebook attention_maps"], moved, called,
                             reran={"notebook shakespeare"})
    assert reasons["page sampling"] == ["forward (called from lines that moved)"]
    assert reasons["notebook attention_maps"] == ["notebook shakespeare (depended on, reran)"]


def test_a_computed_result_and_its_reload_are_the_same_down_to_key_order(tmp_path):
    """A timing measured in this build and the same timing read back in the next must print alike: the
    stored file sorts its keys, so the fresh value must come back sorted too (the autograd page's speed
    table once swapped two rows between a first build and a rebuild)."""
    stored = tmp_path / "timing.json"
    fresh = cached_json(stored, "k", lambda: {"torch": 1.0, "autograd": 3.0, "handwritten": 2.0})
    again = cached_json(stored, "k", lambda: pytest.fail("a current result was recomputed"))
    assert list(fresh) == list(again) == ["autograd", "handwritten", "torch"]
    assert json.dumps(fresh) == json.dumps(again)


# ---------------------------------------------------------------- every tool runs as the script its docstring names

SCRIPTS = sorted(p.name for p in (ROOT / "tools").glob("*.py") if 'if __name__ == "__main__":' in p.read_text())


def test_the_tools_that_are_scripts_are_found():
    assert {"autograd_speed.py", "autograd_memory.py", "mutants.py", "bench_step.py", "fault_inject.py"} <= set(SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_tool_script_runs_as_a_module_from_the_project_root(script):
    """`python -m tools.NAME --help`, as the docstrings, the pages and the generators say to run them, with
    nothing on PYTHONPATH: the project root is on sys.path only as the folder `-m` runs from."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    ran = subprocess.run([sys.executable, "-m", f"tools.{script.removesuffix('.py')}", "--help"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0 and ran.stdout.startswith("usage:"), ran.stderr[-2000:]


def test_site_diff_finds_one_changed_number_and_nothing_in_two_equal_sites(tmp_path, capsys):
    """Two sites that differ in one number of one page's article (and in the theme's navigation, which it
    ignores) are reported as that one line; the same sites compared with themselves read the same."""
    from tools import site_diff

    def site(name, number, nav):
        for page in ("", "model/layernorm/"):
            path = tmp_path / name / page / "index.html"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"<nav>{nav}</nav><article><h1>LayerNorm</h1><p>gap</p>\n<p>{number if page else 1}</p>"
                            "<script>var x = 1;</script></article>")
        return tmp_path / name

    a, b = site("a", "3.1e-15", "left"), site("b", "3.2e-15", "right")
    assert site_diff.main([str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "model/layernorm/: 1 line(s) differ\n  - 3.1e-15\n  + 3.2e-15\n" in out
    assert "1 of 2 pages read the same; 1 differ" in out
    assert site_diff.main([str(a), str(a)]) == 0
    assert site_diff.main([str(a), str(tmp_path / "nothing")]) == 2
    # Neighbouring cells are separate lines: 12 | 3 is not 1 | 23.
    cells = [site_diff._Article(), site_diff._Article()]
    cells[0].feed("<article><table><tr><td>12</td><td>3</td></tr></table></article>")
    cells[1].feed("<article><table><tr><td>1</td><td>23</td></tr></table></article>")
    assert cells[0].lines() == ["12", "3"] and cells[1].lines() == ["1", "23"]


def test_the_gpt2_cost_benchmark_measures_every_policy_and_decodes_alike_with_every_cache(monkeypatch):
    """tools/gpt2_cost.py at a tiny GPT-2 (its measurement code, not GPT-2 small's minutes): four policies, the
    checkpointed forward keeping less than the plain one, three ways of decoding choosing the same greedy tokens,
    and the code it ran hashed; the site reads a hash that no longer matches as a changed file."""
    from site_scripts import gpt2_cost as cited
    from tools import gpt2_cost

    from transformer.config import PRESETS

    monkeypatch.setattr(gpt2_cost, "CONFIG", PRESETS["gpt2-tiny"].with_(context_len=16))
    monkeypatch.setattr(gpt2_cost, "T", 16)
    monkeypatch.setattr(gpt2_cost, "PROMPT", 5)
    monkeypatch.setattr(gpt2_cost, "NEW", 6)
    monkeypatch.setattr(gpt2_cost, "PAGE", 4)
    report = gpt2_cost.run(1, log=lambda _: None)
    policies = {p["policy"]: p for p in report["policies"]}
    assert set(policies) == set(gpt2_cost.POLICIES) and all(p["step_peak"] > 0 for p in policies.values())
    assert policies["checkpointed"]["retained"] < policies["materialized"]["retained"]
    tokens = [d["tokens"] for d in report["decoding"]]
    assert len(tokens) == 3 and len(tokens[0]) == 7 and tokens[1] == tokens[0] and tokens[2] == tokens[0]
    assert "transformer/model.py" in report["code"] and "transformer/kv_cache.py" in report["code"]
    assert cited.changed_files(report["code"]) == []
    wrong = {**report["code"], "transformer/model.py": "0" * 64}
    assert cited.changed_files(wrong) == ["transformer/model.py"]
