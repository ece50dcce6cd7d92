"""The one place fedlatent gets matplotlib: pyplot on the Agg backend, for writing image files.

Experiments, the demo and the CLI only write PNG files; selecting Agg keeps them working on
machines without a display and never opens a window. :func:`figure` is the one way they write
one: it makes the directory, lays the figure out, saves it and always closes it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["figure", "pyplot"]


def pyplot():
    """``matplotlib.pyplot`` with the file-only Agg backend selected."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


@contextmanager
def figure(
    path: str | Path,
    *,
    figsize: tuple[float, float] = (5, 3.5),
    nrows: int = 1,
    ncols: int = 1,
    dpi: float = 120,
    tight: bool = False,
    bbox_inches: str | None = None,
    **subplots_kw,
) -> Iterator[tuple]:
    """Draw a figure in the ``with`` block and write it to ``path``.

    Yields ``(fig, ax)`` from ``pyplot().subplots(nrows, ncols, figsize=figsize,
    **subplots_kw)`` (``ax`` an array when there are several axes, as there). The directory of
    ``path`` is created first. The figure uses matplotlib's constrained layout (a layout engine
    that keeps titles, labels and legends apart), or ``tight_layout()`` when ``tight`` is true.
    When the block ends normally it is saved at ``dpi`` (with ``bbox_inches`` when given); it is
    closed in any case, also when the block raises.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    plt = pyplot()
    if not tight:
        subplots_kw.setdefault("layout", "constrained")
    fig, ax = plt.subplots(nrows, ncols, figsize=figsize, **subplots_kw)
    try:
        yield fig, ax
        if tight:
            fig.tight_layout()
        save_kw = {} if bbox_inches is None else {"bbox_inches": bbox_inches}
        fig.savefig(path, dpi=dpi, **save_kw)
    finally:
        plt.close(fig)
