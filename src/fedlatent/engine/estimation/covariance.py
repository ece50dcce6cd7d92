"""The parameters' covariance from a client's and the federation's information sums.

One exchange (:data:`~fedlatent.engine.estimation.inference.INFORMATION_QUERY`) brings, summed
over the clients (each a sum over the client's records, so secure aggregation can add them):

- ``information``: Louis' observed information, ``-d2 log L`` (Louis 1982);
- ``opg``: the empirical information, ``sum_i s_i s_i^T`` (``s_i`` a record's score);
- ``site_meat``: ``sum_c S_c S_c^T``, ``S_c`` a client's summed score (clusters = sites);
- ``entity_meat``: ``sum_e S_e S_e^T`` over the entities of every client (clusters = the
  entities of :class:`~fedlatent.data.FederatedDataset`'s entity level, nested in sites);
- the counts of rows, sites and entities behind them.

From them, the covariances a statistician asks for (``cov_type``):

``"observed"``
    ``I^-1``, the inverse observed information.
``"empirical"``
    ``(sum_i s_i s_i^T)^-1``, the inverse empirical information (outer product of the scores).
``"robust"``
    the sandwich ``I^-1 (sum_i s_i s_i^T) I^-1`` (Huber-White, rows independent).
``"cluster"``
    the sandwich with the clusters' summed scores, ``I^-1 (sum_g S_g S_g^T) I^-1``, times
    statsmodels' small-sample factor ``G / (G - 1) * (N - 1) / (N - k)`` (``G`` clusters, ``N``
    rows, ``k`` the parameters without the noise variances, as statsmodels' ``k_params`` of a
    linear model does not count its scale); ``groups="site"`` or ``"entity"``.
``None`` (the default)
    ``"observed"`` where the observed information is positive definite (an interior maximum),
    else ``"empirical"`` with the reason stated.

A matrix that is singular (a degenerate or unidentified direction, e.g. a component without
rows) is inverted on its range (Moore-Penrose); the reported parameters that move along the
null space get a NaN standard error and are named.

References
----------
Louis, "Finding the observed information matrix when using the EM algorithm", JRSS B 44 (1982).
White, "Maximum likelihood estimation of misspecified models", Econometrica 50 (1982).
Cameron and Miller, "A practitioner's guide to cluster-robust inference", J. Human Resources 50
(2015), section II.C (the small-sample factor).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["COV_TYPES", "GROUPS", "CovarianceChoice", "InformationSums", "InformationTotals",
           "choose_covariance", "inverse_on_range"]

#: the ``cov_type`` values of ``cov_params``, ``conf_int`` and ``summary``
COV_TYPES = ("observed", "empirical", "robust", "cluster")
#: the clusters of ``cov_type="cluster"``
GROUPS = ("site", "entity")
#: an eigenvalue at most this fraction of the largest is a null direction
NULL_RTOL = 1e-10


class InformationSums:
    """A client's sums for the information query, accumulated over blocks of its rows.

    Parameters
    ----------
    P : int
        Free parameters.
    entity : ndarray (n,) or None
        Each row's entity (None: the client has no entity level).
    """

    def __init__(self, P: int, entity=None):
        self.info = np.zeros((P, P))
        self.opg = np.zeros((P, P))
        self.score = np.zeros(P)
        self.loglik = 0.0
        self.codes = None
        if entity is not None and len(entity):
            _, self.codes = np.unique(np.asarray(entity).astype(str), return_inverse=True)
            self.groups = np.zeros((int(self.codes.max()) + 1, P))
        else:
            self.groups = np.zeros((0, P))

    def add(self, info: np.ndarray, scores: np.ndarray, loglik: float,
            weight: np.ndarray | None = None, rows: slice = slice(None)) -> None:
        """Add a block: its Louis information (P, P), its rows' scores (n, P), their summed
        log-likelihood, their frequency weights (a row of weight w counts w times) and where
        the block sits among the client's rows (for the entities)."""
        ws = scores if weight is None else scores * weight[:, None]
        self.info += info
        self.opg += ws.T @ scores
        self.score += ws.sum(axis=0)
        self.loglik += float(loglik)
        if self.codes is not None:
            np.add.at(self.groups, self.codes[rows], ws)

    def reply(self, n: float) -> dict[str, object]:
        """The query's reply (every matrix symmetric)."""
        return {"n": n, "loglik": self.loglik, "information": 0.5 * (self.info + self.info.T),
                "opg": 0.5 * (self.opg + self.opg.T),
                "site_meat": np.outer(self.score, self.score),
                "entity_meat": self.groups.T @ self.groups,
                "n_sites": 1.0 if n > 0 else 0.0, "n_entities": float(len(self.groups))}


#: the reply's fields and their shapes (P the free parameters)
def reply_shapes(P: int) -> dict[str, tuple]:
    return {"n": (), "loglik": (), "information": (P, P), "opg": (P, P), "site_meat": (P, P),
            "entity_meat": (P, P), "n_sites": (), "n_entities": ()}


@dataclass
class InformationTotals:
    """The information sums over every client (see the module docstring)."""

    information: np.ndarray
    opg: np.ndarray | None  # None: the model's clients send the observed information alone
    site_meat: np.ndarray | None
    entity_meat: np.ndarray | None
    n: float
    loglik: float
    n_sites: int
    n_entities: int


@dataclass
class CovarianceChoice:
    """A covariance of the reported parameters and what it is, for ``summary()``."""

    cov: np.ndarray
    kind: str
    note: str = ""
    unidentified: list[str] = field(default_factory=list)


def inverse_on_range(M: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The inverse of a symmetric positive semi-definite ``M`` on its range (Moore-Penrose)
    and the null space's basis (P, m) (eigenvalues at most :data:`NULL_RTOL` of the largest;
    m = 0 for a positive-definite ``M``)."""
    w, V = np.linalg.eigh(0.5 * (M + M.T))
    keep = w > NULL_RTOL * max(float(w.max()), 0.0)
    inv = (V[:, keep] / w[keep]) @ V[:, keep].T
    return 0.5 * (inv + inv.T), V[:, ~keep]


def _min_eig(M: np.ndarray) -> float:
    return float(np.linalg.eigvalsh(0.5 * (M + M.T))[0])


def is_positive_definite(M: np.ndarray) -> bool:
    """Whether ``M`` is positive definite beyond :data:`NULL_RTOL` of its scale, on the
    parameters it informs at all (rows of exact zeros, e.g. a probability on its boundary that
    a model holds fixed, are null directions, not a failure)."""
    live = np.any(M != 0.0, axis=1)
    if not live.any():
        return False
    sub = M[np.ix_(live, live)]
    w = np.linalg.eigvalsh(0.5 * (sub + sub.T))
    return bool(w[0] > NULL_RTOL * max(float(w[-1]), 1e-300))


def _mapped(J: np.ndarray, inv: np.ndarray, null: np.ndarray, index) -> tuple[np.ndarray, list]:
    """``J inv J^T``, with NaN for the reported parameters moving along ``null``."""
    cov = J @ inv @ J.T
    names = []
    if null.shape[1]:
        along = np.linalg.norm(J @ null, axis=1) > 1e-8 * np.maximum(np.linalg.norm(J, axis=1),
                                                                     1e-300)
        cov[along, :] = np.nan
        cov[:, along] = np.nan
        names = [f"{c} {p}" for (c, p), a in zip(index, along, strict=True) if a]
    return cov, names


def _worst_direction(M: np.ndarray, J: np.ndarray, index) -> str:
    """The reported parameters that load most on ``M``'s smallest eigenvector."""
    w, V = np.linalg.eigh(0.5 * (M + M.T))
    load = np.abs(J @ V[:, 0])
    top = np.argsort(load)[::-1][:3]
    return ", ".join(f"{index[i][0]} {index[i][1]}" for i in top if load[i] > 0)


def choose_covariance(tot: InformationTotals, J: np.ndarray, index, cov_type: str | None,
                      groups: str, df_params: int, name: str) -> CovarianceChoice:
    """The covariance of the reported parameters (``J`` the map from the free ones, ``index``
    their names) of ``cov_type`` (module docstring); ValueError for an observed information
    that is not positive definite when it is asked for (``"observed"``, the sandwiches)."""
    info = tot.information
    if tot.opg is None and cov_type not in (None, "observed"):
        raise ValueError(f"{name}: cov_type={cov_type!r} needs the clients' score sums, and "
                         f"{name}'s clients send the observed information alone; use "
                         "cov_type='observed'")
    if cov_type is None:
        if is_positive_definite(info) or tot.opg is None:
            cov_type = "observed"
        else:
            inv, null = inverse_on_range(tot.opg)
            cov, names = _mapped(J, inv, null, index)
            note = (f"the observed information is not positive definite (smallest eigenvalue "
                    f"{_min_eig(info):.3g}, along {_worst_direction(info, J, index)}): the fit "
                    "is not at an interior maximum")
            return CovarianceChoice(cov, "empirical (outer product of the scores)", note, names)
    if cov_type == "empirical":
        inv, null = inverse_on_range(tot.opg)
        cov, names = _mapped(J, inv, null, index)
        return CovarianceChoice(cov, "empirical (outer product of the scores)", "", names)
    if not is_positive_definite(info):
        raise ValueError(f"{name}: the observed information is not positive definite (smallest "
                         f"eigenvalue {_min_eig(info):.3g}, along "
                         f"{_worst_direction(info, J, index)}): the fit is not at an interior "
                         "maximum (not converged) or a component is degenerate or unidentified; "
                         "refit with more rounds or fewer components, or use "
                         "cov_type='empirical' (summary() does so by default)")
    inv, null = inverse_on_range(info)
    if cov_type == "observed":
        cov, names = _mapped(J, inv, null, index)
        return CovarianceChoice(cov, "observed (Louis)", "", names)
    if cov_type == "robust":
        cov, names = _mapped(J, inv @ tot.opg @ inv, null, index)
        return CovarianceChoice(cov, "robust sandwich (rows independent)", "", names)
    meat, G = ((tot.site_meat, tot.n_sites) if groups == "site"
               else (tot.entity_meat, tot.n_entities))
    if G < 2:
        raise ValueError(f"{name}: cov_type='cluster' with groups={groups!r} needs at least 2 "
                         f"clusters, the data have {G}" + (
                             " (no entity level: build the dataset with entity='COLUMN')"
                             if groups == "entity" and G == 0 else ""))
    N = float(tot.n)
    factor = G / (G - 1.0) * (N - 1.0) / max(N - df_params, 1.0)
    cov, names = _mapped(J, factor * (inv @ meat @ inv), null, index)
    kind = f"cluster-robust by {groups} ({G} clusters)"
    return CovarianceChoice(cov, kind, "", names)
