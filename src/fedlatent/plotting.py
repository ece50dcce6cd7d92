"""The one place fedlatent gets matplotlib: pyplot on the Agg backend, for writing image files.

Experiments, the demo and the CLI only write PNG files; selecting Agg keeps them working on
machines without a display and never opens a window.
"""

from __future__ import annotations

__all__ = ["pyplot"]


def pyplot():
    """``matplotlib.pyplot`` with the file-only Agg backend selected."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
