"""summary() on every estimator with parameters to report (issue 24, "Done when": a test pins
its columns): FedGMM (point estimates with the reason for no standard errors) and SEC (the
chosen model). LCR and the Gaussian mixture are pinned in test_inference_*.py, HLCR in
test_hlcr_inference.py."""

import warnings

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.data.fedgmm_data import make_fedgmm_synthetic
from fedlatent.data.sec_data import make_sec_simulation1
from fedlatent.engine.contract.registry import estimator_entries
from fedlatent.models.fedgmm import FedGMM
from fedlatent.models.sec import SEC


def test_every_registered_estimator_has_a_summary():
    missing = [n for n, e in estimator_entries().items() if not callable(
        getattr(e.cls, "summary", None))]
    assert missing == []


def test_fedgmm_summary_pins_its_columns_and_rows():
    sp = make_fedgmm_synthetic(n_clients=4, n_samples_per_client=80, n_features=2,
                               mean_scale=2.0, fractions=(0.8, 0.1, 0.1), random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        est = FedGMM(2, 2, max_rounds=5, random_state=0, verbose=False).fit(sp.train)
    s = est.summary()
    t = s.table
    assert list(t.columns) == ["coef", "std err", "note"]
    names = [str(f) for f in est.feature_names_in_]
    c1 = str(est.classes_[1])
    assert list(t.loc["x0"].index) == ["weight", *[f"mean {f}" for f in names]]
    assert list(t.loc["learner 1"].index) == ["weight", *[f"{c1}: {f}" for f in names],
                                              f"{c1}: intercept"]
    assert t.shape[0] == 2 * (1 + 2) + 2 * (1 + 3)
    np.testing.assert_array_equal(t.xs("weight", level="parameter")["coef"].to_numpy(),
                                  np.r_[est.weights_x_, est.weights_y_])
    np.testing.assert_array_equal(t.loc["learner 0", "coef"].to_numpy()[1:], est.coef_[0, 0])
    np.testing.assert_array_equal(t.loc["x1", "coef"].to_numpy()[1:], est.means_[1])
    assert t["std err"].isna().all()
    assert (t["note"] == "no SE: no observed information").all()
    assert s.info["Standard errors"].startswith("none: FedGMM's clients send no observed")
    assert "FedGMM results" in str(s) and s.info["Learners"] == "2"


def test_sec_summary_describes_the_chosen_model():
    fd, _ = make_sec_simulation1(n_learners=6, n_samples=40, snr=64.0, random_state=1)
    sec = SEC(candidates="linear", n_clusters=2, random_state=0).fit(fd)
    s = sec.summary()
    t = s.table
    assert list(t.columns) == ["cluster", "selected", "n_samples", "train mse"]
    assert list(t.index) == [str(c) for c in sec.learner_ids_] and t.index.name == "learner"
    np.testing.assert_array_equal(t["cluster"].to_numpy(), sec.labels_)
    np.testing.assert_array_equal(t["train mse"].to_numpy(), sec.errors_)
    assert list(t["selected"]) == list(sec.selected_)
    assert s.info["Clusters"] == "2 (given)"
    assert s.info["Standard errors"] == "none (not a likelihood model)"
    assert "SEC results" in str(s)


@pytest.mark.parametrize("name", ["fedgmm", "sec"])
def test_summary_before_fit_is_refused(name):
    with pytest.raises(fl.NotFittedError, match="not fitted"):
        estimator_entries()[name].cls().summary()
