"""The Gaussian mixture's client side on rows with missing values: the E-step, the
initialization queries (pairwise moments, hard assignments on observed coordinates), the
clipping under differential privacy and the disclosure rule per column.

Dispatched from :class:`~fedlatent.models.gmm.model.GMMModel` only when a client's rows hold
NaN (or the server announced missing values, so that every client's reply has the same
fields): the complete-data path is untouched.

Disclosure: a client whose column is observed on ``0 < n < min_records_per_block`` rows would
send sums over those few values (the per-column moments); it drops those values (as if it
lacked the column: the pattern group is merged into "missing") and logs it; in its pairwise
moments a pair of columns observed together on that few rows is sent as never observed
together. In the client count scope (each client's own rows). The round statistics are sums
over all of a client's rows: no statistic of one pattern group alone crosses.
"""

from __future__ import annotations

import logging

import numpy as np

from ...data.client import ClientData
from ...data.validation import DataValidationError
from ...engine.contract.model import ClientStep
from ...engine.protocol.numerics import logsumexp
from .math import covariances_from_precisions, gmm_statistics, merged_rows
from .missing import missing_log_prob, missing_statistics

__all__ = ["clip_observed", "missing_query", "missing_step", "rare_columns_dropped"]

logger = logging.getLogger(__name__)


def rare_columns_dropped(X: np.ndarray, policy) -> np.ndarray:
    """``X`` with the values of every column observed on ``0 < n < min_records_per_block``
    rows set to NaN (the client count scope; unchanged otherwise)."""
    need = int(getattr(policy, "min_records_per_block", 0))
    if need <= 1 or getattr(policy, "count_scope", "client") != "client":
        return X
    n_obs = (~np.isnan(X)).sum(axis=0)
    rare = (n_obs > 0) & (n_obs < need)
    if not rare.any():
        return X
    logger.info("columns %s observed on fewer than %d rows here: their values are not used "
                "(disclosure rule min_records_per_block)", np.flatnonzero(rare).tolist(), need)
    X = X.copy()
    X[:, rare] = np.nan
    return X


def refuse_weights(data: ClientData) -> None:
    """Frequency weights and missing values together are not supported yet: refuse, naming
    the fix, rather than fit the weights as ones."""
    if data.weight is not None:
        raise DataValidationError(
            "frequency weights with missing values: the Gaussian mixture's missing-data E-step "
            "does not take weights yet; duplicate the weighted rows or impute first"
        )


def missing_step(model, params, X: np.ndarray, state) -> ClientStep:
    """The client step of ``model`` (a GMMModel) on rows with NaN."""
    X = rare_columns_dropped(X, model.disclosure)
    cov = covariances_from_precisions(params["precisions_cholesky"], model.cov_type)
    bound = None
    if model.privacy is not None:  # completed rows kept in the clipping ball
        bound = (model.privacy.center_for(X.shape[1]), float(model.privacy.clip))
    stats, norm = missing_statistics(X, {**params, "covariances": cov}, model.cov_type, bound)
    return ClientStep(stats, X.shape[0], float(np.cumsum(norm)[-1]) if len(norm) else 0.0,
                      state)


def clip_observed(data: ClientData, dp) -> ClientData:
    """Rows projected onto the clipping ball on their observed coordinates (NaN stay NaN)."""
    X = np.asarray(data.X, dtype=np.float64)
    c = dp.center_for(X.shape[1])
    D = X - c
    norms = np.sqrt(np.nansum(D * D, axis=1))
    factor = np.minimum(1.0, dp.clip / np.maximum(norms, np.finfo(float).tiny))
    return ClientData(c + D * factor[:, None], data.y, data.entity, data.rows)


def _moments(model, X: np.ndarray) -> dict:
    """``n``, the pairwise observed counts ``nobs`` (d, d) and the sums over observed values
    (``sx``; ``sxx[i, j]`` over the rows observing both): sums, like the complete moments."""
    if model.privacy is not None:
        X = X - model.privacy.center_for(X.shape[1])
    M = (~np.isnan(X)).astype(np.float64)
    Xz = np.nan_to_num(X, nan=0.0)
    nobs, sxx = M.T @ M, Xz.T @ Xz
    need = int(getattr(model.disclosure, "min_records_per_block", 0))
    if model.disclosure.count_scope == "client":  # a pair seen together on too few rows
        few = (nobs > 0) & (nobs < need)
        nobs[few], sxx[few] = 0.0, 0.0
    return {"n": X.shape[0], "nobs": nobs, "sx": Xz.sum(0), "sxx": sxx}


def _hard_stats(model, payload, X: np.ndarray, hard_labels) -> dict:
    """Hard-assignment statistics: each row to its nearest centre on its observed
    coordinates, its missing coordinates taken from that centre (``hard_labels``: the
    model's labelling with its disclosure rule, ``model.hard_labels``)."""
    centers = np.asarray(payload["centers"])
    M = ~np.isnan(X)
    Xz = np.where(M, X, 0.0)
    d2 = (np.einsum("ij,ij->i", Xz, Xz)[:, None] - 2 * Xz @ centers.T
          + M.astype(np.float64) @ (centers ** 2).T)
    labels = hard_labels(d2, model.disclosure)
    if model.privacy is None:  # a merged row keeps its place about its own centre
        X = merged_rows(X, centers, labels, d2.argmin(-1))
    filled = np.where(M, X, centers[labels])
    if model.privacy is not None:  # completed rows back in the clipping ball
        from ...engine.privacy.clipping import clip_rows

        filled = clip_rows(filled, model.privacy.clip, model.privacy.center_for(X.shape[1]))
    resp = np.zeros((X.shape[0], centers.shape[0]))
    resp[np.arange(X.shape[0]), labels] = 1.0
    st = gmm_statistics(filled, resp, np.asarray(payload["center"]), model.cov_type)
    if not payload.get("second", 1):  # counts and sums only
        st = {k: st[k] for k in ("nk", "sx")}
    return {f"stat/{k}": v for k, v in st.items()}


def missing_query(model, name: str, payload, X: np.ndarray, hard_labels,
                  entity=None) -> dict | None:
    """The reply of query ``name`` on rows with NaN (None: the complete-data query applies);
    ``hard_labels`` as :func:`_hard_stats` takes it; ``entity``: the rows' entities."""
    X = rare_columns_dropped(X, model.disclosure)
    if name == "moments":
        return _moments(model, X)
    if name == "hard_stats":
        return _hard_stats(model, payload, X, hard_labels)
    if name == "loglik":
        from ...engine.contract.model import payload_params

        p = payload_params(payload)
        cov = covariances_from_precisions(p["precisions_cholesky"], model.cov_type)
        wlp = missing_log_prob(X, p["means"], cov, model.cov_type) + np.log(p["weights"])
        return {"n": X.shape[0], "loglik": float(logsumexp(wlp, axis=1).sum())}
    if name == "kmeans":
        raise ValueError("init_params='kmeans-federated' runs k-means on complete rows, and "
                         "this client's rows have missing values; use init_params="
                         "'kmeans-sums' (the default) or 'random'")
    if name == "information":  # the observed coordinates' likelihood (.inference)
        from .inference import gmm_information_sums

        sums = gmm_information_sums(X, payload["params/weights"], payload["params/means"],
                                    payload["params/covariances"], model.cov_type,
                                    entity=entity)
        return sums.reply(float(X.shape[0]))
    return None
