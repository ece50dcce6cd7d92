"""benchmarks/accel_variants.py: the centralized prototype behind issue 23's note on rounds to
tolerance (its round counting is scikit-learn's, and its multi-point subspace Newton reaches a
third of scikit-learn's iterations on a monotone path)."""

from __future__ import annotations

import numpy as np
from sklearn.mixture import GaussianMixture

from benchmark_scripts import load_benchmark

av = load_benchmark("accel_variants")


def gmm_same_start(seed):
    X, _, start = av.gmm_data(seed)
    params0 = (start["weights_init"], start["means_init"],
               np.linalg.inv(start["precisions_init"]))
    sk = GaussianMixture(4, tol=1e-6, max_iter=10_000, **start).fit(X)
    return av.GMMMap(X, 4), params0, sk, X


def test_plain_rounds_are_scikit_learns_iterations():
    em, params0, sk, _ = gmm_same_start(3)
    fed, _ = av.run_plain(em, params0, 1e-6)
    assert (fed.rounds, fed.max_points) == (sk.n_iter_, 1) == (29, 1)


def test_secant_newton_takes_a_third_of_the_iterations_on_a_monotone_path():
    """Three points a round (the 7-point variant with finite differences is the benchmark's
    only: it takes 3 times as long)."""
    em, params0, sk, X = gmm_same_start(0)
    fed, s = av.run_subspace_newton(em, params0, 1e-6, secant=True, over=(3.0,))
    assert sk.n_iter_ == 89
    assert fed.rounds <= sk.n_iter_ / 3 and fed.max_points == 3
    assert np.all(np.diff(fed.path) >= -1e-13)  # the accepted path never falls (rounding aside)
    assert abs(fed.plain_change) < 1e-6  # stopped by scikit-learn's rule
    assert em.estep(em.params(s))[1] >= sk.score(X) - 1e-7
