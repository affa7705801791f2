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


def show(fig, dpi=110):
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    display(Image(buffer.getvalue()))


def table(header, rows):
    lines = ["| " + " | ".join(map(str, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    display(Markdown("\n".join(lines) + "\n"))


def say(text):
    """Markdown written from computed values (a sentence with numbers in it)."""
    display(Markdown(text))
