"""The experiment notebooks: executed, cached, deterministic, and a failing cell stops the build."""

import textwrap

import matplotlib
import pytest

from site_scripts import notebooks

matplotlib.use("Agg")


def write_notebook(folder, name, cells):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.py").write_text("\n\n".join(textwrap.dedent(c).strip() for c in cells) + "\n")


def test_a_failing_cell_names_the_notebook_the_cell_and_the_error(tmp_path):
    """Negative control: the build must stop, and say where."""
    write_notebook(tmp_path / "nb", "broken", ['# %% [markdown]\n# # Broken', "# %%\nx = 1",
                                               '# %%\nraise ValueError("on purpose")'])
    with pytest.raises(notebooks.NotebookError) as error:
        notebooks.run("broken", "quick", folder=tmp_path / "nb", out=tmp_path / "out")
    message = str(error.value)
    assert "notebooks/broken.py" in message and "cell 3" in message and "ValueError: on purpose" in message
    assert not (tmp_path / "out" / "quick" / "broken.md").exists()


def test_a_notebook_runs_once_and_its_rerun_is_byte_identical(tmp_path):
    out = tmp_path / "out"
    assert notebooks.run("gradcheck_by_hand", "quick", out=out)
    first = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert any(p.suffix == ".png" for p in first)
    assert not notebooks.run("gradcheck_by_hand", "quick", out=out)  # nothing changed, nothing runs
    assert notebooks.run("gradcheck_by_hand", "quick", force=True, out=out)
    second = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert first == second
    page = (out / "quick" / "gradcheck_by_hand.md").read_text()
    assert page.index("# Gradient checking by hand") < page.index("Quick run")  # the banner, under the title


def test_notebooks_run_after_the_ones_they_depend_on(tmp_path):
    order = notebooks.in_order()
    assert order.index("shakespeare") < order.index("attention_maps")
    folder = tmp_path / "nb"
    write_notebook(folder, "a", ["# depends-on: b\n# %%\nx = 1"])
    write_notebook(folder, "b", ["# depends-on: a\n# %%\nx = 1"])
    with pytest.raises(notebooks.NotebookError, match="circle"):
        notebooks.in_order(folder)


def test_figures_without_axis_labels_or_legend_are_refused():
    """Negative control for the labelling rule every notebook figure goes through."""
    import matplotlib.pyplot as plt

    from notebooks._figures import check_labels

    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    with pytest.raises(ValueError, match="axis labels"):
        check_labels(fig)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats)")
    check_labels(fig)
    ax.plot([0, 1], [1, 0])
    with pytest.raises(ValueError, match="legend"):
        check_labels(fig)
    plt.close(fig)


def test_the_quick_mode_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv(notebooks.QUICK_ENV, "1")
    assert notebooks.mode() == "quick"
    monkeypatch.setenv(notebooks.QUICK_ENV, "0")
    assert notebooks.mode() == "full"


def test_a_cell_that_runs_too_long_is_stopped_and_named(tmp_path, monkeypatch):
    """Negative control for the cell time limit."""
    monkeypatch.setattr(notebooks, "TIMEOUT_S", 2)
    write_notebook(tmp_path / "nb", "slow", ["# %%\nimport time\ntime.sleep(30)"])
    with pytest.raises(notebooks.NotebookError, match="slow.py: a cell ran longer than 2 s"):
        notebooks.run("slow", "quick", folder=tmp_path / "nb", out=tmp_path / "out")
