"""The Gaussian mixture estimator's missing-data side: what the server knows of the
federation's missing values, and imputation from the fitted mixture (each site imputes its
own rows locally with the one model the consortium fitted).

Imputation: given a row's observed part ``x_o``, its missing part is a mixture over the
components of ``N(mu_k,m + S_k,mo S_k,oo^-1 (x_o - mu_k,o), S_k,mm - S_k,mo S_k,oo^-1 S_k,om)``
with the posterior weights ``p(k | x_o)``. :func:`impute` returns its mean; :func:`sample_missing`
draws from it (the fitted parameters held fixed: the draws carry no parameter uncertainty,
since the observed information is not computed for data with missing values yet).
"""

from __future__ import annotations

import numpy as np

from ...engine.protocol.numerics import logsumexp
from .inference import full_covariances
from .missing import pattern_parts

__all__ = ["impute", "missing_names", "sample_missing"]


def missing_names(est, fd) -> list[str] | None:
    """The feature names when the federation holds NaN (in-process data, or a client's
    ``describe`` reply said so), else None; refuses the starts that need complete rows."""
    if getattr(fd, "is_remote", False):
        has = any(bool(e.get("missing")) for e in getattr(fd, "extras", {}).values())
    else:
        has = fd.has_missing
    if not has:
        return None
    if getattr(est, "init_params", None) == "kmeans-federated":
        raise ValueError("init_params='kmeans-federated' runs k-means on complete rows, and "
                         "the data have missing values; use init_params='kmeans-sums' (the "
                         "default) or 'random'")
    return [str(f) for f in fd.feature_names]


def _posterior_parts(est, X: np.ndarray):
    """Per pattern group: ``(rows, observed mask, resp (n_g, K), xhat (K, n_g, d),
    C (K, |m|, |m|))`` under the fitted mixture."""
    K, d = est.means_.shape
    full = full_covariances(est.covariances_, est.covariance_type, K, d)
    for rows, o, parts in pattern_parts(X, est.means_, full):
        wlp = np.stack([p[0] for p in parts], axis=1) + np.log(est.weights_)
        resp = np.exp(wlp - logsumexp(wlp, axis=1)[:, None])
        yield (rows, o, resp, np.stack([p[1] for p in parts]),
               np.stack([p[2] for p in parts]))


def impute(est, X: np.ndarray) -> np.ndarray:
    """``X`` with every NaN replaced by its conditional mean given the row's observed part
    (``E[x_m | x_o] = sum_k p(k | x_o) E[x_m | x_o, k]``); observed values unchanged."""
    out = np.array(X, dtype=np.float64, copy=True)
    for rows, o, resp, xhat, _ in _posterior_parts(est, out):
        if o.all():
            continue
        out[rows] = np.einsum("ik,kid->id", resp, xhat)
        out[np.ix_(rows, o)] = X[np.ix_(rows, o)]
    return out


def _sqrt_psd(C: np.ndarray) -> np.ndarray:
    """A square root ``B`` with ``B B^T = C`` of PSD matrices (..., p, p) (eigenvalues >= 0)."""
    vals, vecs = np.linalg.eigh(C)
    return vecs * np.sqrt(np.maximum(vals, 0.0))[..., None, :]


def sample_missing(est, X: np.ndarray, n_draws: int, rng: np.random.Generator) -> np.ndarray:
    """``n_draws`` completions of ``X`` (n_draws, n, d): per draw and row a component from
    ``p(k | x_o)``, then the missing part from its conditional Gaussian."""
    X = np.asarray(X, dtype=np.float64)
    out = np.broadcast_to(X, (n_draws, *X.shape)).copy()
    for rows, o, resp, xhat, C in _posterior_parts(est, X):
        m = ~o
        if not m.any():
            continue
        u = rng.random((n_draws, rows.size, 1))
        comp = (u > np.cumsum(resp, axis=1)[None]).sum(axis=2)  # (n_draws, n_g)
        comp = np.minimum(comp, resp.shape[1] - 1)
        B = _sqrt_psd(C)  # (K, |m|, |m|)
        Z = rng.standard_normal((n_draws, rows.size, int(m.sum())))
        mean = xhat[:, :, m][comp, np.arange(rows.size)[None, :]]  # (n_draws, n_g, |m|)
        noise = np.einsum("skab,skb->ska", B[comp], Z)
        out[:, rows[:, None], np.flatnonzero(m)[None, :]] = mean + noise
    return out
