"""Figures for the page generators: a matplotlib figure rendered to PNG bytes that are the same on every run.

A generator returns them as a fragment named `<name>.png` (site_scripts/build.py writes it beside the page's
markdown fragments, site_scripts/hook.py serves it). The figure is checked as the notebooks' are: axis labels
on both axes, and a legend when there are several lines (notebooks/_figures.py's `check_labels`).
"""

import io


def png(fig, dpi=110):
    """The figure as PNG bytes without the metadata that changes between runs; the figure is closed."""
    import matplotlib.pyplot as plt

    from notebooks._figures import check_labels

    check_labels(fig)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return buffer.getvalue()


def new_figure(*args, **kwargs):
    """plt.subplots with the Agg backend, which needs no display."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(*args, **kwargs)
