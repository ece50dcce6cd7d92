"""flexmix's NPreg example, federated (quick size): federated EM is centralized EM, both recover
the two curves, half participation lands close, and the figure is written."""

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.experiments.lcr import make_npreg_federation, npreg_truth


@pytest.fixture(scope="module")
def table_and_out(tmp_path_factory):
    out = tmp_path_factory.mktemp("lcr")
    return fl.experiments.lcr_flexmix(quick=True, out=out, random_state=0), out


def _rows(table, method):
    return table[table["method"] == method].sort_values("component")


def test_federated_equals_centralized_em(table_and_out):
    table, _ = table_and_out
    fed, cen = _rows(table, "federated"), _rows(table, "centralized EM")
    assert fed["max_abs_diff_centralized"].max() < 1e-8
    assert fed["rounds"].iloc[0] == cen["rounds"].iloc[0]
    assert fed["mean_loglik"].iloc[0] == pytest.approx(cen["mean_loglik"].iloc[0], rel=1e-10)


def test_recovers_the_npreg_curves(table_and_out):
    table, _ = table_and_out
    t = npreg_truth()
    fed = _rows(table, "federated")
    np.testing.assert_allclose(fed["coef_x"], t["coef"][:, 0], atol=0.6)
    np.testing.assert_allclose(fed["coef_x2"], t["coef"][:, 1], atol=0.06)
    np.testing.assert_allclose(fed["intercept"], t["intercept"], atol=1.5)
    np.testing.assert_allclose(fed["sigma"], t["sigma"], atol=0.4)
    np.testing.assert_allclose(fed["weight"], t["weights"], atol=0.05)
    # the fitted likelihood is at least the truth's (it is the maximum)
    assert fed["mean_loglik"].iloc[0] >= _rows(table, "truth")["mean_loglik"].iloc[0]


def test_half_participation_lands_close(table_and_out):
    table, _ = table_and_out
    assert _rows(table, "federated p=0.5")["max_abs_diff_centralized"].max() < 0.05


def test_table_and_figure(table_and_out):
    table, out = table_and_out
    assert list(dict.fromkeys(table["method"])) == ["truth", "federated", "centralized EM",
                                                    "federated p=0.5"]
    assert set(table.columns) >= {"weight", "intercept", "coef_x", "coef_x2", "sigma",
                                  "mean_loglik", "rounds", "max_abs_diff_centralized"}
    assert (out / "lcr_flexmix.png").stat().st_size > 10_000


def test_clients_are_label_skewed_and_unequal():
    fd, classes = make_npreg_federation(n_clients=12, mean_size=60, random_state=0)
    shares = sorted(float(np.mean(classes[c] == 0)) for c in fd.client_ids)
    assert shares[0] < 0.25 and shares[-1] > 0.75
    assert len(set(fd.sizes().values())) > 6
    np.testing.assert_allclose(fd["c00"].X[:, 1], fd["c00"].X[:, 0] ** 2)


def test_experiment_is_listed():
    assert "lcr_flexmix" in fl.experiments.available()
    assert fl.experiments.available()["lcr_flexmix"].startswith("flexmix's NPreg")
