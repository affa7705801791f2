"""Execute the experiment notebooks and render each as a page of the site.

A notebook is notebooks/<name>.py in jupytext's percent format, run by nbclient in a fresh kernel started in the
repository root, and only when its key changed: a hash of its source, the transformer functions and classes it can
reach (site_scripts/depends.py), the keys of the notebooks it depends on (a line `# depends-on: <name>`), the mode,
the versions of Python, numpy, matplotlib, torch, jupytext and nbclient, and the corpus it reads.

SITE_QUICK=1 in the environment selects the quick mode, which the notebooks read to shorten their long runs (the
tests use it); each mode keeps its own outputs, and a quick page says at its top that it shows a quick run.

Output: build/notebooks/<mode>/<name>.md and its figures in build/notebooks/<mode>/<name>/, which the mkdocs hook
adds to the site as experiments/<name>.md. A failing cell stops the build with the notebook's name, the cell's
number and first line, and the error; so does an output a page cannot show (HTML, SVG), naming its type.

    python -m site_scripts.notebooks [--only NAME ...] [--force] [--jobs N]
"""

import argparse
import base64
import hashlib
import os
import platform
import re
import sys
from graphlib import CycleError, TopologicalSorter

from . import depends
from .common import (QUICK_ENV, ROOT, hash_parts, is_current, mode, package_version, positive_int, stamps,
                     write_if_changed)

NOTEBOOKS = ROOT / "notebooks"
OUT = ROOT / "build" / "notebooks"
CORPUS = ROOT / "data" / "tinyshakespeare" / "input.txt"
KEY_PACKAGES = ("numpy", "matplotlib", "torch", "jupytext", "nbclient")  # a notebook's key holds their versions
TIMEOUT_S = 1800  # one cell; the longest is the full Shakespeare run
REPO_URL = "https://github.com/transformer-explained/transformer"  # mkdocs.yml's repo_url default
DEPENDS = re.compile(r"^# depends-on: *([\w-]+)", flags=re.M)


class NotebookError(RuntimeError):
    """A notebook could not be run: which one, which cell, what went wrong."""


def names(folder=NOTEBOOKS):
    return sorted(p.stem for p in folder.glob("*.py") if not p.name.startswith("_"))


def dependencies(name, folder=NOTEBOOKS):
    return DEPENDS.findall((folder / f"{name}.py").read_text())


def in_order(folder=NOTEBOOKS):
    """Every notebook after the ones it depends on."""
    graph = {name: dependencies(name, folder) for name in names(folder)}
    for name, deps in graph.items():
        for dep in deps:
            if not (folder / f"{dep}.py").exists():
                raise NotebookError(f"notebook {name} depends on {dep}, which notebooks/ does not hold")
    try:
        return list(TopologicalSorter(graph).static_order())
    except CycleError as e:  # its cycle lists each notebook before the one that depends on it
        raise NotebookError(f"notebooks depend on each other in a circle: {' -> '.join(reversed(e.args[1]))}") from None


def markdown_cells(name, folder=NOTEBOOKS):
    """The text of a notebook's markdown cells: its prose, which the hook checks for numbers typed by hand (the
    numbers in its outputs are computed, so the rendered page is not checked)."""
    import jupytext

    nb = jupytext.read(folder / f"{name}.py")
    return "\n\n".join(cell.source for cell in nb.cells if cell.cell_type == "markdown")


def notebook_key(name, run_mode, folder=NOTEBOOKS, repo_url=""):
    path = folder / f"{name}.py"
    helpers = "".join(p.read_text() for p in sorted(folder.glob("_*.py")))
    parts = [path.read_text(), helpers, depends.units_text(depends.page_units(path)), run_mode, repo_url,
             platform.python_version(),
             *(f"{p} {package_version(p)}" for p in KEY_PACKAGES),
             *((ROOT / "site_scripts" / f).read_text() for f in ("notebooks.py", "common.py")),
             *(notebook_key(dep, run_mode, folder, repo_url) for dep in dependencies(name, folder))]
    if "tinyshakespeare" in parts[0]:
        parts.append(hashlib.sha256(CORPUS.read_bytes()).hexdigest() if CORPUS.exists() else "no corpus")
    return hash_parts(*parts)


def execute(name, run_mode, folder=NOTEBOOKS):
    """Run a notebook; return the executed nbformat notebook or raise NotebookError."""
    import jupytext
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    nb = jupytext.read(folder / f"{name}.py")
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    # The kernel's environment: this process's, and the mode and settings that make its runs repeatable.
    env = {**os.environ, QUICK_ENV: "1" if run_mode == "quick" else "0", "MPLBACKEND": "Agg", "PYTHONHASHSEED": "0",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    failed = []  # (number counted from 1, cell) of the cell that raised, as nbclient's on_cell_error hook names it
    # The kernel listens on 127.0.0.1 only; its notice about unencrypted local sockets is noise in the build log.
    client = NotebookClient(nb, timeout=TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}},
                            extra_arguments=["--IPKernelApp.log_level=ERROR"], coalesce_streams=True,
                            on_cell_error=lambda cell, cell_index, execute_reply: failed.append((cell_index + 1, cell)))
    try:
        client.execute(env=env)  # jupyter_client starts the kernel's process with it
    except CellExecutionError as e:
        index, cell = failed[-1]
        first = cell.source.strip().splitlines()[0] if cell.source.strip() else ""
        error = f"{e.ename}: {e.evalue}" if getattr(e, "ename", None) else str(e).strip().splitlines()[-1]
        raise NotebookError(f"notebook notebooks/{name}.py failed in cell {index} ({first!r}): {error}") from None
    except CellTimeoutError:
        raise NotebookError(f"notebook notebooks/{name}.py: a cell ran longer than {TIMEOUT_S} s") from None
    except DeadKernelError as e:
        raise NotebookError(f"notebook notebooks/{name}.py: its kernel died ({e})") from None
    return nb


def render(nb, name, run_mode, repo_url=REPO_URL):
    """Markdown for the executed notebook, and its figures as {file name: PNG bytes}."""
    parts, figures = [], {}
    banner = (f'!!! warning "Quick run"\n    This page shows a shortened run ({QUICK_ENV}=1), made to test the '
              "build; its numbers are not the experiment's. `scripts/site` builds the full one.\n")
    for index, cell in enumerate(nb.cells, start=1):
        if cell.cell_type == "markdown":
            parts.append(cell.source + "\n")
            if run_mode == "quick" and banner:  # under the title of the first cell
                parts.append(banner)
                banner = None
            continue
        if cell.cell_type != "code":
            continue
        if "hide-input" not in cell.metadata.get("tags", []) and cell.source.strip():
            parts.append(f"```python\n{cell.source.rstrip()}\n```\n")
        for n, output in enumerate(cell.get("outputs", [])):
            parts.append(_output_md(output, name, f"fig-{index}-{n}.png", figures, f"{name}.py, cell {index}"))
    source_link = f"[`notebooks/{name}.py`]({repo_url}/blob/main/notebooks/{name}.py)"
    parts.append(f"---\n\nExecuted at build time from {source_link} by nbclient ({run_mode} mode), with Python "
                 f"{platform.python_version()}, numpy {package_version('numpy')}, "
                 f"matplotlib {package_version('matplotlib')}. "
                 f"Rerun only this page: `python -m site_scripts.notebooks --only {name} --force`.\n")
    return "\n".join(p for p in parts if p), figures


SHOWN = ("image/png", "text/markdown", "text/plain")  # what a page can show of a displayed value, in this order


def _output_md(output, name, figure_name, figures, where):
    """One output of a cell as markdown. An output the page cannot show (a displayed value with only HTML or
    SVG, an unknown output type) stops the build naming it, rather than vanishing from the page."""
    kind = output.get("output_type")
    if kind == "stream":
        return f"```text\n{output['text'].rstrip()}\n```\n"
    if kind in ("display_data", "execute_result"):
        data = output.get("data", {})
        unshown = sorted(set(data) - set(SHOWN))
        if unshown and not ("image/png" in data or "text/markdown" in data):  # text/plain alone: its repr
            raise NotebookError(f"notebook notebooks/{where} displays {', '.join(unshown)}, which a page cannot "
                                f"show (only its text/plain form would remain): give it one of {', '.join(SHOWN)}")
        if "image/png" in data:
            figures[figure_name] = base64.b64decode(data["image/png"])
            alt = output.get("metadata", {}).get("alt", "figure")
            return f"![{alt}]({name}/{figure_name})\n"
        if "text/markdown" in data:
            return data["text/markdown"].rstrip() + "\n"
        if "text/plain" in data:
            return f"```text\n{data['text/plain'].rstrip()}\n```\n"
        raise NotebookError(f"notebook notebooks/{where} displays {', '.join(sorted(data)) or 'nothing'}, which "
                            f"a page cannot show: give it one of {', '.join(SHOWN)}")
    raise NotebookError(f"notebook notebooks/{where} has an output of type {kind!r}, which a page cannot show")


def is_stale(name, run_mode, force=False, folder=NOTEBOOKS, out=OUT, repo_url=REPO_URL):
    """The notebook's key when it must run (its key changed, its page is missing, or `force`), else None."""
    key = notebook_key(name, run_mode, folder, repo_url)
    current = is_current(out / run_mode / f"{name}.key", key) and (out / run_mode / f"{name}.md").exists()
    return None if current and not force else key


def execute_and_write(name, run_mode, key, folder=NOTEBOOKS, out=OUT, repo_url=REPO_URL):
    """Execute and render one notebook, write its page and figures, then its key. A schedule.Task: it may run in
    a worker process."""
    target = out / run_mode
    nb = execute(name, run_mode, folder)
    text, figures = render(nb, name, run_mode, repo_url)
    figure_dir = target / name
    figure_dir.mkdir(parents=True, exist_ok=True)
    for old in figure_dir.glob("*.png"):
        if old.name not in figures:
            old.unlink()
    for file_name, data in figures.items():
        if not (figure_dir / file_name).exists() or (figure_dir / file_name).read_bytes() != data:
            (figure_dir / file_name).write_bytes(data)
    write_if_changed(target / f"{name}.md", text)
    write_if_changed(target / f"{name}.key", key)


def run(name, run_mode, force=False, folder=NOTEBOOKS, out=OUT, repo_url=REPO_URL):
    """Execute and render one notebook if its key changed. Returns True if it ran."""
    key = is_stale(name, run_mode, force, folder, out, repo_url)
    if key is not None:
        execute_and_write(name, run_mode, key, folder, out, repo_url)
    return key is not None


def tasks(only=None, force=False, repo_url=REPO_URL):
    """The notebooks to run, as schedule.Tasks, each after the notebooks it depends on that also run. Fetches the
    corpus first if one of them reads it."""
    from .registry import BY_ID
    from .schedule import Task

    run_mode = mode()
    state = inputs_state(run_mode, repo_url)  # before any key reads them: a file edited now is seen next time
    if only is None and not force and is_current(state_path(run_mode), state):
        return []
    todo = [n for n in in_order() if only is None or n in only]
    if any("tinyshakespeare" in (NOTEBOOKS / f"{n}.py").read_text() for n in todo) and not CORPUS.exists():
        import subprocess

        subprocess.run([sys.executable, str(ROOT / "scripts" / "fetch_corpus.py")], check=True)
    keys = {name: is_stale(name, run_mode, force, repo_url=repo_url) for name in todo}
    stale = [name for name in todo if keys[name] is not None]
    if only is None and not stale:
        write_if_changed(state_path(run_mode), state)
    return [Task(task_name(name, run_mode), execute_and_write, (name, run_mode, keys[name], NOTEBOOKS, OUT, repo_url),
                 after=frozenset(task_name(d, run_mode) for d in dependencies(name) if d in stale),
                 alone=BY_ID[name].alone if name in BY_ID else "") for name in stale]


def state_path(run_mode):
    return OUT / f"{run_mode}-state"  # beside the folder whose stamps it holds, not in it


def inputs_state(run_mode, repo_url):
    """One hash of what every notebook's key reads, as file stamps (`common.stamps`) where it reads files: the
    sources (build.source_state: notebooks/, transformer/, site_scripts/, ...), the corpus, the pages and keys
    the notebooks wrote, the versions, the mode and the repository's address. While it stays what it was when
    no notebook was stale, none is, and `tasks` computes no key (which parses the package)."""
    from .build import source_state

    made = stamps(OUT, run_mode, "*") + stamps(CORPUS.parent, ".", CORPUS.name)
    return hash_parts(*map(str, source_state()), *map(str, made), platform.python_version(),
                      *(package_version(p) for p in KEY_PACKAGES), run_mode, repo_url)


def task_name(name, run_mode):
    return f"executed notebook {name} ({run_mode})"


def run_all(only=None, force=False, log=print, repo_url=REPO_URL, jobs=1):
    """Run every notebook that needs it, `jobs` at a time, each after those it depends on. Returns their
    names."""
    from . import schedule

    todo = tasks(only, force, repo_url)
    schedule.run(todo, jobs, log)
    return [task.args[0] for task in todo]


def site_files(run_mode=None):
    """(page path in the site, file on disk) for each rendered notebook and figure."""
    target = OUT / (run_mode or mode())
    for name in names():
        yield f"experiments/{name}.md", target / f"{name}.md"
        for figure in sorted((target / name).glob("*.png")):
            yield f"experiments/{name}/{figure.name}", figure


def main():
    parser = argparse.ArgumentParser(description="execute the experiment notebooks and render their pages")
    parser.add_argument("--only", nargs="+", choices=names(), help="only these notebooks")
    parser.add_argument("--force", action="store_true", help="rerun even when nothing changed")
    parser.add_argument("-j", "--jobs", type=positive_int, default=None,
                        help="notebooks run at once (default: $SITE_JOBS, else the number of cores)")
    args = parser.parse_args()
    from .schedule import jobs_from_env

    try:
        reran = run_all(args.only, args.force, jobs=args.jobs or jobs_from_env())
    except NotebookError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"reran ({mode()} mode): {', '.join(reran) or 'nothing (all up to date)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
