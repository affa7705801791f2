"""Figures and tables for the notebooks, the same bytes on every run.

`show(fig)` renders a matplotlib figure with the Agg backend into PNG bytes
without the metadata that would change between runs, and displays it;
`table(header, rows)` displays a markdown table.
"""

import io
import os

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


def table(header, rows):
    lines = ["| " + " | ".join(map(str, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    display(Markdown("\n".join(lines) + "\n"))


def say(text):
    """Markdown written from computed values (a sentence with numbers in it)."""
    display(Markdown(text))
