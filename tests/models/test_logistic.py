import numpy as np
import pytest
from scipy.optimize import minimize

from fedlatent.models.logistic import (
    add_intercept,
    irls_statistics,
    local_refit,
    logistic_log_proba,
    newton_solve,
    weighted_grad_hess,
    weighted_loglik,
)


def _data(K, n=80, d=3, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = rng.integers(0, K, size=n)
    w = rng.uniform(0.1, 1.0, size=n)
    coef = 0.5 * rng.normal(size=(K - 1, d + 1))
    return add_intercept(X), y, w, coef


@pytest.mark.parametrize("K", [2, 4])
def test_gradient_and_hessian_match_finite_differences(K):
    Xa, y, w, coef = _data(K)
    g, H = weighted_grad_hess(Xa, y, w, coef)
    f = lambda t: -weighted_loglik(Xa, y, w, t.reshape(coef.shape))
    eps = 1e-6
    num_g = np.array([(f(coef.ravel() + eps * e) - f(coef.ravel() - eps * e)) / (2 * eps)
                      for e in np.eye(coef.size)])
    np.testing.assert_allclose(g, num_g, rtol=1e-6, atol=1e-7)
    gfun = lambda t: weighted_grad_hess(Xa, y, w, t.reshape(coef.shape))[0]
    num_H = np.array([(gfun(coef.ravel() + eps * e) - gfun(coef.ravel() - eps * e)) / (2 * eps)
                      for e in np.eye(coef.size)])
    np.testing.assert_allclose(H, num_H, rtol=1e-5, atol=1e-6)
    assert np.linalg.eigvalsh(H).min() > -1e-10


def test_probabilities_normalize_and_binary_is_sigmoid():
    Xa, y, w, coef = _data(2)
    lp = logistic_log_proba(Xa, coef)
    np.testing.assert_allclose(np.exp(lp).sum(1), 1.0)
    np.testing.assert_allclose(np.exp(lp[:, 1]), 1 / (1 + np.exp(-(Xa @ coef[0]))))


def test_statistics_are_additive_over_samples():
    Xa, y, w, coef = _data(3, n=60)
    b, H = irls_statistics(Xa, y, w, coef)
    b1, H1 = irls_statistics(Xa[:25], y[:25], w[:25], coef)
    b2, H2 = irls_statistics(Xa[25:], y[25:], w[25:], coef)
    np.testing.assert_allclose(b, b1 + b2, rtol=1e-12)
    np.testing.assert_allclose(H, H1 + H2, rtol=1e-12)


@pytest.mark.parametrize("K", [2, 3])
def test_iterated_newton_reaches_the_regularized_optimum(K):
    Xa, y, w, coef0 = _data(K, n=120)
    lam = 0.5
    coef = coef0.copy()
    for _ in range(25):
        b, H = irls_statistics(Xa, y, w, coef)
        coef = newton_solve(b, H, lam, coef.shape)
    obj = lambda t: -weighted_loglik(Xa, y, w, t.reshape(coef.shape)) + 0.5 * lam * t @ t
    jac = lambda t: weighted_grad_hess(Xa, y, w, t.reshape(coef.shape))[0] + lam * t
    ref = minimize(obj, coef0.ravel(), jac=jac, method="BFGS", options={"gtol": 1e-10}).x
    np.testing.assert_allclose(coef.ravel(), ref, atol=1e-6)
    # local_refit with the same penalty converges to the same point
    np.testing.assert_allclose(local_refit(Xa, y, w, coef0, lam, 25), coef, atol=1e-9)


def test_proximal_term_pulls_towards_the_start():
    Xa, y, w, coef0 = _data(2)
    free = local_refit(Xa, y, w, coef0, 0.1, 20)
    prox = local_refit(Xa, y, w, coef0, 0.1, 20, prox=100.0)
    assert np.linalg.norm(prox - coef0) < 0.2 * np.linalg.norm(free - coef0)
