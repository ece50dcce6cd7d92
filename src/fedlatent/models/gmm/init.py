"""The Gaussian mixture's initialization from the clients' aggregates (never their rows):
federated moments, local k-means centroids clustered on the server, one hard-assignment round.
FedGMM's Gaussian part uses it too. Every reply is checked before it is used."""

from __future__ import annotations

import logging

import numpy as np
from scipy import linalg

from ...engine.estimator import FitContext
from ...engine.exchange import array, number
from ...engine.messages import bordered, count_problem, psd_problem
from ...engine.model import Params
from ...engine.numerics import kmeans, lift_eigenvalues
from ...engine.stats import Stats
from .math import compute_precision_cholesky, floor_noisy_covariances, gmm_m_step
from .model import gaussian_problem

__all__ = ["initialize_gaussians"]

logger = logging.getLogger(__name__)


def _stat_shapes(K: int, d: int, covariance_type: str) -> dict[str, tuple[int, ...]]:
    sxx = {"full": (K, d, d), "tied": (d, d), "diag": (K, d), "spherical": (K, d)}
    return {"nk": (K,), "sx": (K, d), "sxx": sxx[covariance_type]}


def _units_check(ctx: FitContext):
    """``n`` in a reply must be the client's number of samples at setup."""
    def check(n, reply, c):
        return None if float(n) == ctx.n_units[c] else (
            f"claims {float(n):g} samples, {ctx.n_units[c]} at setup")
    return check


def _moments_expect(ctx: FitContext, d: int) -> dict:
    """The moments reply: ``n`` as at setup, ``[[n, sum x], [sum x, sum x x^T]]`` PSD."""
    def psd(sxx, reply, c):
        M = bordered(np.asarray(sxx)[None], np.asarray(reply["sx"])[None], [float(reply["n"])])
        return psd_problem("the moment matrix [[sum x x^T, sum x], [., n]]", M, None, "block")

    return {"n": number(low=1, check=_units_check(ctx)), "sx": array(d),
            "sxx": array(d, d, check=psd)}


def _counts_check(ctx: FitContext):
    """Local k-means counts: each and their total at most the client's samples."""
    def check(counts, reply, c):
        return count_problem("counts", counts, ctx.n_units[c], total=False) or (
            None if float(np.sum(counts)) <= ctx.n_units[c] * (1 + 1e-12) else
            f"sum to {float(np.sum(counts)):g}, more than the {ctx.n_units[c]} samples")
    return check


def _centroids_check(ctx: FitContext, mom):
    """Local centroids are means of disjoint sets of the client's samples: the moment matrix
    of its samples minus ``sum_j n_j [1; c_j][1; c_j]^T`` (the samples left over) is PSD."""
    def check(cents, reply, c):
        cents = np.asarray(cents, dtype=np.float64).reshape(-1, np.shape(mom[c]["sx"])[0])
        counts = np.asarray(reply["counts"], dtype=np.float64).ravel()
        if cents.shape[0] != counts.size:
            return None  # refused below with the numbers
        full = bordered(np.asarray(mom[c]["sxx"])[None], np.asarray(mom[c]["sx"])[None],
                        [float(mom[c]["n"])])[0]
        aug = np.hstack([cents, np.ones((counts.size, 1))]) * np.sqrt(counts)[:, None]
        used = aug.T @ aug
        slack = 1e-9 * (np.abs(full) + np.abs(used))
        return psd_problem("the samples left over by the centroids ([[sum x x^T, sum x], "
                           "[., n]] minus the centroids' share)", (full - used)[None],
                           slack[None], "block")
    return check


def _stats_check(ctx: FitContext, covariance_type: str):
    """Hard-assignment statistics: a Gaussian mixture's invariants over the client's samples."""
    def check(nk, reply, c):
        st = {k[5:]: np.asarray(v) for k, v in reply.items() if str(k).startswith("stat/")}
        return gaussian_problem(st, ctx.n_units[c], covariance_type)
    return check


def _spread_draws(mean: np.ndarray, chol: np.ndarray, K: int, rng, per: int = 10) -> np.ndarray:
    """``K`` means chosen among ``per * K`` draws from ``N(mean, chol chol^T)`` by farthest
    point (in the global Mahalanobis metric) from a random first one: the start k-means++
    would give from the pooled Gaussian. Uses no data beyond the (private) moments."""
    Z = rng.standard_normal((per * K, mean.size))
    picked = [int(rng.integers(per * K))]
    d2 = np.sum((Z - Z[picked[0]]) ** 2, axis=1)
    for _ in range(K - 1):
        picked.append(int(np.argmax(d2)))
        d2 = np.minimum(d2, np.sum((Z - Z[picked[-1]]) ** 2, axis=1))
    return mean + Z[picked] @ chol.T


def _private_kmeans_start(ctx, K: int, ct: str, reg_covar: float, mean, gcov, center, n: float,
                          rng, per: int = 10):
    """The k-means start under differential privacy, from sums only (one more release).

    ``per * K`` candidate centres are drawn from the pooled (noisy) Gaussian; every client
    sends its hard-assignment statistics to them (``hard_stats``, noised like a round's); the
    server keeps the candidates that gathered rows, moves each to the mean of its rows,
    clusters them into ``K`` groups (weighted k-means on the noisy counts) and runs one M-step
    on each group's pooled statistics. Everything after the release is post-processing.
    """
    d = mean.size
    M = per * K
    ridge = (1e-9 * np.trace(gcov) / d + 1e-12) * np.eye(d)
    cands = mean + rng.standard_normal((M, d)) @ np.linalg.cholesky(gcov + ridge).T
    shapes = _stat_shapes(M, d, ct)
    hs = ctx.ask_sum("hard_stats", {"centers": cands, "center": center},
                     shapes={f"stat/{k}": shp for k, shp in shapes.items()},
                     what="private k-means initialization (hard-assignment statistics)")
    S = {k: np.asarray(hs[f"stat/{k}"], dtype=np.float64) for k in shapes}
    nk = S["nk"]
    keep = np.flatnonzero(nk > 0.25 * n / M)
    if keep.size < K:  # too few candidates gathered rows: the K most populated
        keep = np.argsort(-nk)[:K]
    cents = center + S["sx"][keep] / np.maximum(nk[keep], 1.0)[:, None]
    _, labels, _ = kmeans(cents, K, rng, sample_weight=np.maximum(nk[keep], 1.0), n_init=10)
    grouped = {"nk": np.zeros(K), "sx": np.zeros((K, d))}
    np.add.at(grouped["nk"], labels, nk[keep])
    np.add.at(grouped["sx"], labels, S["sx"][keep])
    if ct == "tied":
        grouped["sxx"] = S["sxx"]
    else:
        grouped["sxx"] = np.zeros((K,) + S["sxx"].shape[1:])
        np.add.at(grouped["sxx"], labels, S["sxx"][keep])
    grouped["nk"] = np.maximum(grouped["nk"], 1.0)
    weights, means, cov = gmm_m_step(Stats(grouped) / n, center, ct, reg_covar)
    return weights, means, floor_noisy_covariances(cov, ct, reg_covar)


def initialize_gaussians(
    ctx: FitContext,
    n_components: int,
    *,
    covariance_type: str = "full",
    reg_covar: float = 1e-6,
    init_params: str = "kmeans-federated",
    min_points_per_centroid: int = 5,
    weights_init=None,
    means_init=None,
    precisions_init=None,
) -> Params:
    """Initial Gaussian components from the clients' aggregates (never their rows).

    Every client sends its moments (n, sum x, sum x x^T); with "kmeans-federated" each also
    sends local k-means centroids of at least ``min_points_per_centroid`` samples with their
    counts, the server clusters them (weighted k-means) and one hard-assignment round of
    statistics gives the initial parameters; "random" draws means from N(global mean, global
    covariance). Every reply is checked (shapes, finite values, counts >= 0) and a client that
    fails to answer stops the fit with a message naming it. FedGMM's Gaussian part uses this too.

    Returns
    -------
    dict with ``weights`` (K,), ``means`` (K, d), ``precisions_cholesky`` and ``center`` (d,)
    """
    cids = ctx.client_ids
    seed = ctx.seed
    d = ctx.n_features
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0xC0FFEE,)))
    dp = ctx.federation.privacy
    if ctx.summed_only:
        mom = ctx.ask_sum("moments", shapes={"n": (), "sx": (d,), "sxx": (d, d)},
                          what="initialization (moments)")
        n, sx, sxx = float(np.rint(mom["n"])), mom["sx"], mom["sxx"]
        if init_params == "kmeans-federated" and dp is None:
            # local centroids are not sums: under secure aggregation or differential privacy
            # the start is drawn from the pooled moments ("random": means from N(global mean,
            # global covariance))
            logger.info("secure aggregation / differential privacy: init_params="
                        "'kmeans-federated' needs each client's centroids; starting from the "
                        "pooled moments ('random')")
            init_params = "random"
    else:
        mom = ctx.ask("moments", expect=_moments_expect(ctx, d),
                      what="initialization (moments)")
        n = sum(float(mom[c]["n"]) for c in cids)
        sx = sum(np.asarray(mom[c]["sx"]) for c in cids)
        sxx = sum(np.asarray(mom[c]["sxx"]) for c in cids)
    if dp is not None:  # noisy moments about the public clipping centre
        c0 = dp.center_for(d)
        m0 = sx / n
        gcov = sxx / n - np.outer(m0, m0)
        gcov = lift_eigenvalues(gcov, 1e-3 * dp.clip ** 2 / d)[0]  # noisy: back in the cone
        center = c0  # the statistics are centred where the rows were clipped
        mean = c0 + m0
    else:
        center = sx / n
        gcov = sxx / n - np.outer(center, center)
        gcov = 0.5 * (gcov + gcov.T)
        mean = center
    K = n_components
    ct = covariance_type
    explicit = weights_init is not None and means_init is not None and precisions_init is not None
    if explicit:
        weights = means = cov = None
    elif dp is not None and init_params == "kmeans-federated":
        weights, means, cov = _private_kmeans_start(ctx, K, ct, reg_covar, mean, gcov, center,
                                                    n, rng)
    elif init_params == "random":
        ridge = (1e-9 * np.trace(gcov) / d + 1e-12) * np.eye(d)
        jitter = np.linalg.cholesky(gcov + ridge)
        if dp is not None:  # spread-out draws: what k-means++ would pick, data-free
            means = _spread_draws(mean, jitter, K, rng)
        else:
            means = mean + rng.standard_normal((K, d)) @ jitter.T
        weights = np.full(K, 1.0 / K)
        gcov = gcov / K  # K components share the global spread
        cov = {
            "full": np.repeat(gcov[None] + reg_covar * np.eye(d), K, 0),
            "tied": gcov + reg_covar * np.eye(d),
            "diag": np.repeat(np.diag(gcov)[None] + reg_covar, K, 0),
            "spherical": np.full(K, np.trace(gcov) / d + reg_covar),
        }[ct]
    else:
        km = ctx.ask("kmeans", {"k": K, "min_points": int(min_points_per_centroid)},
                     expect={"counts": array(None, low=0, check=_counts_check(ctx)),
                             "centroids": array(None, d, check=_centroids_check(ctx, mom))},
                     what="k-means initialization")
        for c in cids:
            if np.shape(km[c]["centroids"])[0] != np.size(km[c]["counts"]):
                from ...engine.loop import FederatedFitError

                raise FederatedFitError(
                    f"k-means initialization: client {c!r} sent "
                    f"{np.shape(km[c]['centroids'])[0]} centroids with "
                    f"{np.size(km[c]['counts'])} counts; nothing of this exchange was used"
                )
        cents = np.vstack([np.asarray(km[c]["centroids"]).reshape(-1, d) for c in cids])
        counts = np.concatenate([np.asarray(km[c]["counts"]).ravel() for c in cids])
        if cents.shape[0] < K:
            raise ValueError(
                f"kmeans-federated initialization got {cents.shape[0]} centroids for "
                f"{K} components (clients send only centroids of at least "
                f"{min_points_per_centroid} samples); use init_params='random' or "
                "lower min_points_per_centroid"
            )
        centers, _, _ = kmeans(cents, K, rng, sample_weight=counts, n_init=10)
        shapes = _stat_shapes(K, d, ct)
        hs = ctx.ask("hard_stats", {"centers": centers, "center": center},
                     expect={f"stat/{k}": array(*shp, low=0 if k == "nk" else None,
                                                check=_stats_check(ctx, ct) if k == "nk" else None)
                             for k, shp in shapes.items()},
                     what="k-means initialization (hard-assignment statistics)")
        S = None
        for c in cids:
            st = Stats({k[5:]: v for k, v in hs[c].items() if k.startswith("stat/")})
            S = st if S is None else S.add_(st)
        weights, means, cov = gmm_m_step(S / n, center, ct, reg_covar)
    if weights_init is not None:
        weights = np.asarray(weights_init, float).copy()
    if means_init is not None:
        means = np.asarray(means_init, float).copy()
    if precisions_init is not None:
        prec = np.asarray(precisions_init, float)
        if ct == "full":
            prec_chol = np.stack([linalg.cholesky(p, lower=True) for p in prec])
        elif ct == "tied":
            prec_chol = linalg.cholesky(prec, lower=True)
        else:
            prec_chol = np.sqrt(prec)
    else:
        prec_chol = compute_precision_cholesky(cov, ct)
    return {"weights": weights, "means": means, "precisions_cholesky": prec_chol, "center": center}
