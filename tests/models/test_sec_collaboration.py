"""SEC collaborates only where it helps (issue 42, item 6): each learner compares, out of fold
on its own rows, its own model with its cluster's prediction, and predicts with the cluster only
where it did better by a standard error (over the validation folds); elsewhere it keeps its own
model, so the defaults are no worse than each learner alone on its validation rows."""

import numpy as np
import pytest

from fedlatent.data.sec_data import make_sec_simulation1
from fedlatent.models.sec import SEC
from fedlatent.models.sec.candidates import out_of_fold, standardize_xy
from fedlatent.models.sec.estimator import COLLABORATE_SE


@pytest.fixture(scope="module")
def one_cluster_of_two_groups():
    """Two groups of learners with different lines, forced into one cluster: the cluster's
    average predicts every learner worse than its own line."""
    fd, _ = make_sec_simulation1(n_learners=8, n_samples=60, snr=64.0, random_state=3)
    return fd, SEC(candidates="linear", n_clusters=1, random_state=0).fit(fd)


def test_learners_whose_cluster_predicts_worse_keep_their_own_model(one_cluster_of_two_groups):
    fd, sec = one_cluster_of_two_groups
    val = sec.validation_mse_
    assert np.isfinite(val).all() and not sec.collaborates_.any()
    assert (val[:, 1] > val[:, 0]).all()  # the mixed cluster is worse for everyone
    X = np.random.default_rng(0).standard_normal((5, fd.n_features))
    for i, c in enumerate(sec.learner_ids_):
        own = sec._raw_predictions(X, [i], c)[0]
        np.testing.assert_allclose(sec.predict(X, learner=c), own, rtol=1e-12)
    assert sec.summary().info["Collaboration"].startswith("did not help: every learner "
                                                          "compared (8) keeps its own model")


def test_a_cluster_that_helps_is_used_and_always_is_eq_4():
    fd, _ = make_sec_simulation1(n_learners=8, n_samples=12, snr=2.0, random_state=1)
    sec = SEC(candidates="linear", n_clusters=2, random_state=0).fit(fd)
    val = sec.validation_mse_
    use = val[:, 1] + COLLABORATE_SE * val[:, 2] < val[:, 0]
    np.testing.assert_array_equal(sec.collaborates_, use)
    assert use.any()  # a noisy learner gains from its cluster's models
    always = SEC(candidates="linear", n_clusters=2, random_state=0,
                 collaboration="always").fit(fd)
    assert always.n_iter_ == 2 and not np.isfinite(always.validation_mse_).any()
    X = np.random.default_rng(1).standard_normal((4, fd.n_features))
    for i, c in enumerate(sec.learner_ids_):
        if use[i]:  # the same eq. (4) prediction as the paper's rule
            np.testing.assert_allclose(sec.predict(X, learner=c),
                                       always.predict(X, learner=c), rtol=1e-12)


def test_a_learners_reply_is_its_out_of_fold_comparison(one_cluster_of_two_groups):
    """Recomputed here for one learner: its own refit out of fold, the others' models (which
    never saw its rows) and the eq. (4) weights."""
    fd, sec = one_cluster_of_two_groups
    i, c = 2, sec.learner_ids_[2]
    Xs, ys, *_ = standardize_xy(fd[c].X, np.asarray(fd[c].y, dtype=float))
    own = sec._load_learner_model(i)
    rows, pred_own, held, folds = out_of_fold(own, Xs, ys, "systematic",
                                              np.random.default_rng(0))
    assert (rows == np.arange(len(ys))).all() and (held == 1).all()  # each row once
    np.testing.assert_array_equal(folds, np.arange(len(ys)) % 5)  # systematic: row i in i % 5
    others = [j for j in range(len(sec.learner_ids_)) if j != i]
    P = np.vstack([[sec._load_learner_model(j).predict(Xs) for j in others], pred_own[None]])
    w = np.r_[sec.n_samples_[others], sec.n_samples_[i]]
    pred_cluster = (w / w.sum()) @ P
    d = (ys - pred_cluster) ** 2 - (ys - pred_own) ** 2
    per_fold = np.array([d[folds == f].mean() for f in range(5)])  # the folds' differences
    np.testing.assert_allclose(sec.validation_mse_[i],
                               [np.mean((ys - pred_own) ** 2), np.mean((ys - pred_cluster) ** 2),
                                per_fold.std(ddof=1) / np.sqrt(5)], rtol=1e-10)


def test_out_of_fold_predicts_every_row_from_a_fit_without_it():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(10, 2))
    y = X @ np.array([1.0, -2.0])
    from sklearn.linear_model import LinearRegression

    _, pred, _, _ = out_of_fold(LinearRegression(), X, y, "systematic", rng)
    np.testing.assert_allclose(pred, y, atol=1e-10)  # a noiseless line: every refit is exact
    y2 = y.copy()
    y2[3] += 5.0  # a row's own noise never enters its prediction
    assert abs(out_of_fold(LinearRegression(), X, y2, "systematic", rng)[1][3] - y[3]) < 5.0


def test_out_of_fold_with_frequency_weights_is_the_rows_repeated():
    """A row of weight w is w copies next to each other: its weight spread over the folds its
    copies fall in, each part predicted by the fit without that fold (test_weights_models
    compares SEC's whole validation step so)."""
    from sklearn.linear_model import LinearRegression

    rng = np.random.default_rng(1)
    X, y = rng.normal(size=(9, 2)), rng.normal(size=9)
    w = np.array([1, 3, 1, 2, 1, 1, 2, 1, 1], dtype=float)
    rows, pred, held, _ = out_of_fold(LinearRegression(), X, y, "systematic", rng, w)
    rep = np.repeat(np.arange(9), w.astype(int))
    _, want, _, _ = out_of_fold(LinearRegression(), X[rep], y[rep], "systematic", rng)
    np.testing.assert_allclose(np.bincount(rows, held), w)
    got = np.repeat(pred, held.astype(int))  # every copy's prediction, as a multiset
    np.testing.assert_allclose(np.sort(got), np.sort(want), rtol=1e-10)
    np.testing.assert_allclose(held @ (y[rows] - pred) ** 2, np.sum((y[rep] - want) ** 2),
                               rtol=1e-10)


def test_the_standard_error_is_the_folds_and_weights_count_as_rows_repeated():
    """fold_se: the folds' weighted mean differences, their standard deviation over sqrt(k);
    integer weights give what the rows repeated give (each copy in its fold)."""
    from fedlatent.models.sec.model import fold_se

    d = np.array([1.0, 3.0, 2.0, 6.0, 4.0, 5.0])
    folds = np.array([0, 0, 1, 1, 2, 2])
    means = np.array([2.0, 4.0, 4.5])
    assert fold_se(d, np.ones(6), folds) == pytest.approx(means.std(ddof=1) / np.sqrt(3),
                                                          rel=1e-12)
    w = np.array([1.0, 2.0, 1.0, 1.0, 3.0, 1.0])
    rep = np.repeat(np.arange(6), w.astype(int))
    assert fold_se(d, w, folds) == pytest.approx(fold_se(d[rep], np.ones(rep.size), folds[rep]),
                                                 rel=1e-12)
    assert fold_se(d[:2], np.ones(2), folds[:2]) == 0.0  # one fold: no spread to measure
