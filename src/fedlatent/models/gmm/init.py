"""The Gaussian mixture's initialization from the clients' aggregates (never their rows):
federated moments, then (default) a k-means start built from hard-assignment sums only, the
same in plain, secure and private fits; or local k-means centroids clustered on the server.
FedGMM's Gaussian part uses it too. Every reply is checked before it is used."""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
from scipy import linalg

from ...engine.contract.model import Params
from ...engine.estimation.estimator import FitContext
from ...engine.node.replay_start import register_start
from ...engine.protocol.exchange import array, number
from ...engine.protocol.messages import bordered, count_problem, psd_problem
from ...engine.protocol.numerics import kmeans, lift_eigenvalues
from ...engine.stats import Stats
from ...engine.warn import user_stacklevel
from .math import compute_precision_cholesky, floor_noisy_covariances, gmm_m_step
from .model import gaussian_problem
from .params import INIT_PARAMS

__all__ = ["INIT_PARAMS", "GaussianStart", "initialize_gaussians", "replay_gaussians"]

#: Lloyd steps of the "kmeans-sums" start after its candidate round (one summed exchange each)
LLOYD_STEPS = 2
#: candidate centres per component of the "kmeans-sums" start
CANDIDATES_PER_COMPONENT = 8

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


def _units_of(ctx: FitContext, clients: list[str]) -> np.ndarray:
    """The clients' units at setup, as an array (:meth:`FitContext.units_of` where the
    context has it)."""
    of = getattr(ctx, "units_of", None)
    if of is not None:
        return of(clients)
    return np.fromiter(map(ctx.n_units.__getitem__, clients), np.float64, len(clients))


def _units_rows(ctx: FitContext):
    """:func:`_units_check` of many replies at once (rows: every client's ``n``)."""
    return lambda n, fields, clients: np.asarray(n, dtype=np.float64) != _units_of(ctx, clients)


def _moments_expect(ctx: FitContext, d: int) -> dict:
    """The moments reply: ``n`` as at setup, ``[[n, sum x], [sum x, sum x x^T]]`` PSD
    (replies answered at once: the vectorized screen of every client's matrix first)."""
    from ...engine.protocol.psd_screen import bordered_certified

    def psd(sxx, reply, c):
        M = bordered(np.asarray(sxx)[None], np.asarray(reply["sx"])[None], [float(reply["n"])])
        return psd_problem("the moment matrix [[sum x x^T, sum x], [., n]]", M, None, "block")

    def psd_rows(sxx, fields, clients):
        return ~bordered_certified(fields["n"], fields["sx"], sxx)

    return {"n": number(low=1, check=_units_check(ctx), rows=_units_rows(ctx)),
            "sx": array(d), "sxx": array(d, d, check=psd, rows=psd_rows)}


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


def _stats_rows(ctx: FitContext, covariance_type: str):
    """:func:`_stats_check` of many replies at once: the clients it may refuse."""
    from .batched import hard_suspects

    def rows(nk, fields, clients):
        st = {k: fields[f"stat/{k}"] for k in ("nk", "sx", "sxx")}
        return hard_suspects(st, _units_of(ctx, clients), covariance_type)
    return rows


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


def _summed(ctx: FitContext, query: str, payload: dict, shapes: dict, *, expect=None,
            what: str) -> dict[str, np.ndarray]:
    """``{field: sum over every client}`` of one query: through :meth:`FitContext.ask_sum`
    under secure aggregation or differential privacy, else every reply checked (``expect``)
    and summed in client order. The same sums in every mode (to the fixed-point rounding)."""
    if ctx.summed_only:
        return ctx.ask_sum(query, payload, shapes=shapes, what=what)
    rep = ctx.ask(query, payload, expect=expect, what=what, only_sums=True)
    return {k: rep.total(k) for k in shapes}


def _first_check(ctx: FitContext):
    """Counts and sums without second moments (``second=False``): counts of the client's
    samples summing to them, and a cell without rows sums to zero."""
    def check(nk, reply, c):
        nk = np.asarray(nk, dtype=np.float64)
        return count_problem("nk", nk, ctx.n_units[c]) or (
            "a centre without rows has a nonzero sum 'sx'"
            if np.any(np.asarray(reply["stat/sx"])[nk == 0] != 0) else None)
    return check


def _first_rows(ctx: FitContext):
    """:func:`_first_check` of many replies at once: the clients it may refuse."""
    from .batched import count_suspects

    def rows(nk, fields, clients):
        nk = np.asarray(nk, dtype=np.float64)
        empty_sum = ((nk == 0)[:, :, None] & (np.asarray(fields["stat/sx"]) != 0)).any(
            axis=(1, 2))
        return count_suspects(nk, _units_of(ctx, clients), None) | empty_sum
    return rows


def _hard_sums(ctx: FitContext, centers, center, ct: str, what: str,
               second: bool = True) -> dict[str, np.ndarray]:
    """The hard-assignment statistics of every row to its nearest of ``centers``, summed
    over the clients (``nk``, ``sx``, ``sxx`` about ``center``); without ``second``, only
    ``nk`` and ``sx`` are asked (the ``sxx`` blocks are most of a reply: ``d^2`` numbers a
    centre)."""
    centers = np.asarray(centers, dtype=np.float64)
    shapes = _stat_shapes(centers.shape[0], centers.shape[1], ct)
    payload = {"centers": centers, "center": center}
    if second:
        expect = {f"stat/{k}": array(*shp, low=0 if k == "nk" else None,
                                     check=_stats_check(ctx, ct) if k == "nk" else None,
                                     rows=_stats_rows(ctx, ct) if k == "nk" else None)
                  for k, shp in shapes.items()}
    else:
        del shapes["sxx"]
        payload["second"] = 0
        expect = {"stat/nk": array(*shapes["nk"], low=0, check=_first_check(ctx),
                                   rows=_first_rows(ctx)), "stat/sx": array(*shapes["sx"])}
    S = _summed(ctx, "hard_stats", payload,
                {f"stat/{k}": shp for k, shp in shapes.items()}, expect=expect, what=what)
    return {k: np.asarray(S[f"stat/{k}"], dtype=np.float64) for k in shapes}


def _group(S: dict, keep: np.ndarray, labels: np.ndarray, K: int, ct: str) -> dict:
    """The candidates' statistics ``S[.][keep]`` pooled by their k-means ``labels``."""
    d = S["sx"].shape[1]
    grouped = {"nk": np.zeros(K), "sx": np.zeros((K, d))}
    np.add.at(grouped["nk"], labels, S["nk"][keep])
    np.add.at(grouped["sx"], labels, S["sx"][keep])
    if "sxx" not in S:  # (counts and sums only)
        pass
    elif ct == "tied":
        grouped["sxx"] = S["sxx"]
    else:
        grouped["sxx"] = np.zeros((K,) + S["sxx"].shape[1:])
        np.add.at(grouped["sxx"], labels, S["sxx"][keep])
    return grouped


def _candidates(K: int, mean, gcov, rng, per: int) -> np.ndarray:
    """``per * K`` candidate centres drawn from the pooled Gaussian ``N(mean, gcov)``."""
    d = mean.size
    ridge = (1e-9 * np.trace(gcov) / d + 1e-12) * np.eye(d)
    return mean + rng.standard_normal((per * K, d)) @ np.linalg.cholesky(gcov + ridge).T


def _private_kmeans_start(ctx, K: int, ct: str, reg_covar: float, mean, gcov, center, n: float,
                          rng, per: int = 10):
    """The k-means start under differential privacy, from sums only (one more release).

    ``per * K`` candidate centres are drawn from the pooled (noisy) Gaussian; every client
    sends its hard-assignment statistics to them (``hard_stats``, noised like a round's); the
    server keeps the candidates that gathered rows, moves each to the mean of its rows,
    clusters them into ``K`` groups (weighted k-means on the noisy counts) and runs one M-step
    on each group's pooled statistics. Everything after the release is post-processing.
    """
    M = per * K
    S = _hard_sums(ctx, _candidates(K, mean, gcov, rng, per), center, ct,
                   "private k-means initialization (hard-assignment statistics)")
    nk = S["nk"]
    keep = np.flatnonzero(nk > 0.25 * n / M)
    if keep.size < K:  # too few candidates gathered rows: the K most populated
        keep = np.argsort(-nk)[:K]
    cents = center + S["sx"][keep] / np.maximum(nk[keep], 1.0)[:, None]
    _, labels, _ = kmeans(cents, K, rng, sample_weight=np.maximum(nk[keep], 1.0), n_init=10)
    grouped = _group(S, keep, labels, K, ct)
    grouped["nk"] = np.maximum(grouped["nk"], 1.0)
    weights, means, cov = gmm_m_step(Stats(grouped) / n, center, ct, reg_covar)
    return weights, means, floor_noisy_covariances(cov, ct, reg_covar)


def _too_few(K: int, got: int, M: int) -> None:
    """One UserWarning: the data leave the "kmeans-sums" start fewer than K populated groups
    (e.g. one extreme value stretches the pooled Gaussian the candidates are drawn from)."""
    warnings.warn(
        f"init_params='kmeans-sums': only {got} of the {M} candidate centres (or k-means groups) "
        f"gathered rows, fewer than the {K} components; this fit starts from the pooled "
        "moments ('random'), a weaker start (look for extreme values, or use fewer components)",
        UserWarning, stacklevel=user_stacklevel())


def _sums_kmeans_start(ctx, K: int, ct: str, reg_covar: float, mean, gcov, center, n: float,
                       rng, per: int = CANDIDATES_PER_COMPONENT, lloyd: int = LLOYD_STEPS):
    """The default start, "kmeans-sums": k-means built from hard-assignment sums only.

    ``per * K`` candidate centres are drawn from the pooled Gaussian; the clients' summed
    hard-assignment counts and sums to them (``hard_stats`` without second moments: the
    server uses none of the candidates', unless no Lloyd step can be kept, when it asks them
    then) move each populated candidate to the mean of its rows; a weighted k-means on the
    server groups them into ``K``; ``lloyd`` Lloyd steps (each one more ``hard_stats`` sum,
    to the ``K`` group means; counts and sums only but the last, whose second moments the
    M-step needs: a step not kept has the kept one's asked then) refine them and one M-step
    on the last statistics gives the start. The server needs only sums, so the
    plain and the secure fit compute the same start (to the fixed-point rounding); a client's
    cell of fewer than ``min_records_per_block`` rows joins its nearest larger cell in every
    mode (:func:`~fedlatent.models.gmm.model.hard_labels`). None (after one UserWarning) when
    fewer than ``K`` groups hold rows: the caller starts from the pooled moments.
    """
    M = per * K
    what = "k-means initialization (hard-assignment sums to candidate centres)"
    cands = _candidates(K, mean, gcov, rng, per)
    S = _hard_sums(ctx, cands, center, ct, what, second=False)
    keep = np.flatnonzero(S["nk"] >= 0.5)  # counts are whole numbers (or 0) on every path
    if keep.size < K:
        return _too_few(K, keep.size, M)
    cents = center + S["sx"][keep] / S["nk"][keep][:, None]
    _, labels, _ = kmeans(cents, K, rng, sample_weight=S["nk"][keep], n_init=10)
    grouped, at = _group(S, keep, labels, K, ct), None  # (at: the centres of `grouped`)
    step_what = "k-means initialization (a Lloyd step)"
    for j in range(lloyd):
        if np.any(grouped["nk"] < 0.5):
            break
        centres = center + grouped["sx"] / grouped["nk"][:, None]
        step = _hard_sums(ctx, centres, center, ct, step_what, second=j == lloyd - 1)
        if np.any(step["nk"] < 0.5):  # a centre lost every row: keep the previous grouping
            break
        grouped, at = step, centres
    if np.any(grouped["nk"] < 0.5):
        return _too_few(K, int(np.sum(grouped["nk"] >= 0.5)), M)
    if "sxx" not in grouped and at is not None:  # the last step not kept: the kept one's
        grouped = _hard_sums(ctx, at, center, ct, step_what)  # second moments
    elif "sxx" not in grouped:  # no Lloyd step kept: the candidates' second moments after all
        grouped = _group(_hard_sums(ctx, cands, center, ct, what), keep, labels, K, ct)
    return gmm_m_step(Stats(grouped) / n, center, ct, reg_covar)


def _pooled_moments(ctx: FitContext, d: int, missing=None, ct: str = "full"):
    """``(n, mean, gcov, center, replies)``: the pooled moments (summed; under DP about the
    clipping centre, noisy), the pooled mean and covariance, the centre the statistics use,
    and each client's checked reply (None when only the sum crossed). ``missing``: the
    feature names when the federation has missing values (:mod:`.missing_init`)."""
    if missing is not None:
        from .missing_init import pairwise_moments

        return pairwise_moments(ctx, d, missing, ct)
    shapes = {"n": (), "sx": (d,), "sxx": (d, d)}
    mom = None
    if ctx.summed_only:
        tot = ctx.ask_sum("moments", shapes=shapes, what="initialization (moments)")
        units = float(sum(ctx.n_units.values()))  # (weight sums: need not be whole)
        tot["n"] = units if abs(float(tot["n"]) - units) <= 0.5 else np.rint(tot["n"])
    else:
        mom = ctx.ask("moments", expect=_moments_expect(ctx, d),
                      what="initialization (moments)")
        tot = {k: mom.total(k) for k in shapes}
    n, sx, sxx = float(tot["n"]), tot["sx"], tot["sxx"]
    dp = ctx.federation.privacy
    if dp is not None:  # noisy moments about the public clipping centre
        c0 = dp.center_for(d)
        m0 = sx / n
        gcov = sxx / n - np.outer(m0, m0)
        gcov = lift_eigenvalues(gcov, 1e-3 * dp.clip ** 2 / d)[0]  # noisy: back in the cone
        return n, c0 + m0, gcov, c0, mom  # statistics centred where the rows were clipped
    center = sx / n
    gcov = sxx / n - np.outer(center, center)
    return n, center, 0.5 * (gcov + gcov.T), center, mom


def _random_start(K: int, ct: str, reg_covar: float, mean, gcov, rng, spread: bool):
    """Means drawn from N(global mean, global covariance) (``spread``: farthest-point draws),
    equal weights, the global covariance divided by K."""
    d = mean.size
    ridge = (1e-9 * np.trace(gcov) / d + 1e-12) * np.eye(d)
    jitter = np.linalg.cholesky(gcov + ridge)
    if spread:  # spread-out draws: what k-means++ would pick, data-free
        means = _spread_draws(mean, jitter, K, rng)
    else:
        means = mean + rng.standard_normal((K, d)) @ jitter.T
    gcov = gcov / K  # K components share the global spread
    cov = {
        "full": np.repeat(gcov[None] + reg_covar * np.eye(d), K, 0),
        "tied": gcov + reg_covar * np.eye(d),
        "diag": np.repeat(np.diag(gcov)[None] + reg_covar, K, 0),
        "spherical": np.full(K, np.trace(gcov) / d + reg_covar),
    }[ct]
    return np.full(K, 1.0 / K), means, cov


def _local_kmeans_start(ctx, K: int, ct: str, reg_covar: float, center, n: float, rng,
                        min_points: int, mom):
    """"kmeans-federated": local k-means centroids and counts from every client (not sums),
    clustered on the server (weighted k-means), then one hard-assignment round; ``mom``:
    each client's moments (its centroids are checked against them)."""
    d = center.size
    km = ctx.ask("kmeans", {"k": K, "min_points": int(min_points)},
                 expect={"counts": array(None, low=0, check=_counts_check(ctx)),
                         "centroids": array(None, d, check=_centroids_check(ctx, mom))},
                 what="k-means initialization")
    cids = ctx.client_ids
    for c in cids:
        if np.shape(km[c]["centroids"])[0] != np.size(km[c]["counts"]):
            from ...engine.rounds.loop import FederatedFitError

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
            f"{min_points} samples); use init_params='kmeans-sums' (the default) or "
            "'random', or lower min_points_per_centroid"
        )
    centers, _, _ = kmeans(cents, K, rng, sample_weight=counts, n_init=10)
    S = _hard_sums(ctx, centers, center, ct,
                   "k-means initialization (hard-assignment statistics)")
    return gmm_m_step(Stats(S) / n, center, ct, reg_covar)


def _effective_init(ctx: FitContext, init_params: str) -> str:
    """``init_params`` as this fit can run it: "kmeans-federated" (each client's centroids)
    cannot cross secure aggregation; it falls back to "random" with one UserWarning."""
    if (init_params == "kmeans-federated" and ctx.secure is not None
            and ctx.federation.privacy is None):
        warnings.warn(
            "init_params='kmeans-federated' sends each client's local k-means centroids, which "
            "secure aggregation does not allow: this fit starts from the pooled moments "
            "('random'), a weaker start; init_params='kmeans-sums' (the default) is the "
            "k-means start built from sums, the same as the plain fit's", UserWarning,
            stacklevel=user_stacklevel())
        return "random"
    return init_params


def _precisions_cholesky(precisions_init, ct: str) -> np.ndarray:
    prec = np.asarray(precisions_init, float)
    if ct == "full":
        return np.stack([linalg.cholesky(p, lower=True) for p in prec])
    if ct == "tied":
        return linalg.cholesky(prec, lower=True)
    return np.sqrt(prec)


@dataclass(frozen=True)
class GaussianStart:
    """How the Gaussian components start: the estimator parameters of these names
    (:meth:`of`), each documented on :class:`~fedlatent.models.gmm.FederatedGaussianMixture`."""

    covariance_type: str = "full"
    reg_covar: float = 1e-6
    init_params: str = "kmeans-sums"
    min_points_per_centroid: int = 5
    weights_init: Any = None
    means_init: Any = None
    precisions_init: Any = None

    @classmethod
    def of(cls, est) -> GaussianStart:
        """The start an estimator's parameters of the same names give (the defaults above for
        those it does not have, e.g. FedGMM's ``means_init``)."""
        return cls(**{f.name: getattr(est, f.name, f.default) for f in fields(cls)})


def initialize_gaussians(ctx: FitContext, n_components: int,
                         start: GaussianStart = GaussianStart(), missing=None) -> Params:
    """Initial Gaussian components from the clients' aggregates (never their rows).

    Every client's moments (n, sum x, sum x x^T) are summed first. Then, by ``init_params``:
    "kmeans-sums" (default, :func:`_sums_kmeans_start`; the same start in plain and secure
    fits; under DP the noised :func:`_private_kmeans_start`), "kmeans-federated" (each
    client's local centroids, :func:`_local_kmeans_start`; not sums: "random" with one
    UserWarning under secure aggregation, "kmeans-sums" under DP) or "random" (means from
    N(global mean, global covariance), equal weights, the global covariance / K).

    Every reply is checked (shapes, finite values, the model's invariants; only the sum under
    secure aggregation or DP) and a client that fails to answer stops the fit with a message
    naming it. FedGMM's Gaussian part uses this too. ``missing``: the feature names when
    the federation has missing values (pairwise moments; a pair of columns never observed
    together is refused before round 1, :mod:`.missing_init`), else None.

    Returns
    -------
    dict with ``weights`` (K,), ``means`` (K, d), ``precisions_cholesky`` and ``center`` (d,)
    """
    d, K, ct, reg_covar = ctx.n_features, n_components, start.covariance_type, start.reg_covar
    weights_init, means_init, precisions_init = (start.weights_init, start.means_init,
                                                 start.precisions_init)
    rng = np.random.default_rng(np.random.SeedSequence(ctx.seed, spawn_key=(0xC0FFEE,)))
    dp = ctx.federation.privacy
    init_params = _effective_init(ctx, start.init_params)
    n, mean, gcov, center, mom = _pooled_moments(ctx, d, missing, ct)
    args = (ctx, K, ct, reg_covar, mean, gcov, center, n, rng)
    if weights_init is not None and means_init is not None and precisions_init is not None:
        weights = means = cov = None
    elif dp is not None and init_params != "random":
        weights, means, cov = _private_kmeans_start(*args)
    elif init_params == "kmeans-sums" and (start := _sums_kmeans_start(*args)) is not None:
        weights, means, cov = start
    elif init_params in ("kmeans-sums", "random"):  # (kmeans-sums: too few groups, warned)
        weights, means, cov = _random_start(K, ct, reg_covar, mean, gcov, rng, dp is not None)
    else:
        weights, means, cov = _local_kmeans_start(ctx, K, ct, reg_covar, center, n, rng,
                                                  start.min_points_per_centroid, mom)
    if weights_init is not None:
        weights = np.asarray(weights_init, float).copy()
    if means_init is not None:
        means = np.asarray(means_init, float).copy()
    if precisions_init is not None:
        prec_chol = _precisions_cholesky(precisions_init, ct)
    else:
        prec_chol = compute_precision_cholesky(cov, ct)
    return {"weights": weights, "means": means, "precisions_cholesky": prec_chol, "center": center}


@register_start("gmm")
def _gmm_start(model, ctx) -> list[Params]:
    """The GMM's start on a verifying site (:func:`replay_gaussians`)."""
    return [replay_gaussians(ctx, model.K, model.cov_type, model.reg)]


def replay_gaussians(ctx, n_components: int, covariance_type: str, reg_covar: float) -> Params:
    """The start a verifying site replays (``ctx`` a
    :class:`~fedlatent.engine.node.replay_start.ReplayContext`): :func:`initialize_gaussians`
    itself, "kmeans-sums" when the transcript holds hard-assignment exchanges, else "random"
    (the pooled moments' start; also what "kmeans-federated" is under secure aggregation)."""
    init = "kmeans-sums" if ctx.asks("hard_stats") else "random"
    return initialize_gaussians(ctx, n_components,
                                GaussianStart(covariance_type, reg_covar, init))
