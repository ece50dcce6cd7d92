"""What makes a figure hard to read: the checker every saved figure goes through.

``tests/conftest.py`` wraps ``Figure.savefig`` for every test, so a figure any test saves (an
experiment's, the demo's, ``fedlatent fit``'s) fails its test when it has no layout engine, a
panel with data lacks a title or an axis label, a legend covers its data, or a line is fully
hidden under lines drawn over it (:func:`hidden_lines`).
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure
from matplotlib.layout_engine import ConstrainedLayoutEngine, TightLayoutEngine

#: the share of an axes' data points a legend inside it may cover
MAX_COVERED = 0.02
#: a line is hidden when every point of it lies this close (in pixels, plus the difference of
#: the half line widths) to the solid lines drawn over it
HIDDEN_PIXELS = 1.0


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


def _sampled(line, step: float = 2.0) -> np.ndarray:
    """Display points along ``line``, one every ``step`` pixels (its vertices included)."""
    xy = np.asarray(line.get_xydata(), dtype=float)
    xy = line.get_transform().transform(xy) if xy.size else np.empty((0, 2))
    xy = xy[np.isfinite(xy).all(axis=1)]
    if len(xy) < 2:
        return xy
    seg = np.diff(xy, axis=0)
    n = np.maximum(1, np.ceil(np.hypot(seg[:, 0], seg[:, 1]) / step).astype(int))
    t = np.concatenate([np.arange(k) / k for k in n])
    start = np.repeat(xy[:-1], n, axis=0)
    return np.vstack([start + t[:, None] * np.repeat(seg, n, axis=0), xy[-1:]])


def _distance_to_polyline(pts: np.ndarray, line) -> np.ndarray:
    """Distance in pixels from each of ``pts`` to the segments of ``line`` (display space)."""
    xy = np.asarray(line.get_xydata(), dtype=float)
    xy = line.get_transform().transform(xy) if xy.size else np.empty((0, 2))
    xy = xy[np.isfinite(xy).all(axis=1)]
    if len(xy) == 0:
        return np.full(len(pts), np.inf)
    if len(xy) == 1:
        return np.hypot(*(pts - xy[0]).T)
    a, b = xy[:-1], xy[1:]
    ab = b - a
    denom = np.maximum((ab**2).sum(axis=1), 1e-12)
    t = np.clip(((pts[:, None, :] - a[None]) * ab[None]).sum(axis=2) / denom, 0.0, 1.0)
    near = a[None] + t[..., None] * ab[None]
    return np.hypot(*(pts[:, None, :] - near).transpose(2, 0, 1)).min(axis=1)


def _covers(top, line) -> bool:
    """Whether ``top`` can cover ``line``: solid, at least as wide, drawn over it."""
    return (top.get_visible() and top.get_linestyle() in ("-", "solid")
            and top.get_linewidth() >= line.get_linewidth())


def hidden_lines(ax) -> list[str]:
    """Labels of the lines of ``ax`` that are hidden under lines drawn over them: every point of
    the line within :data:`HIDDEN_PIXELS` of solid lines at least as wide, drawn later (or at a
    higher zorder), and no marker of its own that those lines lack."""
    lines = [ln for ln in ax.get_lines() if ln.get_visible() and len(ln.get_xydata())]
    order = sorted(range(len(lines)), key=lambda i: (lines[i].get_zorder(), i))
    hidden = []
    for rank, i in enumerate(order):
        line = lines[i]
        over = [lines[j] for j in order[rank + 1:] if _covers(lines[j], line)]
        marker = line.get_marker()
        if not over or (marker not in ("None", "", " ", None)
                        and marker not in {o.get_marker() for o in over}):
            continue
        if _under(_sampled(line), line, over):
            hidden.append(line.get_label())
    return hidden


def _under(pts: np.ndarray, line, over: list, chunk: int = 256) -> bool:
    """Whether every one of ``pts`` (of ``line``) lies under one of the lines ``over``."""
    if len(pts) == 0:
        return False
    px = line.figure.dpi / 72.0  # line widths are in points
    slack = [HIDDEN_PIXELS + 0.5 * (o.get_linewidth() - line.get_linewidth()) * px
             for o in over]
    for start in range(0, len(pts), chunk):  # stops at the first visible stretch
        block = pts[start:start + chunk]
        covered = np.zeros(len(block), dtype=bool)
        for o, s in zip(over, slack):
            covered |= _distance_to_polyline(block, o) <= s
        if not covered.all():
            return False
    return True


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
        for label in hidden_lines(ax):
            problems.append(f"{name}: the line {label!r} is hidden under the lines drawn over "
                            "it; give it a marker or a line style, or another panel")
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
