"""The experiment notebooks: executed, cached, deterministic, and a failing cell stops the build."""

import re
import textwrap

import matplotlib
import numpy as np
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


def test_an_output_the_page_cannot_show_names_the_notebook_the_cell_and_the_type(tmp_path):
    """Negative control: an HTML-only value (an SVG, a widget) must stop the build, not vanish from the page."""
    write_notebook(tmp_path / "nb", "html", ['# %% [markdown]\n# # HTML', "# %%\nx = 1",
                                             "# %%\nfrom IPython.display import HTML, display\n"
                                             "display(HTML('<b>bold</b>'))"])
    with pytest.raises(notebooks.NotebookError) as error:
        notebooks.run("html", "quick", folder=tmp_path / "nb", out=tmp_path / "out")
    message = str(error.value)
    assert "notebooks/html.py, cell 3 displays text/html" in message and "image/png" in message, message
    assert not (tmp_path / "out" / "quick" / "html.md").exists()
    nb = {"cells": [{"cell_type": "code", "source": "x", "metadata": {}, "outputs": [{"output_type": "weird"}]}]}
    with pytest.raises(notebooks.NotebookError, match="html.py, cell 1 has an output of type 'weird'"):
        notebooks.render(__import__("nbformat").from_dict(nb), "html", "quick")


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


def test_no_notebook_key_is_computed_again_while_nothing_it_reads_has_changed(tmp_path, monkeypatch):
    from site_scripts import build

    sources = [("notebooks/a.py", 1)]  # stands for the stamps of the sources
    monkeypatch.setattr(build, "source_state", lambda root=None: list(sources))
    monkeypatch.setattr(notebooks, "OUT", tmp_path / "out")
    monkeypatch.setattr(notebooks, "CORPUS", tmp_path / "input.txt")
    notebooks.CORPUS.write_text("corpus")
    computed = []
    monkeypatch.setattr(notebooks, "is_stale", lambda name, *args, **kwargs: computed.append(name))  # all current

    def keys_computed():
        computed.clear()
        assert notebooks.tasks() == []
        return bool(computed)

    assert keys_computed()  # the first time, and none was stale: the state is recorded
    assert not keys_computed()  # nothing changed
    sources.append(("notebooks/b.py", 2))  # a source edited
    assert keys_computed() and not keys_computed()
    (tmp_path / "out" / notebooks.mode()).mkdir(parents=True)
    (tmp_path / "out" / notebooks.mode() / "a.md").write_text("")  # a page of a notebook written
    assert keys_computed() and not keys_computed()
    notebooks.CORPUS.write_text("another corpus")
    assert keys_computed()
    sources.append(("notebooks/c.py", 3))
    monkeypatch.setattr(notebooks, "is_stale", lambda name, *args, **kwargs: "key")  # all stale
    assert len(notebooks.tasks()) == len(notebooks.in_order())
    assert len(notebooks.tasks()) == len(notebooks.in_order())  # nothing recorded while some must run


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


def rendered_cells(table_text):
    """The text a reader sees in each body cell of a Markdown table, rendered as the site renders it."""
    import html
    import markdown

    page = markdown.markdown(table_text, extensions=["tables", "pymdownx.arithmatex"],
                             extension_configs={"pymdownx.arithmatex": {"generic": True}})
    return [html.unescape(re.sub(r"<[^>]+>", "", cell)) for cell in re.findall(r"<td>(.*?)</td>", page)]


def test_a_table_cell_shows_its_text_unchanged_where_markdown_would_read_emphasis_or_a_border():
    """Negative control: the same cells joined as they are lose a pair of `*` and of `_` to italics and gain a
    cell at the `|`. Code spans, math and link addresses pass through as written."""
    from notebooks._figures import table_md

    cells = ["0021*, 0120*, 1111*", "_held_ out, snake_case_name", "p | q"]
    assert rendered_cells(table_md(["a", "b", "c"], [cells])) == cells
    assert rendered_cells("| a | b | c |\n|---|---|---|\n| " + " | ".join(cells) + " |\n") != cells
    verbatim = ["`a|b_c*`", r"\(W_A + W_B\)", "[the notes](https://example.org/a_b*c)"]
    assert table_md(["a", "b", "c"], [verbatim]).splitlines()[2] == "| " + " | ".join(verbatim) + " |"
    with pytest.raises(ValueError, match="lvert"):
        table_md(["a"], [[r"\(|x|\)"]])


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


# ---------------------------------------------------------------- the fine-tuning experiment, as the test build ran it

def markdown_table(text, header):
    """The rows of the markdown table whose header line starts with `header`: {first cell: [other cells]}."""
    lines = text[text.index(header):].splitlines()[2:]  # past the header and the |---| line
    rows = {}
    for line in lines:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        rows[cells[0]] = cells[1:]
    return rows


@pytest.fixture(scope="module")
def finetune_page(site_and_mode):
    return (notebooks.OUT / site_and_mode[1] / "finetune.md").read_text()  # the page as the built site shows it


def test_the_finetune_page_holds_out_speeches_the_base_never_saw_of_the_speaker_with_most_of_them(finetune_page):
    from collections import Counter

    from transformer.data import TRAIN_FRACTION, load_corpus, speeches

    text = load_corpus(notebooks.CORPUS)
    unseen, count = Counter(), Counter()
    for s in speeches(text):
        if s.start >= int(TRAIN_FRACTION * len(text)):
            unseen[s.speaker] += len(s.text)
            count[s.speaker] += 1
    speaker = unseen.most_common(1)[0][0]
    assert f"The speaker: **{speaker}**, with {unseen[speaker]:,} characters" in finetune_page
    data = markdown_table(finetune_page, "| text | speeches |")
    held, trained = int(data[f"{speaker}, held out"][0]), int(data[f"{speaker}, training"][0])
    assert (held, trained) == (count[speaker] // 5, count[speaker] - count[speaker] // 5)  # every fifth, whole
    # The base's sample and each fine-tuned model's start from the speaker's name.
    assert len(re.findall(rf"^--- .+ ---\n{speaker}:\n", finetune_page, flags=re.M)) == 5


def test_the_finetune_page_sizes_are_those_of_the_arrays_of_each_method(finetune_page, built_mode):
    """The sizes are recomputed here from the shapes and the NF4 payload formula, not read back."""
    from transformer.checkpoint import load_checkpoint
    from transformer.finetune import is_linear_weight
    from transformer.lora import LoRAConfig, adapter_shapes
    from transformer.model import param_shapes
    from transformer.nf4 import payload_bytes

    cfg = load_checkpoint(notebooks.ROOT / "build/notebook-data" / built_mode / "shakespeare/checkpoint.npz").cfg
    sizes = {name: int(np.prod(s)) for name, s in param_shapes(cfg).items()}
    settings = markdown_table(finetune_page, "| method | what trains |")
    targets = tuple(re.search(r" on ([\w`, ]+); scale", settings["LoRA r=8"][0]).group(1).replace("`", "").split(", "))
    adapters = {r: sum(int(np.prod(s)) for s in adapter_shapes(param_shapes(cfg), LoRAConfig(r, 16, targets)).values())
                for r in (2, 8)}
    dense = 4 * sum(sizes.values())
    nf4 = sum(payload_bytes(n) if is_linear_weight(name) else 4 * n for name, n in sizes.items())
    expected = {"full fine-tuning": (sum(sizes.values()), 0), "LoRA r=2": (adapters[2], dense),
                "LoRA r=8": (adapters[8], dense), "QLoRA r=8": (adapters[8], nf4)}  # (trained, frozen bytes)
    shown = markdown_table(finetune_page, "| method | trained parameters |")
    assert set(shown) == set(expected)
    for name, (trained, frozen) in expected.items():
        count, frozen_b, trained_b, grads_b, adam_b, total_b = (int(c.replace(",", "")) for c in shown[name][:6])
        assert (count, frozen_b, trained_b, grads_b, adam_b) == (trained, frozen, 4 * trained, 4 * trained,
                                                                 8 * trained), name
        assert total_b == frozen_b + trained_b + grads_b + adam_b
        assert float(shown[name][6]) > 0  # a measured time per step
    assert nf4 < dense / 4


def test_the_finetune_page_starts_every_dense_method_at_the_base_and_its_merged_models_agree(finetune_page):
    speaker = re.search(r"The speaker: \*\*([^*{]+)\*\*", finetune_page).group(1)  # not the source's {SPEAKER}
    base = float(re.search(r"The base model, not fine-tuned: ([\d.]+) nats", finetune_page).group(1))
    losses = markdown_table(finetune_page, f"| method | {speaker}, step 0 |")
    for name in ("full fine-tuning", "LoRA r=2", "LoRA r=8"):  # the base's own parameters, or B = 0
        assert float(losses[name][0]) == base, name
    assert float(losses["QLoRA r=8"][0]) != base  # its base is the NF4-rounded one
    gap = float(re.search(r"its merged model by at most ([\d.e+-]+) ", finetune_page).group(1))
    assert gap < 1e-3


# ---------------------------------------------------------------- the why_ffn experiment, as the test build ran it

@pytest.fixture(scope="module")
def why_ffn_page(site_and_mode):
    return (notebooks.OUT / site_and_mode[1] / "why_ffn.md").read_text()  # the page as the built site shows it


def test_the_why_ffn_page_checks_the_backward_of_all_eight_models(why_ffn_page):
    from notebooks import _ffn_models as m

    checks = markdown_table(why_ffn_page, "| model | LN | FFN | residual | parameters |")
    assert set(checks) == {parts.name for parts in m.ALL_PARTS}
    for parts in m.ALL_PARTS:
        ln, ffn, res, size, verdict, gap = checks[parts.name]
        assert (ln, ffn, res) == tuple("yes" if f else "—" for f in parts)
        assert int(size) == sum(v.size for v in m.init(0, parts).values())
        assert verdict == "passes" and float(gap) < 1e-6, parts.name
    assert "**8 of 8** backward passes agree" in why_ffn_page


def test_the_why_ffn_sweep_tables_agree_and_the_summary_follows_from_the_counts(why_ffn_page):
    from notebooks import _ffn_models as m

    fit_table = markdown_table(why_ffn_page, "| model | runs that fit the training set |")
    fits = {name: int(cells[0]) for name, cells in fit_table.items()}
    best_rate = {name: int(cells[2]) for name, cells in fit_table.items()}
    runs, seeds = map(int, re.search(r"\| model \| runs that fit the training set \| of (\d+) \| seeds that fit, "
                                     r"at the best rate \| of (\d+) \|", why_ffn_page).groups())
    tallies = markdown_table(why_ffn_page, "| model | rate 0.25 | rate 0.5 | rate 1 | rate 2 | all rates |")
    for name, cells in tallies.items():
        f, s, d = map(int, re.match(r"(\d+) fit · (\d+) stall · (\d+) diverge", cells[-1]).groups())
        assert f + s + d == runs and f == fits[name], name
        per_rate = [int(re.match(r"(\d+) fit", c).group(1)) for c in cells[:-1]]
        assert sum(per_rate) == f and max(per_rate) == best_rate[name]
    for criterion, count, least in (("In at least one run", fits, 1),
                                    ("Reliably (half the seeds at the best rate)", best_rate, seeds / 2)):
        learners = [p.name for p in m.ALL_PARTS if count[p.name] >= least]
        line = next(x for x in why_ffn_page.splitlines() if x.startswith(f"**{criterion}**"))
        if learners:
            assert f"{len(learners)} of 8 models learn the task ({', '.join(learners)})" in line
        else:
            assert "no model learns the task" in line


def test_the_why_ffn_readout_of_a_is_the_census_of_a_and_the_best_is_the_largest_shown(why_ffn_page):
    readouts = markdown_table(why_ffn_page, "| linear read-out of A's pooled vectors | right of 81 |")
    counts = {name: int(cells[0]) for name, cells in readouts.items()}
    census = markdown_table(why_ffn_page, "| model | final training loss | right, training |")
    assert f"{counts[next(n for n in counts if n.startswith('A'))]} of 81" == census["A (none)"][3]
    own, best = map(int, re.search(r"A's own read-out gets \*\*(\d+) of 81\*\*; the best linear read-out found on "
                                   r"the same vectors gets \*\*(\d+) of 81\*\*", why_ffn_page).groups())
    assert best == max(counts.values()) >= own  # A's own read-out is one of the read-outs tried
    verdict = next(x for x in why_ffn_page.splitlines() if x.startswith("A's own read-out gets"))
    assert ("does not hold" in verdict) == (best == 81)


def test_the_why_ffn_split_sentence_counts_the_misses_of_its_table(why_ffn_page):
    rows = markdown_table(why_ffn_page, "| split seed | outcome | right, all |")
    shown = [s.replace("`", "").replace("\\", "") for cells in rows.values() if cells[2] not in ("—", "none")
             for s in cells[2].split(", ")]  # each sequence a code span, the held-out mark an escaped *
    total, held = map(int, re.search(r"model B misses (\d+) sequences in all; \*\*(\d+) of them\*\*",
                                     why_ffn_page).groups())
    assert (total, held) == (len(shown), sum(s.endswith("*") for s in shown))
    assert all(81 - int(cells[1].split()[0]) == len(cells[2].split(", ")) for cells in rows.values()
               if cells[2] != "none" and cells[1] != "—")


def test_the_why_ffn_corner_conventions_differ_only_on_a_dead_start(why_ffn_page):
    dead = markdown_table(why_ffn_page, "| convention | largest first-layer weight after training |")
    assert float(dead["relu'(0) = 0"][0]) == 0 < float(dead["relu'(0) = 1"][0])
    rows = markdown_table(why_ffn_page, "| seed | exact zeros met | largest parameter difference |")
    for zeros, gap, *_ in rows.values():
        assert int(zeros) > 0 or float(gap) == 0  # without an exact zero the two runs are the same bits
