"""SEC reproductions at quick size: the numbers the issue asks for, and the CLI."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fedlatent.experiments import sec_attack, sec_fairness, sec_simulation1, sec_simulation2


@pytest.mark.slow
def test_simulation1_p5_snr16(tmp_path):
    # ten of quick's twenty replications: the suite's time budget (each is an SEC fit with a
    # gap statistic over LassoCV and forest candidates)
    table = sec_simulation1(quick=True, out=tmp_path, random_state=0, n_replications=10,
                            n_jobs=2)
    row = table.iloc[0]
    assert (row["p"], row["snr"], row["n_replications"]) == (5, 16.0, 10)
    assert row["accuracy"] >= 0.9
    assert row["k_correct"] >= 0.8
    assert (tmp_path / "sec_simulation1_fig2.png").stat().st_size > 0
    assert (tmp_path / "sec_simulation1_fig3.png").stat().st_size > 0


@pytest.mark.slow
def test_fairness_b2_sec_beats_fairness_by_30_percent(tmp_path):
    table = sec_fairness(quick=True, out=tmp_path, random_state=0, n_jobs=2)
    row = table.iloc[0]
    assert row["b"] == 2.0
    assert row["sec_fairness"] <= 0.7 * row["fairness"]
    # the oracle uses R: its MSE is the noise variance 1
    assert row["oracle"] == pytest.approx(1.0, abs=0.15)
    assert (tmp_path / "sec_fairness_table1.png").stat().st_size > 0


@pytest.mark.slow
def test_attack_intact_cluster_is_clean_and_near_oracle(tmp_path):
    table = sec_attack(quick=True, out=tmp_path, random_state=0, n_jobs=2)
    assert list(table["d"]) == [10, 40]
    assert (table["attacked_in_intact_cluster"] == 0).all()
    assert (table["mse_sec"] <= 1.1 * table["mse_oracle"]).all()
    # collaborating with everyone is far worse once attacked learners are many
    assert (table["mse_all"] > 1.5 * table["mse_oracle"]).all()
    assert (tmp_path / "sec_attack_fig4.png").stat().st_size > 0


def test_simulation2_quick_runs_one_set(tmp_path):
    table = sec_simulation2(quick=True, out=tmp_path, candidate_sets=("table2-1",),
                            n_replications=1, n_features=6)
    row = table.iloc[0]
    assert row["n_candidates"] == 1 and row["gb"] == 1.0
    assert 0 <= row["accuracy"] <= 100
    assert np.isfinite(row["mse_collaboration"]) and np.isfinite(row["mse_no_collaboration"])
    # the response of f1 varies in the hundreds: its standardized MSE is far smaller
    assert 0 < row["mse_collaboration_std"] < row["mse_collaboration"] / 100


def test_cli_fit_sec(tmp_path):
    from typer.testing import CliRunner

    from fedlatent.cli import app
    from fedlatent.data.sec_data import make_sec_simulation1

    fd, labels = make_sec_simulation1(n_learners=8, n_samples=30, snr=64.0, random_state=0)
    frames = []
    for c, cd in fd.items():
        d = pd.DataFrame(cd.X, columns=[f"x{j}" for j in range(cd.X.shape[1])])
        d["y"] = cd.y
        d["learner"] = c
        frames.append(d)
    path = tmp_path / "data.csv"
    pd.concat(frames).to_csv(path, index=False)
    out = tmp_path / "out"
    runner = CliRunner()
    res = runner.invoke(app, ["fit", "sec", "--data", str(path), "--client", "learner",
                              "--target", "y", "--candidates", "linear", "--clusters", "2",
                              "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "cluster 0 (4): l00, l01, l02, l03" in res.output
    assert "cluster 1 (4): l04, l05, l06, l07" in res.output
    S = pd.read_csv(out / "similarity.csv", index_col=0)
    assert S.shape == (8, 8)
    np.testing.assert_allclose(np.diag(S.to_numpy()), 1.0)
    assert (out / "similarity.png").stat().st_size > 0
    res = runner.invoke(app, ["fit", "sec", "--data", str(path), "--client", "learner",
                              "--target", "y", "--clusters", "9", "--out", str(out)])
    assert res.exit_code == 2
    assert ("error: --components 9 is larger than the number of learners (8); give --components "
            "<= 8 or auto to choose K from the data") in res.output


def test_quick_figure_says_what_it_shows(tmp_path, monkeypatch):
    # a quick run's chart has one x value: its title says the run's size and each point carries
    # its value, in a constrained layout
    from matplotlib.figure import Figure
    from matplotlib.layout_engine import ConstrainedLayoutEngine

    from fedlatent.experiments.sec import _chart, _size

    figs = []
    orig = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: (figs.append(self),
                                                                  orig(self, *a, **k))[1])
    table = pd.DataFrame({"b": [2.0], "mse": [1.234], "n_replications": [2]})
    with _chart(tmp_path, "q.png", "b", "validation MSE", "SEC fairness example (Table 1)",
                size=_size(table, "quick run: 1 value(s) of b")) as ax:
        ax.plot(table["b"], table["mse"], "o-", label="SEC-Fairness")
    (fig,) = figs
    ax = fig.axes[0]
    assert isinstance(fig.get_layout_engine(), ConstrainedLayoutEngine)
    assert ax.get_title() == ("SEC fairness example (Table 1)\n"
                              "quick run: 1 value(s) of b; 2 replications per point")
    assert [t.get_text() for t in ax.texts] == ["1.23"]
    assert ax.get_xlim() == (1.0, 3.0)
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("b", "validation MSE")
