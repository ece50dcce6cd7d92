"""``n_components="auto"``: the Gaussian mixture and the latent class regression choose their
number of components by BIC (engine/contract/selection.py), without overriding ``fit``."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import fedlatent as fl
from fedlatent.engine.contract.selection import Selection, check_candidates, select


def blobs(n_per_client: int = 90, seed: int = 0):
    """Three well separated 2-D blobs spread over five clients."""
    rng = np.random.default_rng(seed)
    centres = np.array([[0.0, 0.0], [6.0, 0.0], [0.0, 6.0]])
    data = {}
    for c in range(5):
        z = rng.integers(0, 3, size=n_per_client)
        data[f"c{c}"] = centres[z] + rng.normal(scale=0.7, size=(n_per_client, 2))
    return fl.FederatedDataset.from_arrays(data)


def two_lines(n_per_client: int = 80, seed: int = 1):
    rng = np.random.default_rng(seed)
    data = {}
    for c in range(4):
        x = rng.uniform(0, 10, size=(n_per_client, 1))
        z = rng.random(n_per_client) < 0.5
        y = np.where(z, 5 + 2 * x[:, 0], 15 - x[:, 0]) + 0.5 * rng.normal(size=n_per_client)
        data[f"c{c}"] = (x, y)
    return fl.FederatedDataset.from_arrays(data)


@pytest.fixture(scope="module")
def gmm_auto():
    fd = blobs()
    gm = fl.FederatedGaussianMixture("auto", n_components_candidates=[1, 2, 3, 4],
                                     max_rounds=30, random_state=0, verbose=False).fit(fd)
    return fd, gm


def test_gmm_auto_chooses_three_blobs_by_bic(gmm_auto):
    fd, gm = gmm_auto
    assert gm.n_components == "auto"  # the constructor parameter is not written back
    assert gm.n_components_ == 3 and gm.means_.shape == (3, 2)
    table = gm.selection_scores_
    assert table.index.name == "n_components" and table.index.tolist() == [1, 2, 3, 4]
    assert int(table["bic"].idxmin()) == 3
    # each candidate's BIC is its fitted model's: the chosen one's equals gm.bic(fd)
    assert table.loc[3, "bic"] == pytest.approx(gm.bic(fd), rel=1e-12)
    n_par = table["n_parameters"].to_numpy()
    assert n_par.tolist() == [5, 11, 17, 23]  # K-1 + 2K + 3K (full covariances in 2-D)
    np.testing.assert_allclose(table["bic"], -2 * table["loglik"] + n_par * np.log(450),
                               rtol=1e-12)


def test_gmm_auto_equals_a_fit_with_the_chosen_number(gmm_auto):
    fd, gm = gmm_auto
    ref = fl.FederatedGaussianMixture(3, max_rounds=30, random_state=0, verbose=False).fit(fd)
    np.testing.assert_array_equal(gm.means_, ref.means_)
    np.testing.assert_array_equal(gm.predict_dataset(fd), ref.predict_dataset(fd))
    assert gm.n_iter_ == ref.n_iter_


def test_gmm_auto_survives_save_and_load(gmm_auto, tmp_path):
    fd, gm = gmm_auto
    gm.save(tmp_path / "m")
    back = fl.FederatedGaussianMixture.load(tmp_path / "m")
    assert back.n_components == "auto" and back.n_components_ == 3
    pd.testing.assert_frame_equal(back.selection_scores_, gm.selection_scores_,
                                  check_dtype=False)
    np.testing.assert_array_equal(back.predict_dataset(fd), gm.predict_dataset(fd))


def test_lcr_auto_chooses_two_lines_by_bic():
    fd = two_lines()
    lcr = fl.LatentClassRegression("auto", n_components_candidates=[1, 2, 3], tol=1e-6,
                                   random_state=0).fit(fd)
    assert lcr.n_components_ == 2 and lcr.coef_.shape == (2, 1)
    table = lcr.selection_scores_
    assert int(table["bic"].idxmin()) == 2
    assert table["n_parameters"].tolist() == [3, 7, 11]  # K-1 weights, 2K coefficients, K var
    assert table.loc[2, "bic"] == pytest.approx(lcr.bic(fd), rel=1e-12)
    np.testing.assert_allclose(np.sort(lcr.coef_[:, 0]), [-1.0, 2.0], atol=0.1)


def test_auto_with_initial_parameters_is_refused():
    with pytest.raises(ValueError, match=r"^means_init fixes the number of components, but "
                       r"n_components='auto' chooses it; give n_components a number or leave "
                       r"means_init out$"):
        fl.FederatedGaussianMixture("auto", means_init=np.zeros((2, 2))).fit(blobs())


@pytest.mark.parametrize("bad, match", [
    ([], r"^n_components_candidates must be a non-empty list of integers >= 1 \(the "
         r"n_components values to try\), got \[\]$"),
    ([2, 0], r"^n_components_candidates must be a non-empty list of integers >= 1"),
    ([2, 2], r"^n_components_candidates lists a value twice: \[2, 2\]; give each "
             r"n_components once$"),
])
def test_bad_candidates_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        fl.LatentClassRegression("auto", n_components_candidates=bad).fit(two_lines())


def test_auto_refuses_a_checkpoint(tmp_path):
    with pytest.raises(ValueError, match=r"^n_components='auto' runs one fit per candidate"):
        fl.FederatedGaussianMixture("auto").fit(blobs(), checkpoint=tmp_path / "ck")


@pytest.mark.usefixtures("saturation_rule_off")
def test_a_size_that_cannot_be_fitted_is_recorded_and_skipped():
    fd = fl.FederatedDataset.from_arrays({"a": np.arange(6.0).reshape(3, 2),
                                          "b": np.arange(6.0, 12.0).reshape(3, 2) ** 1.5})
    with pytest.warns(UserWarning, match=r"1 of 2 candidate n_components values could not be "
                                         r"fitted"):
        gm = fl.FederatedGaussianMixture("auto", n_components_candidates=[1, 7],
                                         init_params="random", random_state=0,
                                         verbose=False).fit(fd)
    assert gm.n_components_ == 1
    assert np.isnan(gm.selection_scores_.loc[7, "bic"])
    assert "fewer than n_components=7" in gm.selection_scores_.loc[7, "error"]


@pytest.mark.usefixtures("saturation_rule_off")
def test_select_with_a_split_scores_on_held_out_rows_and_refits_on_all():
    """The held-out form a model with a held-out score (FedGMM, HLCR) uses."""
    fd = blobs(60)
    seen = []

    def fit(est, data):
        seen.append((est.n_components, data.n_samples))
        return est.fit(data)

    sel = Selection("n_components", (2, 3), "heldout_loglik",
                    lambda est, held: est.score(held), lower_is_better=False,
                    split=lambda d: d.train_test_split(0.25, random_state=0))
    best, table = select(fl.FederatedGaussianMixture("auto", random_state=0, verbose=False),
                         fd, sel, fit)
    assert seen == [(2, 225), (3, 225), (3, 300)]  # candidates on 75%, the winner on all
    assert best.n_components == 3 and table["heldout_loglik"].idxmax() == 3


def test_check_candidates_default_and_values():
    assert check_candidates(None, range(1, 4), "n_clusters", "k") == (1, 2, 3)
    assert check_candidates(np.array([4, 2]), (), "n_clusters", "k") == (4, 2)


def test_cli_fit_lcr_auto_saves_the_choice(tmp_path):
    import json

    from typer.testing import CliRunner

    from fedlatent.cli import app

    fd = two_lines(40)
    df = fd.to_pandas(client="site")
    path = tmp_path / "d.csv"
    df.to_csv(path, index=False)
    res = CliRunner().invoke(app, [
        "fit", "lcr", "--data", str(path), "--client", "site", "--target", "y",
        "--param", "n_components=auto", "--param", "n_components_candidates=[1, 2]",
        "--param", "tol=1e-6", "--out", str(tmp_path / "m")])
    assert res.exit_code == 0, res.output
    meta = json.loads((tmp_path / "m" / "model.json").read_text())
    assert meta["params"]["n_components"] == "auto"
    assert meta["selection"]["param"] == "n_components" and meta["selection"]["value"] == 2
    assert [r["n_components"] for r in meta["selection"]["scores"]] == [1, 2]
    back = fl.LatentClassRegression.load(tmp_path / "m" / "model")
    assert back.n_components_ == 2 and int(back.selection_scores_["bic"].idxmin()) == 2
