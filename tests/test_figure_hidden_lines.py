"""Figures that show every line (issue 26, item 6): the checker flags a line fully hidden under
lines drawn over it, and the FedEM toy figures pass it."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fedlatent.experiments import fedem_toy
from fedlatent.experiments.fedem_toy import _flattening, _plot
from fedlatent.plotting import pyplot
from figure_checks import figure_problems, hidden_lines


def _axes():
    plt = pyplot()
    fig, ax = plt.subplots(layout="constrained")
    ax.set(title="t", xlabel="x", ylabel="y")
    return plt, fig, ax


X = np.linspace(0, 1, 40)


def test_a_line_under_an_identical_line_is_found():
    plt, fig, ax = _axes()
    ax.plot(X, X**2, label="under")
    ax.plot(X, X**2, label="over")
    ax.plot(X, 1 - X, label="elsewhere")
    assert hidden_lines(ax) == ["under"]
    assert figure_problems(fig) == [
        "panel 0 ('t'): the line 'under' is hidden under the lines drawn over it; give it a "
        "marker or a line style, or another panel"]
    plt.close(fig)


def test_a_line_hidden_under_two_others_is_found():
    plt, fig, ax = _axes()
    x = np.linspace(0, 1, 41)  # 0.5 is a vertex of every line
    ax.plot(x, np.abs(x - 0.5), label="under")
    ax.plot(x[x <= 0.5], 0.5 - x[x <= 0.5], label="left half")
    ax.plot(x[x >= 0.5], x[x >= 0.5] - 0.5, label="right half")
    assert hidden_lines(ax) == ["under"]
    plt.close(fig)


@pytest.mark.parametrize("style", [
    dict(under=dict(marker="o"), over=dict()),             # its own markers show
    dict(under=dict(), over=dict(ls="--")),                 # seen through the dashes
    dict(under=dict(lw=3.0), over=dict(lw=1.0)),            # wider than the line over it
    dict(under=dict(), over=dict(), shift=0.05),            # a few pixels apart
])
def test_a_visible_line_is_not_flagged(style):
    plt, fig, ax = _axes()
    ax.plot(X, X**2, label="under", **style["under"])
    ax.plot(X, X**2 + style.get("shift", 0.0), label="over", **style["over"])
    assert hidden_lines(ax) == []
    plt.close(fig)


def test_the_zorder_decides_which_line_is_under():
    plt, fig, ax = _axes()
    ax.plot(X, X**2, label="first, on top", zorder=3)
    ax.plot(X, X**2, label="second, beneath")
    assert hidden_lines(ax) == ["second, beneath"]
    plt.close(fig)


def _toy_table() -> pd.DataFrame:
    """A table shaped like fedem_toy's: EM and FedEM p=1 coincide, as do the participation
    levels; naive FedEM wanders far off in the weight estimate."""
    rounds = np.arange(1, 41)
    rows = []
    curves = {
        "EM (p=1)": (np.exp(-rounds / 3.0), 0.3 + 0.02 * np.exp(-rounds / 5.0)),
        "FedEM p=1": (np.exp(-rounds / 3.0), 0.3 + 0.02 * np.exp(-rounds / 5.0)),
        "FedEM p=0.5": (np.exp(-rounds / 3.0), 0.3 + 0.02 * np.exp(-rounds / 5.0)),
        "naive FedEM p=1": (0.1 + 0 * rounds, 0.3 + 0.4 * np.sin(rounds / 6.0)),
    }
    for case in ("homogeneous", "heterogeneous"):
        for method, (h2, w) in curves.items():
            rows += [{"case": case, "method": method, "round": int(r), "h2_mean": a,
                      "h2_se": 0.0, "weight_mean": b, "bytes_up_mean": 1.0}
                     for r, a, b in zip(rounds, h2, w)]
    return pd.DataFrame(rows)


def test_the_toy_figures_show_every_line(saved_figures, tmp_path):
    table = _toy_table()
    assert _flattening(table, "weight_mean") == ["naive FedEM p=1"]
    _plot(table, tmp_path)
    assert [name for name, _ in saved_figures] == ["fedem_toy_h.png", "fedem_toy_weight.png"]
    assert all(problems == [] for _, problems in saved_figures)


def test_the_toy_figures_before_had_hidden_lines(tmp_path):
    """The same table drawn as before (plain lines, one panel per case) fails the check."""
    table = _toy_table()
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, layout="constrained")
    for ax, case in zip(axes, ("homogeneous", "heterogeneous")):
        for method, m in table[table["case"] == case].groupby("method", sort=False):
            ax.plot(m["round"], m["h2_mean"], label=method)
        ax.set(title=case, xlabel="round", ylabel="h", yscale="log")
    assert hidden_lines(axes[0]) == ["EM (p=1)", "FedEM p=1"]
    plt.close(fig)


def test_fedem_toy_writes_figures_that_pass_the_checker(saved_figures, tmp_path):
    fedem_toy(quick=True, n_clients=10, n_per_client=30, n_seeds=1, rounds=12,
              cases=("heterogeneous",), out=tmp_path,
              settings=["EM (p=1)", "FedEM p=1", "FedEM p=0.5", "naive FedEM p=1"])
    assert sorted(name for name, _ in saved_figures) == ["fedem_toy_h.png",
                                                         "fedem_toy_weight.png"]
    assert all(problems == [] for _, problems in saved_figures)
