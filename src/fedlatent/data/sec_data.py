"""Data of the SEC paper: Simulations 1 and 2, the fairness example and the attack example.

Learners are clients named ``l00``, ``l01``, ... (zero-padded, so the sorted client order is the
learner order).

References
----------
Ye, Ghanadan and Ding, "Meta Clustering for Collaborative Learning" (2023): Section 4 (fairness),
Section 5.1 (Simulation 1), Section 5.2 (Simulation 2), Section 6.2 (attack example).
"""

from __future__ import annotations

import numpy as np

from .dataset import FederatedDataset

__all__ = [
    "learner_ids",
    "make_sec_simulation1",
    "make_sec_simulation2",
    "make_sec_fairness",
    "make_sec_attack",
    "sec_friedman_f1",
    "sec_friedman_f2",
]


def learner_ids(n: int) -> list[str]:
    """``["l00", "l01", ...]``, zero-padded to sort in learner order."""
    w = max(2, len(str(n - 1)))
    return [f"l{i:0{w}d}" for i in range(n)]


def make_sec_simulation1(
    n_learners: int = 20,
    n_samples: int = 50,
    n_features: int = 5,
    snr: float = 16.0,
    random_state=None,
) -> tuple[FederatedDataset, np.ndarray]:
    """Simulation 1: two linear clusters, ``Y = beta_k^T X + eps``.

    The first half of the learners use ``beta_1``, the rest ``beta_2``, both drawn from
    N(0, I_p) once per call; ``X ~ N(0, I_p)``, ``eps ~ N(0, sigma^2)`` with
    ``sigma^2 = p^2 / SNR`` (the paper's definition, Section 5.1).

    Parameters
    ----------
    n_learners, n_samples, n_features : int
    snr : float
    random_state : int, Generator or None

    Returns
    -------
    fd : FederatedDataset
    labels : ndarray of shape (n_learners,)
        True cluster (0 or 1) of each learner, in client order.
    """
    rng = np.random.default_rng(random_state)
    p = int(n_features)
    beta = rng.standard_normal((2, p))
    sigma = np.sqrt(p**2 / float(snr))
    ids = learner_ids(n_learners)
    labels = (np.arange(n_learners) >= n_learners // 2).astype(int)
    X = rng.standard_normal((n_learners, n_samples, p))
    noise = sigma * rng.standard_normal((n_learners, n_samples))
    y = np.einsum("lnp,lp->ln", X, beta[labels]) + noise
    fd = FederatedDataset.from_arrays({c: (X[i], y[i]) for i, c in enumerate(ids)})
    return fd, labels


def _friedman_inputs(rng, n: int, p: int) -> np.ndarray:
    X = np.empty((n, p))
    X[:, 0] = rng.uniform(0, 100, n)
    X[:, 1] = rng.uniform(40 * np.pi, 560 * np.pi, n)
    X[:, 2] = rng.uniform(0, 1, n)
    X[:, 3] = rng.uniform(1, 11, n)
    if p > 4:
        X[:, 4:] = rng.standard_normal((n, p - 4))
    return X


def sec_friedman_f1(X: np.ndarray) -> np.ndarray:
    """``sqrt(X1^2 + (X2 X3 - 1/(X2 X4))^2)`` (Friedman #2)."""
    return np.sqrt(X[:, 0] ** 2 + (X[:, 1] * X[:, 2] - 1.0 / (X[:, 1] * X[:, 3])) ** 2)


def sec_friedman_f2(X: np.ndarray) -> np.ndarray:
    """``arctan((X2 X3 - 1/(X2 X4)) / X1)`` (Friedman #3)."""
    return np.arctan((X[:, 1] * X[:, 2] - 1.0 / (X[:, 1] * X[:, 3])) / X[:, 0])


def make_sec_simulation2(
    n_learners: int = 20,
    n_samples: int = 100,
    n_features: int = 500,
    n_test: int = 100,
    noise_sd: float = 0.1,
    random_state=None,
) -> tuple[FederatedDataset, np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """Simulation 2: Friedman-style functions f1 (first half of learners) and f2 (the rest).

    ``X1 ~ U(0, 100)``, ``X2 ~ U(40 pi, 560 pi)``, ``X3 ~ U(0, 1)``, ``X4 ~ U(1, 11)``, the other
    ``p - 4`` predictors N(0, 1); noise N(0, 0.01) (sd 0.1).

    Returns
    -------
    fd : FederatedDataset
    labels : ndarray of shape (n_learners,)
    test : (X_test, y_test)
        ``n_test`` points from f1 (the first learner's function), for the prediction comparison.
    """
    rng = np.random.default_rng(random_state)
    p = int(n_features)
    if p < 4:
        raise ValueError(f"Simulation 2 needs at least 4 features, got {p}")
    ids = learner_ids(n_learners)
    labels = (np.arange(n_learners) >= n_learners // 2).astype(int)
    data = {}
    for i, c in enumerate(ids):
        X = _friedman_inputs(rng, n_samples, p)
        f = sec_friedman_f1(X) if labels[i] == 0 else sec_friedman_f2(X)
        data[c] = (X, f + noise_sd * rng.standard_normal(n_samples))
    Xt = _friedman_inputs(rng, n_test, p)
    yt = sec_friedman_f1(Xt) + noise_sd * rng.standard_normal(n_test)
    return FederatedDataset.from_arrays(data), labels, (Xt, yt)


def make_sec_fairness(
    b: float,
    n_learners: int = 50,
    n_samples: int = 50,
    random_state=None,
) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], np.ndarray]:
    """Fairness example (Section 4): ``Y = X1 + 2 X2 - 2 X3 + 2 X4 + b R_i + eps``.

    ``X ~ N(0, I_4)``, ``eps ~ N(0, 1)``, and the sensitive variable ``R_i ~ N(0, 1)`` is fixed
    per learner (a subject-level attribute) and is not among the features.

    Returns
    -------
    data : dict learner id -> (X of shape (n_samples, 4), y of shape (n_samples,))
    R : ndarray of shape (n_learners,)
        The sensitive value of each learner (for the Oracle only).
    """
    rng = np.random.default_rng(random_state)
    beta = np.array([1.0, 2.0, -2.0, 2.0])
    R = rng.standard_normal(n_learners)
    data = {}
    for i, c in enumerate(learner_ids(n_learners)):
        X = rng.standard_normal((n_samples, 4))
        data[c] = (X, X @ beta + b * R[i] + rng.standard_normal(n_samples))
    return data, R


def make_sec_attack(
    n_attacked: int,
    n_learners: int = 50,
    n_samples: int = 160,
    test_fraction: float = 0.25,
    random_state=None,
) -> tuple[FederatedDataset, np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """Attack example (Section 6.2) on scikit-learn's diabetes data (``load_diabetes``).

    The paper's electrical-grid-stability data cannot be downloaded here; the diabetes data
    (442 patients, 10 standardized baseline variables, disease progression after one year as
    the response) ship with scikit-learn. A random ``test_fraction`` of the rows is held out;
    each of the ``n_learners`` learners draws ``n_samples`` distinct rows from the remaining
    ones (the data set is small, so different learners share rows). The first ``n_attacked``
    learners have their response replaced by its negative.

    Returns
    -------
    fd : FederatedDataset
    attacked : ndarray of bool, shape (n_learners,)
    test : (X_test, y_test)
    """
    from sklearn.datasets import load_diabetes

    if not 0 <= n_attacked <= n_learners:
        raise ValueError(f"n_attacked must be in [0, {n_learners}], got {n_attacked}")
    rng = np.random.default_rng(random_state)
    X, y = load_diabetes(return_X_y=True)
    perm = rng.permutation(X.shape[0])
    n_test = int(round(test_fraction * X.shape[0]))
    te, tr = perm[:n_test], perm[n_test:]
    m = min(int(n_samples), tr.size)
    attacked = np.arange(n_learners) < n_attacked
    data = {}
    for i, c in enumerate(learner_ids(n_learners)):
        rows = rng.choice(tr, size=m, replace=False)
        data[c] = (X[rows], -y[rows] if attacked[i] else y[rows])
    fd = FederatedDataset.from_arrays(data)
    return fd, attacked, (X[te], y[te])
