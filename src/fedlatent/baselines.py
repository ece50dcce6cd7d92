"""Baselines for FedGMM on the same engine, learner class and data splits (``fl.baselines``).

- :class:`Local`: each client fits its own learner alone (nothing is sent).
- :class:`FedAvg`: one global learner (FedGMM with ``M1 = M2 = 1``), by federated Newton steps
  or by local refits averaged with sample weights (rule "average").
- :class:`FedProx`: FedAvg with the proximal term ``mu/2 ||theta - theta_global||^2`` locally.
- :class:`MixtureOfLearners`: Marfoq et al.'s FedEM, FedGMM with ``M1 = 1`` (client weights over
  the learners only; the input distribution is not modelled).
- :class:`Centralized`: one learner fitted on the pooled data (a reference, not federated).

All expose ``fit(fd)``, ``predict(X, client=None)``, ``predict_proba(X, client=None)``.

References
----------
McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized Data",
AISTATS 2017 (FedAvg); Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020
(FedProx); Marfoq et al., NeurIPS 2021 (FedEM); Wu et al., ICML 2023, section 4.2.
"""

from __future__ import annotations

import numpy as np

from .data.dataset import FederatedDataset
from .engine.protocol.numerics import add_intercept
from .models.fedgmm import FedGMM
from .models.logistic import local_refit, logistic_log_proba

__all__ = [
    "Local",
    "FedAvg",
    "FedProx",
    "MixtureOfLearners",
    "Centralized",
    "client_accuracy",
]


def _labels(fd: FederatedDataset, classes=None) -> np.ndarray:
    if not fd.has_target:
        raise ValueError("baselines are supervised: the federated dataset has no target y")
    if classes is not None:
        return np.unique(np.asarray(classes))
    return np.unique(np.concatenate([cd.y for _, cd in fd.items()]))


def _fit_logistic(X, y, classes, l2, max_iter, tol=1e-8):
    Xa = add_intercept(X)
    yc = np.searchsorted(classes, y)
    coef = np.zeros((len(classes) - 1, Xa.shape[1]))
    w = np.ones(X.shape[0])
    for _ in range(max_iter):
        new = local_refit(Xa, yc, w, coef, l2 * X.shape[0], 1)
        done = np.max(np.abs(new - coef)) < tol
        coef = new
        if done:
            break
    return coef


class _Logistic:
    """Settings shared by the logistic baselines.

    Parameters
    ----------
    l2 : float
        Ridge on the mean cross-entropy (same scale as :class:`FedGMM`'s ``l2``).
    max_iter : int
        Newton iterations at most.
    classes : array-like or None
        Labels; None: those seen in training.
    """

    def __init__(self, l2: float = 1e-3, max_iter: int = 50, classes=None):
        self.l2 = l2
        self.max_iter = max_iter
        self.classes = classes

    def predict(self, X, client=None) -> np.ndarray:
        return self.classes_[self.predict_proba(X, client).argmax(axis=1)]


class Local(_Logistic):
    """Each client fits a regularized logistic regression on its own data only
    (parameters of :class:`_Logistic`).

    A client whose labels are all one class has nothing to discriminate: its model predicts
    that class with probability 1 (``coef_[client]`` is None and ``only_class_[client]`` the
    class).
    """

    def fit(self, fd: FederatedDataset):
        self.classes_ = _labels(fd, self.classes)
        self.coef_, self.only_class_ = {}, {}
        for cid, cd in fd.items():
            u = np.unique(cd.y)
            if u.size == 1:
                self.coef_[cid], self.only_class_[cid] = None, u[0]
            else:
                self.coef_[cid] = _fit_logistic(cd.X, cd.y, self.classes_, self.l2,
                                                self.max_iter)
        return self

    def predict_proba(self, X, client=None) -> np.ndarray:
        if client is None or str(client) not in self.coef_:
            raise KeyError(f"Local has a model per client; unknown client {client!r}")
        X = np.asarray(X, dtype=np.float64)
        if str(client) in self.only_class_:
            proba = np.zeros((X.shape[0], len(self.classes_)))
            proba[:, np.searchsorted(self.classes_, self.only_class_[str(client)])] = 1.0
            return proba
        return np.exp(logistic_log_proba(add_intercept(X), self.coef_[str(client)]))


class Centralized(_Logistic):
    """One logistic regression on the pooled data (reference only: the data are moved)."""

    def fit(self, fd: FederatedDataset):
        self.classes_ = _labels(fd, self.classes)
        pooled = fd.pooled()
        self.coef_ = _fit_logistic(pooled.X, pooled.y, self.classes_, self.l2, self.max_iter)
        return self

    def predict_proba(self, X, client=None) -> np.ndarray:
        Xa = add_intercept(np.asarray(X, dtype=np.float64))
        return np.exp(logistic_log_proba(Xa, self.coef_))


class _Global(FedGMM):
    """A FedGMM whose prediction ignores the client (one global learner)."""

    def predict_proba(self, X, client=None) -> np.ndarray:
        return super().predict_proba(X, None)

    def predict(self, X, client=None) -> np.ndarray:
        return super().predict(X, None)


class FedAvg(_Global):
    """One global learner for every client.

    ``learner_update="newton"`` (default) fits it by exact federated Newton steps (the global
    optimum FedAvg aims at, without client drift); ``"average"`` is McMahan et al.'s rule:
    ``local_steps`` local Newton steps from the broadcast parameters, then a sample-weighted
    average (under label skew the local steps drift; see :class:`FedProx`).

    Parameters
    ----------
    l2, learner_update, local_steps, max_rounds, tol, federation, random_state, verbose, classes
        As in :class:`FedGMM`.
    """

    def __init__(self, *, l2: float = 1e-3, learner_update: str = "newton", local_steps: int = 1,
                 classes=None, federation=None, max_rounds: int = 100, tol: float = 1e-4,
                 random_state=None, verbose: bool | None = None):
        super().__init__(1, 1, learner_update=learner_update, local_steps=local_steps, l2=l2,
                         classes=classes, federation=federation, max_rounds=max_rounds, tol=tol,
                         random_state=random_state, verbose=verbose, learner_init_scale=0.0,
                         covariance_type="diag")


class FedProx(_Global):
    """FedProx: FedAvg whose local objective adds ``mu/2 ||theta - theta_global||^2``.

    ``mu`` is on the scale of the mean cross-entropy (like ``l2``).
    """

    def __init__(self, *, mu: float = 1.0, l2: float = 1e-3, local_steps: int = 1, classes=None,
                 federation=None, max_rounds: int = 100, tol: float = 1e-4, random_state=None,
                 verbose: bool | None = None):
        super().__init__(1, 1, learner_update="average", local_steps=local_steps, l2=l2,
                         prox=mu, classes=classes, federation=federation, max_rounds=max_rounds,
                         tol=tol, random_state=random_state, verbose=verbose,
                         learner_init_scale=0.0, covariance_type="diag")
        self.mu = mu


class MixtureOfLearners(FedGMM):
    """Marfoq et al.'s FedEM: ``M2`` shared learners, client weights ``pi_c(m2)``; FedGMM with
    one input component (the input distribution plays no role in the responsibilities)."""

    def __init__(self, n_learners: int = 3, *, l2: float = 1e-3,
                 learner_update: str = "newton", local_steps: int = 1, classes=None,
                 federation=None, max_rounds: int = 100, tol: float = 1e-4, random_state=None,
                 verbose: bool | None = None):
        super().__init__(1, n_learners, learner_update=learner_update, local_steps=local_steps,
                         l2=l2, classes=classes, federation=federation, max_rounds=max_rounds,
                         tol=tol, random_state=random_state, verbose=verbose,
                         covariance_type="diag")


def client_accuracy(model, fd: FederatedDataset) -> np.ndarray:
    """Test accuracy of each client (its personalized prediction), in client order."""
    return np.array([np.mean(model.predict(cd.X, client=cid) == cd.y) for cid, cd in fd.items()])
