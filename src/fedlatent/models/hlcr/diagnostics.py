"""Convergence diagnostics of several MCMC chains: the rank-normalized split R-hat and the bulk
and tail effective sample sizes of Vehtari, Gelman, Simpson, Carpenter and Buerkner (2021), as
ArviZ (``arviz.rhat(method="rank")``, ``arviz.ess(method="bulk" | "tail")``) and Stan compute
them; the tests pin their values against ArviZ's.

Every function takes the draws of one scalar as an array (n_chains, n_draws).

References
----------
Vehtari, Gelman, Simpson, Carpenter, Buerkner, "Rank-normalization, folding, and localization:
an improved R-hat for assessing convergence of MCMC", Bayesian Analysis 16 (2021) 667-718.
"""

from __future__ import annotations

import numpy as np
from scipy import fft, special, stats

__all__ = ["ess_bulk", "ess_tail", "rhat", "split_chains", "z_scale"]


def split_chains(x: np.ndarray) -> np.ndarray:
    """Each chain cut in two halves (the middle draw of an odd chain dropped): (2 m, n // 2)."""
    x = np.atleast_2d(np.asarray(x, dtype=np.float64))
    half = x.shape[1] // 2
    return np.vstack([x[:, :half], x[:, x.shape[1] - half:]])


def z_scale(x: np.ndarray) -> np.ndarray:
    """Rank normalization: the pooled ranks (ties averaged) through the normal quantile of
    ``(r - 3/8) / (S + 1/4)``."""
    x = np.asarray(x, dtype=np.float64)
    r = stats.rankdata(x, method="average").reshape(x.shape)
    return special.ndtri((r - 0.375) / (x.size + 0.25))


def _constant(x: np.ndarray) -> bool:
    """Draws that never move (up to rounding: a share computed from the same counts)."""
    scale = max(1.0, float(np.max(np.abs(x))))
    return float(np.max(x) - np.min(x)) < np.finfo(float).resolution * scale


def _rhat_basic(x: np.ndarray) -> float:
    n = x.shape[1]
    between = n * np.var(x.mean(axis=1), ddof=1)
    within = np.mean(np.var(x, axis=1, ddof=1))
    if within <= 0.0:  # every chain constant: they disagree (inf) unless they are one value
        return float("inf") if between > 0.0 else float("nan")
    return float(np.sqrt((between / within + n - 1) / n))


def rhat(x: np.ndarray) -> float:
    """Rank-normalized split R-hat: the larger of the bulk (rank-normalized draws) and tail
    (rank-normalized folded draws ``|x - median|``) split R-hats. NaN for fewer than 2 chains
    or 4 draws, or draws that never move."""
    x = np.atleast_2d(np.asarray(x, dtype=np.float64))
    if x.shape[0] < 2 or x.shape[1] < 4 or not np.all(np.isfinite(x)) or _constant(x):
        return float("nan")
    bulk = _rhat_basic(z_scale(split_chains(x)))
    tail = _rhat_basic(z_scale(split_chains(np.abs(x - np.median(x)))))
    return max(bulk, tail)


def _autocov(x: np.ndarray) -> np.ndarray:
    """Autocovariance of every chain (rows) at lags 0..n-1 (biased, over n), by FFT."""
    n = x.shape[1]
    m = fft.next_fast_len(2 * n)
    f = np.fft.rfft(x - x.mean(axis=1, keepdims=True), n=m, axis=1)
    return np.fft.irfft(f * np.conjugate(f), n=m, axis=1)[:, :n] / n


def _ess(x: np.ndarray) -> float:
    """Effective sample size of the draws (chains as rows): Geyer's initial positive and
    monotone sequences on the multi-chain autocorrelation (Vehtari et al. 2021, eq. 10)."""
    m, n = x.shape
    if _constant(x):
        return float(x.size)
    acov = _autocov(x)
    mean_var = float(np.mean(acov[:, 0])) * n / (n - 1.0)
    var_plus = mean_var * (n - 1.0) / n + (np.var(x.mean(axis=1), ddof=1) if m > 1 else 0.0)
    rho = 1.0 - (mean_var - acov.mean(axis=0)) / var_plus
    rho[0] = 1.0
    kept = np.zeros(n)
    kept[:2] = rho[:2]
    even, odd, t = 1.0, rho[1], 1
    while t < n - 3 and even + odd > 0.0:  # a loop over lags, not draws: it stops early
        even, odd = rho[t + 1], rho[t + 2]
        if even + odd >= 0:
            kept[t + 1], kept[t + 2] = even, odd
        t += 2
    max_t = t - 2
    if even > 0:
        kept[max_t + 1] = even
    for t in range(1, max_t - 1, 2):  # Geyer's initial monotone sequence
        if kept[t + 1] + kept[t + 2] > kept[t - 1] + kept[t]:
            kept[t + 1] = kept[t + 2] = (kept[t - 1] + kept[t]) / 2.0
    tau = -1.0 + 2.0 * kept[:max_t + 1].sum() + kept[max_t + 1:max_t + 2].sum()
    tau = max(tau, 1.0 / np.log10(x.size))
    return float(x.size / tau)


def ess_bulk(x: np.ndarray) -> float:
    """Bulk effective sample size: of the rank-normalized split chains. NaN for fewer than 4
    draws per chain or non-finite draws."""
    x = np.atleast_2d(np.asarray(x, dtype=np.float64))
    if x.shape[1] < 4 or not np.all(np.isfinite(x)):
        return float("nan")
    if _constant(x):  # rank-normalizing rounding noise would invent autocorrelation
        return float(x.size)
    return _ess(z_scale(split_chains(x)))


def ess_tail(x: np.ndarray) -> float:
    """Tail effective sample size: the smaller of the ESS of the indicators of the 5% and 95%
    quantiles (split chains). NaN for fewer than 4 draws per chain or non-finite draws."""
    x = np.atleast_2d(np.asarray(x, dtype=np.float64))
    if x.shape[1] < 4 or not np.all(np.isfinite(x)):
        return float("nan")
    if _constant(x):
        return float(x.size)
    out = []
    for prob in (0.05, 0.95):
        q = np.quantile(x, prob)
        out.append(_ess(split_chains((x <= q).astype(np.float64))))
    return min(out)
