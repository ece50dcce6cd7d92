"""FedGMM's size selection: n_input_components="auto" / n_learners="auto" by the held-out
log-likelihood (issue 14, K selection)."""

import warnings

import numpy as np
import pandas as pd
import pytest
from threadpoolctl import threadpool_limits

import fedlatent as fl
from fedlatent.data.fedgmm_data import make_fedgmm_synthetic
from fedlatent.models.fedgmm.selection import heldout_loglik


@pytest.fixture(autouse=True)
def _one_blas_thread():
    with threadpool_limits(1):
        yield


def _three_clusters():
    # three input components far apart (d = 2), three clients
    sp = make_fedgmm_synthetic(3, 120, n_components=3, n_features=2, mean_scale=6.0,
                               fractions=(1.0, 0.0, 0.0), random_state=1)
    return sp.train


def _fit(est, fd):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        return est.fit(fd)


@pytest.fixture(scope="module")
def auto_fit():
    fd = _three_clusters()
    with threadpool_limits(1):
        est = _fit(fl.FedGMM("auto", 1, n_input_components_candidates=[1, 3], max_rounds=8,
                             random_state=0, verbose=False), fd)
    return fd, est


def test_auto_input_components_chooses_three_separated_clusters(auto_fit):
    fd, est = auto_fit
    t = est.selection_scores_
    assert t.index.name == "n_input_components" and t.index.tolist() == [1, 3]
    assert {"heldout_loglik", "n_heldout", "n_iter", "converged", "error"} <= set(t.columns)
    # 20% of each client's rows held out
    n_out = sum(int(round(0.2 * cd.n_samples)) for _, cd in fd.items())
    assert t["n_heldout"].tolist() == [n_out, n_out]
    assert est.n_input_components_ == 3 and est.n_learners_ == 1
    assert t.loc[3, "heldout_loglik"] > t.loc[1, "heldout_loglik"] + 0.5
    # the chosen size is refitted on every row: the fitted arrays are those of M1 = 3
    assert est.means_.shape == (3, 2) and est.n_input_components == "auto"
    ref = _fit(fl.FedGMM(3, 1, max_rounds=8, random_state=0, verbose=False), fd)
    np.testing.assert_allclose(est.means_, ref.means_)


def test_heldout_loglik_is_the_mean_joint_loglik_with_each_clients_weights(auto_fit):
    fd, est = auto_fit
    got = heldout_loglik(est, fd)
    rows = [est.personalize(c).score_samples(cd.X, cd.y)["log_pxy"] for c, cd in fd.items()]
    assert got["n_heldout"] == fd.n_samples
    assert got["heldout_loglik"] == pytest.approx(float(pd.concat(rows).mean()), rel=1e-12)


def test_auto_fit_saves_and_loads_its_choice(auto_fit, tmp_path):
    fd, est = auto_fit
    est.save(tmp_path / "m")
    back = fl.FedGMM.load(tmp_path / "m")
    assert back.n_input_components_ == 3 and back.n_learners_ == 1
    pd.testing.assert_frame_equal(back.selection_scores_, est.selection_scores_,
                                  check_dtype=False)
    X = fd[fd.client_ids[0]].X
    np.testing.assert_allclose(back.predict_proba(X), est.predict_proba(X))


def test_auto_learners_is_scored_the_same_way():
    fd = _three_clusters()
    est = _fit(fl.FedGMM(3, "auto", n_learners_candidates=[1, 2], max_rounds=6, random_state=0,
                         verbose=False), fd)
    assert est.selection_scores_.index.name == "n_learners"
    best = est.selection_scores_["heldout_loglik"].idxmax()
    assert est.n_learners_ == best and est.coef_.shape[0] == best


def test_both_sizes_auto_is_refused():
    fd = _three_clusters()
    with pytest.raises(ValueError, match=r"n_input_components and n_learners are both 'auto'; "
                                         r"FedGMM chooses one size at a time"):
        fl.FedGMM("auto", "auto").fit(fd)


@pytest.mark.parametrize("cands,msg", [
    ([0, 2], r"n_input_components_candidates must be a non-empty list of integers >= 1"),
    ([2, 2], r"n_input_components_candidates lists a value twice: \[2, 2\]"),
])
def test_bad_candidates_are_refused(cands, msg):
    with pytest.raises(ValueError, match=msg):
        fl.FedGMM("auto", 1, n_input_components_candidates=cands).fit(_three_clusters())


def test_a_number_that_is_not_auto_is_refused_as_before():
    with pytest.raises(ValueError, match=r"n_input_components must be an integer >= 1, got 0"):
        fl.FedGMM(0, 1).fit(_three_clusters())
