"""Figures and tables for the notebooks, the same bytes on every run.

`show(fig)` renders a matplotlib figure with the Agg backend into PNG bytes
without the metadata that would change between runs, and displays it;
`table(header, rows)` displays a markdown table whose cells show their text unchanged.
"""

import io
import os
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from IPython.display import Image, Markdown, display  # noqa: E402

QUICK = os.environ.get("SITE_QUICK") == "1"


def check_labels(fig):
    """Every plot names its axes, and one with several lines has a legend; raise ValueError otherwise."""
    plots = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    if not any(ax.get_xlabel() for ax in plots) or not any(ax.get_ylabel() for ax in plots):
        raise ValueError("a figure needs axis labels (with units) on its x and y axes")
    for ax in plots:
        labelled = [line for line in ax.get_lines() if not line.get_label().startswith("_")]
        if len(ax.get_lines()) > 1 and (ax.get_legend() is None or len(labelled) < 2):
            raise ValueError(f"the plot {ax.get_title()!r} has {len(ax.get_lines())} lines and needs a legend")


def show(fig, dpi=110):
    """Check the labels, then display the figure; its alt text is its title (the suptitle,
    or the first axes' title)."""
    check_labels(fig)
    alt = (fig._suptitle.get_text() if fig._suptitle else "") or fig.axes[0].get_title() or "figure"
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    display(Image(buffer.getvalue()), metadata={"alt": alt})


# Inline code, inline math and a link's address: Markdown shows what is inside them as it is, so no escape there.
_VERBATIM = re.compile(r"(`+).+?\1|\\\(.+?\\\)|\]\([^)]*\)")
_MARKERS = re.compile(r"([*_|])")  # emphasis in pairs, and the border between two cells


def cell_md(value):
    """A table cell as Markdown that shows its text unchanged: `*`, `_` and `|` are backslash-escaped outside
    code spans, inline math and link addresses, since two `*` in one cell would turn the text between them into
    italics and a `|` would end the cell. A `|` inside math would end the cell too, and is refused."""
    text, parts, at = str(value), [], 0
    for match in _VERBATIM.finditer(text):
        if match.group(0).startswith("\\(") and "|" in match.group(0):
            raise ValueError(f"a table cell's math {match.group(0)!r} holds a |, which ends the cell: "
                             "write \\lvert and \\rvert (or \\Vert) instead")
        parts += [_MARKERS.sub(r"\\\1", text[at:match.start()]), match.group(0)]
        at = match.end()
    return "".join(parts) + _MARKERS.sub(r"\\\1", text[at:])


def table_md(header, rows):
    """A Markdown table of the header and the rows, each cell through `cell_md`."""
    lines = ["| " + " | ".join(map(cell_md, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(cell_md, row)) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def table(header, rows):
    """Display a Markdown table (`table_md`)."""
    display(Markdown(table_md(header, rows)))


def say(text):
    """Markdown written from computed values (a sentence with numbers in it)."""
    display(Markdown(text))
