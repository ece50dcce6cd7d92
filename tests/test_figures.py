"""Every figure fedlatent writes is readable: a layout engine (constrained or tight), a title
and labelled axes on every panel that shows data, legends that cover (almost) no data.

Figures are checked as they are saved (``Figure.savefig`` is wrapped), so every file an
experiment writes is seen. The checker itself is tested first on figures made to fail.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.plotting import pyplot
from figure_checks import figure_problems


# ---- the checker finds what it should ----------------------------------------------------------
def _good(layout="constrained"):
    plt = pyplot()
    fig, ax = plt.subplots(layout=layout)
    x = np.linspace(0, 1, 50)
    ax.plot(x, x**2, label="x^2")
    ax.set(title="t", xlabel="x", ylabel="y")
    ax.legend(loc="upper left")
    return fig, ax


def test_a_readable_figure_has_no_problem():
    fig, _ = _good()
    assert figure_problems(fig) == []
    pyplot().close(fig)


def test_missing_title_labels_and_layout_are_found():
    fig, ax = _good(layout=None)
    ax.set(title="", xlabel="", ylabel="")
    assert figure_problems(fig) == [
        "no layout engine (get_layout_engine() is NoneType); use layout='constrained'",
        "panel 0: no title", "panel 0: no x label", "panel 0: no y label"]
    pyplot().close(fig)


def test_a_tight_layout_call_is_not_a_layout_engine():
    fig, _ = _good(layout=None)
    fig.tight_layout()
    assert figure_problems(fig)[0].startswith("no layout engine (get_layout_engine() is "
                                              "PlaceHolderLayoutEngine)")
    pyplot().close(fig)


def test_a_legend_over_the_data_is_found():
    plt = pyplot()
    fig, ax = plt.subplots(layout="constrained")
    rng = np.random.default_rng(0)
    ax.scatter(rng.random(2000), rng.random(2000), s=2, label="uniform points")
    ax.set(title="t", xlabel="x", ylabel="y")
    ax.legend(loc="center", fontsize=20, markerscale=10)
    (problem,) = figure_problems(fig)
    assert problem.startswith("panel 0 ('t'): the legend covers ")
    pyplot().close(fig)


def test_colorbars_and_empty_panels_are_not_checked():
    plt = pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, layout="constrained")
    im = a1.imshow(np.eye(3))
    a1.set(title="t", xlabel="x", ylabel="y")
    fig.colorbar(im, ax=a1)
    a2.axis("off")
    assert figure_problems(fig) == []
    plt.close(fig)


# ---- the demo ---------------------------------------------------------------------------------
def test_demo_figure_is_readable(saved_figures, tmp_path):
    from sklearn.mixture import GaussianMixture

    from fedlatent import demo

    fd = demo.make_demo_data(n_clients=4, mean_size=80, random_state=0)
    fed = fl.FederatedGaussianMixture(3, max_rounds=5, random_state=0, verbose=False,
                                      federation=fl.Federation(track_h=True)).fit(fd)
    sk = GaussianMixture(3, max_iter=5, random_state=0).fit(fd.pooled().X)
    h = fed.history_.to_frame()
    demo._plot(fd, fed, sk, demo._match(fed.means_, sk.means_), h, h, tmp_path / "demo.png")
    assert saved_figures == [("demo.png", [])]
    assert (tmp_path / "demo.png").stat().st_size > 0


# ---- every experiment's figures -------------------------------------------------------------
#: experiments whose own tests run them with ``out=`` (so the autouse ``saved_figures`` check in
#: conftest.py sees every figure they write): the test file that does it
COVERED_BY = {
    "fedem_toy": "test_fedem_toy.py",
    "fedgmm_label_skew": "models/test_fedgmm_one_class.py",
    "fedgmm_novelty": "test_fedgmm_experiments.py",
    "fedgmm_synthetic": "test_fedgmm_experiments.py",
    "fedgmm_unseen_clients": "test_fedgmm_experiments.py",
    "hlcr_figure3": "test_hlcr_experiments.py",
    "hlcr_real": "test_hlcr_real.py",
    "lcr_flexmix": "test_lcr_experiments.py",
    "privacy_utility": "test_privacy_utility.py",
    "sec_attack": "test_sec_experiments.py",
    "sec_fairness": "test_sec_experiments.py",
    "sec_real": "test_sec_real.py",
    "sec_simulation1": "test_sec_experiments.py",
    "sec_simulation2": "test_sec_experiments.py",
}
#: experiments no other test runs: run here at their quick size (measured on the shared 2-core
#: machine at load 10-14: fedgmm_nongaussian 109 s, fedgmm_table2 88 s)
RUN_HERE = ("fedgmm_nongaussian", "fedgmm_table2")


def _runs_with_out(text: str, name: str) -> bool:
    """Whether ``text`` calls experiment ``name`` with ``out=`` (its figures then written, and
    checked by the autouse ``saved_figures`` fixture)."""
    for m in re.finditer(rf"\b{re.escape(name)}\(", text):
        call = text[m.end():]
        if "out=" in call[:call.index(")")]:
            return True
    return False


def test_every_experiment_has_its_figures_checked():
    """Every experiment is run with ``out=`` by some test (found by reading the tests, so a new
    experiment is covered by its own test file without editing a list here), or here."""
    tests = Path(__file__).parent
    texts = {p: p.read_text(encoding="utf-8") for p in tests.rglob("test_*.py")
             if p != Path(__file__)}
    for name, file in COVERED_BY.items():  # the files named above still do it
        assert _runs_with_out((tests / file).read_text(), name), f"{file} runs {name} without out="
    missing = [name for name in fl.experiments.available() if name not in RUN_HERE
               and not any(_runs_with_out(t, name) for t in texts.values())]
    assert missing == [], f"experiments no test runs with out= (so no figure is checked): {missing}"


@pytest.mark.slow
@pytest.mark.parametrize("name", RUN_HERE)
def test_experiment_figures_are_readable(name, saved_figures, tmp_path):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        getattr(fl.experiments, name)(quick=True, out=tmp_path, random_state=0)
    assert saved_figures, f"{name} wrote no figure"
    assert all(p == [] for _, p in saved_figures)
    for fname, _ in saved_figures:
        assert any(tmp_path.rglob(fname)), fname
