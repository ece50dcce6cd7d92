"""Clipping and sensitivities: adding (or replacing) one record, however large, moves a client's
clipped statistic by at most the stated sensitivity; the GMM and regression bounds are attained.

The statistics are the models' own functions (GMM, latent class regression, the logistic
learners' Newton sums); responsibilities are any function of the record itself at fixed public
parameters, as in an E-step."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import softmax

from fedlatent.engine.privacy import (
    REPLACE_ONE_FACTOR,
    center_from_sums,
    center_sensitivity,
    clip_rows,
    clip_targets,
    gaussian_mechanism,
    joint_sensitivity,
    logistic_sensitivity,
    regression_sensitivity,
)
from fedlatent.engine.protocol.numerics import add_intercept
from fedlatent.models.gmm.dp import gmm_sensitivity
from fedlatent.models.gmm.math import gmm_statistics
from fedlatent.models.lcr.math import lcr_statistics
from fedlatent.models.logistic import weighted_grad_hess

TRIALS, R, D, K = 150, 1.7, 3, 4
CENTER = np.array([5.0, -2.0, 0.5])
LO, HI = -3.0, 2.0
B = max(abs(LO), abs(HI))


def _huge_rows(rng, n):
    """Rows anywhere: random directions, magnitudes from 1e-3 to 1e6 around the centre."""
    u = rng.normal(size=(n, D))
    return CENTER + u * 10.0 ** rng.uniform(-3, 6, size=(n, 1))


def _resp(Xc, means, hard=False):
    """Responsibilities of each (clipped, centred) row alone, at fixed public means."""
    logits = -((Xc[:, None, :] - means[None]) ** 2).sum(-1)
    if hard:
        return np.eye(means.shape[0])[logits.argmax(1)]
    return softmax(logits, axis=1)


def _norm(a):
    return float(np.linalg.norm(np.ravel(a)))


def _block_norms(s1, s2):
    return {k: _norm(s1[k] - s2[k]) for k in s1}


# ---- clipping -----------------------------------------------------------------------------
def test_clip_rows_projects_onto_the_ball_and_keeps_inner_rows():
    rng = np.random.default_rng(0)
    X = _huge_rows(rng, 500)
    Xc = clip_rows(X, R, CENTER)
    dist = np.linalg.norm(Xc - CENTER, axis=1)
    assert dist.max() <= R * (1 + 1e-12)
    inside = np.linalg.norm(X - CENTER, axis=1) <= R
    assert inside.any() and np.array_equal(Xc[inside], X[inside])
    out = ~inside  # projected along the same direction from the centre, onto the sphere
    cos = np.einsum("ij,ij->i", Xc[out] - CENTER, X[out] - CENTER) / (
        dist[out] * np.linalg.norm(X[out] - CENTER, axis=1))
    assert np.allclose(dist[out], R) and np.allclose(cos, 1.0)
    assert np.array_equal(clip_rows(CENTER[None], R, CENTER), CENTER[None])  # zero distance


@pytest.mark.parametrize("call, exc, message", [
    (lambda: clip_rows(np.ones((2, 3)), 0.0), ValueError, r"radius must be a positive finite"),
    (lambda: clip_rows(np.ones(3), 1.0), ValueError, r"X must be 2-D .* got shape \(3,\)"),
    (lambda: clip_rows(np.ones((2, 3)), 1.0, np.ones(2)), ValueError,
     r"center must have shape \(3,\), got \(2,\)"),
    (lambda: clip_rows(np.array([[np.nan, 0, 0]]), 1.0), ValueError, r"must be finite before"),
    (lambda: clip_targets([1.0], 2.0, 1.0), ValueError, r"finite with lo < hi, got \(2.0, 1.0\)"),
    (lambda: clip_targets([np.inf], 0.0, 1.0), ValueError, r"y must be finite before clipping"),
])
def test_clipping_arguments_are_checked(call, exc, message):
    with pytest.raises(exc, match=message):
        call()


def test_clip_targets():
    assert clip_targets([-10.0, 0.5, 1e9], LO, HI).tolist() == [LO, 0.5, HI]


# ---- a privately estimated centre --------------------------------------------------------
def test_centre_sums_move_by_at_most_the_sensitivity_and_the_noisy_centre_is_close():
    rng = np.random.default_rng(6)
    R0, origin = 50.0, np.zeros(D)  # a loose public ball
    bound = center_sensitivity(R0)

    def sums(X):
        Xc = clip_rows(X, R0, origin)
        return {"n": np.array([float(len(Xc))]), "sx": (Xc - origin).sum(0)}

    X = CENTER + rng.normal(size=(20_000, D))
    base = sums(X)
    for x in _huge_rows(rng, TRIALS):
        moved = _block_norms(sums(np.vstack([X, x])), base)
        assert all(moved[k] <= bound[k] * (1 + 1e-9) for k in bound)
    noisy = gaussian_mechanism(base, sensitivity=joint_sensitivity(bound), noise_multiplier=5.0,
                               rng=np.random.default_rng(0))
    c = center_from_sums(noisy["n"][0], noisy["sx"], origin)
    # noise sd on each coordinate of the mean: 5 * sqrt(1 + 50^2) / 20000 ~ 0.0125
    assert np.abs(c - CENTER).max() < 0.1
    assert np.array_equal(center_from_sums(-3.0, np.ones(D), origin), np.ones(D))  # floored


# ---- GMM -----------------------------------------------------------------------------------
@pytest.mark.parametrize("cov", ["full", "tied", "diag", "spherical"])
def test_gmm_statistics_move_by_at_most_the_sensitivity(cov):
    rng = np.random.default_rng(1)
    means = rng.normal(size=(K, D))
    bound = gmm_sensitivity(R)
    joint = joint_sensitivity(bound)
    X = clip_rows(_huge_rows(rng, 30), R, CENTER)
    base = gmm_statistics(X, _resp(X - CENTER, means), CENTER, cov)
    worst = 0.0
    for x in _huge_rows(rng, TRIALS):
        X1 = np.vstack([X, clip_rows(x[None], R, CENTER)])  # add one record
        moved = _block_norms(gmm_statistics(X1, _resp(X1 - CENTER, means), CENTER, cov), base)
        assert all(moved[k] <= bound[k] * (1 + 1e-9) for k in bound)
        worst = max(worst, math.sqrt(sum(v * v for v in moved.values())) / joint)
        Xr = X.copy()  # replace record 0 instead
        Xr[0] = clip_rows(x[None], R, CENTER)[0]
        moved_r = _block_norms(gmm_statistics(Xr, _resp(Xr - CENTER, means), CENTER, cov), base)
        assert math.sqrt(sum(v * v for v in moved_r.values())) <= REPLACE_ONE_FACTOR * joint * (
            1 + 1e-9)
    assert worst <= 1 + 1e-9


def test_gmm_joint_bound_is_attained_by_a_hard_assignment_on_the_sphere():
    rng = np.random.default_rng(2)
    means = rng.normal(size=(K, D))
    X = clip_rows(_huge_rows(rng, 10), R, CENTER)
    x = clip_rows(CENTER[None] + 1e6, R, CENTER)
    X1 = np.vstack([X, x])
    s0 = gmm_statistics(X, _resp(X - CENTER, means, hard=True), CENTER, "full")
    s1 = gmm_statistics(X1, _resp(X1 - CENTER, means, hard=True), CENTER, "full")
    moved = math.sqrt(sum(v * v for v in _block_norms(s1, s0).values()))
    assert moved == pytest.approx(math.sqrt(1 + R**2 + R**4), rel=1e-12)
    assert joint_sensitivity(gmm_sensitivity(R)) == pytest.approx(moved, rel=1e-12)


# ---- regression blocks (LatentClassRegression; HLCR per entity) ------------------------------
LCR_KEYS = {"n": "nk", "xx": "sxx", "xy": "sxy", "yy": "syy"}


def _lcr(X, y, means):
    Xc = clip_rows(X, R, CENTER) - CENTER
    return lcr_statistics(add_intercept(Xc), clip_targets(y, LO, HI), _resp(Xc, means))


def test_regression_statistics_move_by_at_most_the_sensitivity():
    rng = np.random.default_rng(3)
    means = rng.normal(size=(K, D))
    bound = {LCR_KEYS[k]: v for k, v in regression_sensitivity(R, B).items()}
    X, y = _huge_rows(rng, 25), rng.normal(size=25) * 1e4
    base = _lcr(X, y, means)
    for x, t in zip(_huge_rows(rng, TRIALS), rng.normal(size=TRIALS) * 10.0 ** rng.uniform(
            -2, 7, size=TRIALS)):
        moved = _block_norms(_lcr(np.vstack([X, x]), np.append(y, t), means), base)
        assert all(moved[k] <= bound[k] * (1 + 1e-9) for k in bound)
    # attained: hard assignment, x on the sphere, |y| = B
    x = CENTER + np.array([1e5, 0, 0])
    Xc = clip_rows(np.vstack([X, x]), R, CENTER) - CENTER
    r = _resp(Xc, means, hard=True)
    yy = clip_targets(np.append(y, -1e9), LO, HI)
    s1 = lcr_statistics(add_intercept(Xc), yy, r)
    s0 = lcr_statistics(add_intercept(Xc[:-1]), yy[:-1], r[:-1])
    moved = math.sqrt(sum(v * v for v in _block_norms(s1, s0).values()))
    assert moved == pytest.approx(joint_sensitivity(bound), rel=1e-12)


def test_hlcr_entity_blocks_move_by_at_most_records_per_unit_times_the_bound():
    rng = np.random.default_rng(4)
    M = 6  # at most M events per entity; the entity (its label drawn from all its events)
    bound = regression_sensitivity(R, B, records_per_unit=M)

    def blocks(entities):
        out = {"xx": np.zeros((K, D + 1, D + 1)), "xy": np.zeros((K, D + 1)),
               "yy": np.zeros(K), "n": np.zeros(K)}
        for X, y in entities:
            Xt = add_intercept(clip_rows(X, R, CENTER) - CENTER)
            yc = clip_targets(y, LO, HI)
            k = int(abs(Xt.sum() + yc.sum()) * 1e3) % K  # any label the entity's data decide
            out["xx"][k] += Xt.T @ Xt
            out["xy"][k] += Xt.T @ yc
            out["yy"][k] += yc @ yc
            out["n"][k] += len(yc)
        return out

    def entity():
        m = int(rng.integers(1, M + 1))
        return _huge_rows(rng, m), rng.normal(size=m) * 10.0 ** rng.uniform(-2, 7)

    agent = [entity() for _ in range(8)]
    base = blocks(agent)
    for _ in range(60):
        moved = _block_norms(blocks([*agent, entity()]), base)
        assert all(moved[k] <= bound[k] * (1 + 1e-9) for k in bound)
    assert bound["n"] == M and bound["yy"] == pytest.approx(M * B * B)


# ---- logistic Newton sums (FedGMM learners) -------------------------------------------------
@pytest.mark.parametrize("n_classes", [2, 4])
def test_logistic_newton_sums_move_by_at_most_the_sensitivity(n_classes):
    rng = np.random.default_rng(5)
    coef = rng.normal(size=(n_classes - 1, D + 1)) * 3.0  # public broadcast coefficients
    bound = logistic_sensitivity(R, n_classes, coef_norm=float(np.linalg.norm(coef)))

    def sums(X, y):
        Xa = add_intercept(clip_rows(X, R, CENTER) - CENTER)
        w = 1.0 / (1.0 + np.exp(-Xa[:, 0]))  # a responsibility in [0, 1] from the record
        g, H = weighted_grad_hess(Xa, y, w, coef)
        return {"grad": g, "hess": H, "b": H @ coef.ravel() - g}

    X, y = _huge_rows(rng, 20), rng.integers(0, n_classes, size=20)
    base = sums(X, y)
    worst = dict.fromkeys(bound, 0.0)
    for x, t in zip(_huge_rows(rng, TRIALS), rng.integers(0, n_classes, size=TRIALS)):
        moved = _block_norms(sums(np.vstack([X, x]), np.append(y, t)), base)
        for k in bound:
            assert moved[k] <= bound[k] * (1 + 1e-9)
            worst[k] = max(worst[k], moved[k] / bound[k])
    assert worst["grad"] > 0.5  # the gradient bound is not vacuous


def test_logistic_bounds_are_attained_for_three_classes():
    x = add_intercept(np.array([[R, 0.0, 0.0]]))  # a clipped, centred row on the sphere
    a2 = R * R + 1
    bound = logistic_sensitivity(R, 3)
    # p = (0, 1/2, 1/2): the Hessian term has Frobenius norm 1/2 * a^2
    _, H = weighted_grad_hess(x, np.array([1]), np.ones(1), np.array([[0, 0, 0, 40.0]] * 2))
    assert _norm(H) == pytest.approx(bound["hess"], rel=1e-9) and bound["hess"] == 0.5 * a2
    # y = 1 while p puts its mass on class 2: the gradient term has norm sqrt(2) a
    g, _ = weighted_grad_hess(x, np.array([1]), np.ones(1),
                              np.array([[0, 0, 0, -40.0], [0, 0, 0, 40.0]]))
    assert _norm(g) == pytest.approx(bound["grad"], rel=1e-9)


@pytest.mark.parametrize("call, message", [
    (lambda: gmm_sensitivity(0.0), r"radius must be a positive finite number, got 0.0"),
    (lambda: center_sensitivity(-1.0), r"radius must be a positive finite number, got -1.0"),
    (lambda: regression_sensitivity(1.0, -1.0), r"target_bound must be a positive finite"),
    (lambda: regression_sensitivity(1.0, 1.0, records_per_unit=0),
     r"records_per_unit must be a positive integer, got 0"),
    (lambda: logistic_sensitivity(1.0, 1), r"n_classes must be an integer >= 2, got 1"),
    (lambda: logistic_sensitivity(1.0, 3, coef_norm=-1.0), r"coef_norm must be finite and >= 0"),
])
def test_sensitivity_arguments_are_checked(call, message):
    with pytest.raises(ValueError, match=message):
        call()
