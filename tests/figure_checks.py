"""What makes a figure hard to read: the checker every saved figure goes through.

``tests/conftest.py`` wraps ``Figure.savefig`` for every test, so a figure any test saves (an
experiment's, the demo's, ``fedlatent fit``'s) fails its test when it has no layout engine, a
panel with data lacks a title or an axis label, or a legend covers its data.
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure
from matplotlib.layout_engine import ConstrainedLayoutEngine, TightLayoutEngine

#: the share of an axes' data points a legend inside it may cover
MAX_COVERED = 0.02


def _is_colorbar(ax) -> bool:
    return ax.get_label() == "<colorbar>" or hasattr(ax, "_colorbar")


def _points(ax) -> np.ndarray:
    """Display coordinates of the data points of ``ax`` (line vertices, scatter offsets, bar
    corners and centres)."""
    pts = []
    for line in ax.get_lines():
        xy = np.asarray(line.get_xydata(), dtype=float)
        if xy.size:
            pts.append(line.get_transform().transform(xy))
    for coll in ax.collections:
        off = np.asarray(coll.get_offsets(), dtype=float)
        if off.size and off.ndim == 2:
            pts.append(coll.get_offset_transform().transform(off))
    for patch in ax.patches:
        bb = patch.get_window_extent()
        if bb.width > 0 and bb.height > 0:
            xs = np.linspace(bb.x0, bb.x1, 5)
            ys = np.linspace(bb.y0, bb.y1, 5)
            pts.append(np.array([[x, y] for x in xs for y in ys]))
    if not pts:
        return np.empty((0, 2))
    out = np.vstack(pts)
    return out[np.isfinite(out).all(axis=1)]


def figure_problems(fig: Figure) -> list[str]:
    """What makes ``fig`` hard to read, one phrase each (empty: nothing)."""
    problems = []
    engine = fig.get_layout_engine()
    if not isinstance(engine, ConstrainedLayoutEngine | TightLayoutEngine):
        problems.append(f"no layout engine (get_layout_engine() is {type(engine).__name__}); "
                        "use layout='constrained'")
    fig.canvas.draw()
    sup_x = getattr(fig, "_supxlabel", None)
    sup_y = getattr(fig, "_supylabel", None)
    for i, ax in enumerate(fig.axes):
        if _is_colorbar(ax) or not ax.get_visible() or not ax.axison or not ax.has_data():
            continue
        name = f"panel {i}" + (f" ({ax.get_title()!r})" if ax.get_title() else "")
        if not (ax.get_title() or ax.get_title("left") or ax.get_title("right")):
            problems.append(f"{name}: no title")
        if not ax.get_xlabel() and not (sup_x is not None and sup_x.get_text()):
            problems.append(f"{name}: no x label")
        if not ax.get_ylabel() and not (sup_y is not None and sup_y.get_text()):
            problems.append(f"{name}: no y label")
        legend = ax.get_legend()
        if legend is None or not legend.get_visible():
            continue
        box = legend.get_window_extent()
        pts = _points(ax)
        inside_ax = ax.get_window_extent()
        pts = pts[(pts[:, 0] >= inside_ax.x0) & (pts[:, 0] <= inside_ax.x1)
                  & (pts[:, 1] >= inside_ax.y0) & (pts[:, 1] <= inside_ax.y1)]
        if len(pts) == 0:
            continue
        covered = ((pts[:, 0] >= box.x0) & (pts[:, 0] <= box.x1)
                   & (pts[:, 1] >= box.y0) & (pts[:, 1] <= box.y1))
        if covered.mean() > MAX_COVERED:
            problems.append(f"{name}: the legend covers {covered.mean():.0%} of the data points")
    return problems
