"""HLCR / FedHLCR under differential privacy: the unit of privacy, the clipping, the sensitivity
of the cluster sums and the private standardization. Pure functions; :class:`.model.HLCRModel`
and :mod:`.fitting` call them.

The unit of privacy: an entity, with at most ``M`` events
------------------------------------------------------------
An agent sends, per cluster ``k``, sums over the events of the entities it labels ``k``
(``n_events``, ``XtX``, ``Xty``, ``yty``) and their count ``n_entities``. An entity's label is
drawn from the marginal likelihood of *all* its events, so changing one event can move the
entity's whole block of events to another cluster: per event, the sensitivity is the whole
entity's contribution, and the event cannot be the unit unless every entity has one event.
The unit is therefore the entity (one agent-entity pair), with its events capped: each agent
keeps the first ``M = dp_max_events`` events of every entity in its own row order
(:func:`cap_events`; the rows beyond are not used by the fit). Two datasets are adjacent when
they differ in one entity (replace-one: agents' entity counts, ``n_units``, are public; their
event counts are not, and are released with noise).

Labels as functions of private releases. In Algorithm 3 an agent draws each entity's label
with a prior that counts the agent's *other* entities' labels (``N_i^(k)``, eq. (2)); then
entity ``j``'s data move the other entities' labels too, and the whole agent (not the entity)
would be the unit. Under differential privacy the prior is the global one only,
``p(z_ij = k) ~ psi_k = (N^(k) + alpha/K) / (N + alpha)`` with ``N^(k)`` the broadcast (noisy)
counts (:func:`~fedlatent.models.hlcr.sampler.sample_public_prior_labels`): the within-agent
term is dropped. Then, with the label sampler's uniforms ``U`` fixed (they do not depend on
the data), every entity's label in round ``t`` is a function of its own events, its own
previous label and the parameters broadcast from the releases of rounds ``< t``. Adding or
removing entity ``j`` changes round ``t``'s statistic by entity ``j``'s own terms only,
whatever its label: the rounds are an adaptive composition of Gaussian mechanisms with the
bounds below, (epsilon, delta)-DP for every ``U``, hence for their mixture. The sigma/delta
Gibbs step, the PSD projection, the standardization and the predictions are post-processing.

Sensitivity (add/remove one entity, bounds holding jointly)
-----------------------------------------------------------
Rows are clipped to the ball ``||x - c|| <= R`` (``c = dp.center``, ``R = dp.clip``), targets
to ``[lo, hi] = dp.target_range``. The sampler works on standardized rows
``x~ = (x - m) / s`` (``m = 0`` without an intercept; ``m = 0``, ``s = 1`` without
standardization) and targets ``y~ = (y - m_y) / s_y``; the scaling is public (broadcast). So

    ||x~|| <= r = R / min(s) + ||(c - m) / s||,      |y~| <= B = max(|lo - m_y|, |hi - m_y|) / s_y,

and with the intercept column ``a^2 = r^2 + 1`` (``r^2`` without). One event adds at most
``1, a^2, a B, B^2`` (Frobenius/L2) to ``n_events, XtX, Xty, yty`` of its entity's cluster
(:func:`~fedlatent.engine.privacy.regression_sensitivity`); the entity adds ``1`` to
``n_entities`` of that one cluster.

Disclosure control stays on: a cluster block of an agent over fewer than
``t = min_records_per_block`` events is sent as zeros. Adding an entity to a suppressed block
of ``m_0 <= t - 1`` events (over ``e_0 <= m_0`` entities) can make the whole block appear
(``m_0 + m_j`` events, ``e_0 + 1`` entities); removing one can make it vanish. So the per-unit
bounds are those of ``M + t - 1`` events and ``t`` entities (``t = 1`` when the rule is off or
applies to the aggregate under secure aggregation). The squared error ``sse`` is not sent
(zeros); the server rebuilds the training MSE from the noisy sums.

The server's step (post-processing): the noisy ``X^T X`` is symmetrized, each cluster's
``[[X^T X, X^T y], [y^T X, y^T y]]`` projected on the PSD cone, ``X^T X`` given the ridge
``max(0, tau - lambda_min)`` with ``tau`` the noise's own scale (:func:`noise_ridge`; AdaSSP's
adaptive ridge for private linear regression)
and the drawn sigma kept above :data:`DP_SIGMA_FLOOR` (standardized units): without them a
noisy direction of ``X^T X`` near zero gives wild coefficients, and a residual the
projection emptied a vanishing sigma.

Initialization: the standardizing moments (``"moments"``: ``n``, ``sum (x - c)``,
``sum (x - c)^2``, ``sum (y - mid)``, ``sum (y - mid)^2`` with ``mid``, ``h`` the middle and
half-width of ``target_range``) move by at most ``M, M R, M R^2, M h, M h^2`` (no per-block
suppression there); one release. The agent-size exchange (``"sizes"``) is not made (entity
counts are public, event counts come from the noisy moments), the held-out scoring of
``n_clusters="auto"`` is refused. Standardized fits start from ``K`` spread-out prior means
drawn without data (:func:`spread_start`) instead of Algorithm 3's identical clusters: every
round costs budget, and identical clusters need several to split.

Measured (``make_synthhlcr``: K = 3, F = 3, alpha = 10, 50 agents, 20 events per entity,
``dp_max_events=20``, ``clip=3.4``, ``target_range=(-4, 4)``, delta = 1e-5, 10 rounds; held-out
MSE over the plain fit's, whose pooled K = 1 fit is 2.1x): with 50,000 entities (10^6 events)
1.29x (epsilon 1) and 1.01x (epsilon 4) with local noise, 1.008x and 1.001x with secure
aggregation and distributed noise; with 5,000 entities local noise is worse than K = 1 at
epsilon <= 4, distributed noise 1.60x and 1.04x. The unit is the entity, so what counts is
the number of entities, not of events.

References
----------
Yang, Carette, Jimbo, Maruyama, "Federated Latent Class Regression for Hierarchical Data"
(2022): eq. (2), Algorithm 3. Park, Foulds, Chaudhuri, Welling, "DP-EM", AISTATS 2017
(perturbed sufficient statistics). Wang, "Revisiting differentially private linear regression:
optimal and adaptive prediction & estimation in unbounded domain", UAI 2018 (AdaSSP).
Dwork and Roth (2014), section 3.5 (adaptive composition)
and Proposition 2.1 (post-processing).
"""

from __future__ import annotations

import math

import numpy as np

from ...data.dataset import ClientData
from ...engine.privacy.clipping import clip_rows, clip_targets, regression_sensitivity

__all__ = ["DP_SIGMA_FLOOR", "SCALE_FLOOR", "cap_events", "dp_clip_events", "dp_moments_scaling",
           "hlcr_query_sensitivity", "hlcr_sensitivity", "noise_ridge", "private_moments",
           "spread_start", "sse_from_sums",
           "target_band"]

#: under differential privacy, the smallest noise sd the server's sigma draw may give, in
#: standardized units (a fraction of the target's sd): noisy sums projected on the PSD cone
#: can leave no residual at all, and a vanishing sigma makes every posterior overconfident
DP_SIGMA_FLOOR = 0.1

#: under differential privacy, a standardizing scale is at least this fraction of its bound
#: (a noisy variance can be tiny or negative; the bound on the standardized rows grows as
#: ``1 / min(s)``)
SCALE_FLOOR = 0.05


def target_band(dp) -> tuple[float, float]:
    """``(mid, half_width)`` of ``dp.target_range`` (ValueError when it is not set)."""
    if dp.target_range is None:
        raise ValueError("HLCR under differential privacy needs DifferentialPrivacy("
                         "target_range=(lo, hi)): without a bound on the target, one entity's "
                         "y moves X^T y and y^T y without limit")
    lo, hi = dp.target_range
    return 0.5 * (lo + hi), 0.5 * (hi - lo)


def cap_events(entity: np.ndarray, max_events: int) -> np.ndarray:
    """Rows kept when every entity keeps its first ``max_events`` events (row order).

    Parameters
    ----------
    entity : array_like of shape (n,)
    max_events : int >= 1

    Returns
    -------
    ndarray of int, shape (n_kept,): the kept row indices, increasing.
    """
    ent = np.asarray(entity)
    _, inv = np.unique(ent.astype(str), return_inverse=True)
    inv = inv.reshape(-1)
    order = np.argsort(inv, kind="stable")  # each entity's rows, in row order
    grouped = inv[order]
    first = np.r_[0, np.flatnonzero(np.diff(grouped)) + 1]
    rank = np.empty(len(inv), dtype=np.int64)
    rank[order] = np.arange(len(inv)) - np.repeat(first, np.diff(np.r_[first, len(inv)]))
    return np.flatnonzero(rank < int(max_events))


def dp_clip_events(data: ClientData, dp, max_events: int | None) -> ClientData:
    """An agent's events with one entity's influence bounded: rows clipped to the ball of
    ``dp.clip`` around ``dp.center``, targets to ``dp.target_range``, at most ``max_events``
    events per entity (the first ones)."""
    if max_events is None:
        raise ValueError("HLCR under differential privacy protects an entity with all its "
                         "events: give HLCR(dp_max_events=M), the number of events kept per "
                         "entity")
    target_band(dp)
    X = clip_rows(data.X, dp.clip, dp.center_for(data.n_features))
    y = clip_targets(data.y, *dp.target_range)
    clipped = data.replace(X=X, y=y)  # weights (<= 1 under privacy) kept
    return clipped.take(cap_events(data.entity, max_events))


def hlcr_sensitivity(dp, params, *, n_features: int, fit_intercept: bool, max_events: int,
                     min_block: int) -> dict[str, float]:
    """Per-entity L2 bounds of every block an agent sends (module docstring).

    Parameters
    ----------
    dp : DifferentialPrivacy
    params : dict
        The broadcast parameters; their scaling ``x_shift``, ``x_scale``, ``y_shift``,
        ``y_scale`` when the fit standardizes.
    n_features : int
        Features (without the intercept).
    fit_intercept : bool
    max_events : int
        ``M``, events kept per entity.
    min_block : int
        ``min_records_per_block`` of the disclosure rule in force on the agent (0 or 1: off).

    Returns
    -------
    dict of block name to bound (``sse`` 0: it is not sent).
    """
    target_band(dp)
    c = dp.center_for(n_features)
    if "x_scale" in params:
        m = np.asarray(params["x_shift"], dtype=np.float64).reshape(-1)
        s = np.asarray(params["x_scale"], dtype=np.float64).reshape(-1)
        my = float(np.asarray(params["y_shift"]).reshape(-1)[0])
        sy = float(np.asarray(params["y_scale"]).reshape(-1)[0])
    else:
        m, s, my, sy = np.zeros(n_features), np.ones(n_features), 0.0, 1.0
    r = dp.clip / float(s.min()) + float(np.linalg.norm((c - m) / s))
    lo, hi = dp.target_range
    B = max(abs(lo - my), abs(hi - my)) / sy
    t = max(int(min_block), 1)
    reg = regression_sensitivity(r, B, fit_intercept=fit_intercept,
                                 records_per_unit=int(max_events) + t - 1)
    return {"XtX": reg["xx"], "Xty": reg["xy"], "yty": reg["yy"], "n_events": reg["n"],
            "n_entities": float(t), "sse": 0.0}


def hlcr_query_sensitivity(dp, max_events: int) -> dict[str, float]:
    """Per-entity bounds of the ``"moments"`` reply under differential privacy (sums about the
    clipping centre and the middle of the target range)."""
    _, h = target_band(dp)
    M, R = float(max_events), float(dp.clip)
    return {"n": M, "sx": M * R, "sxx": M * R * R, "sy": M * h, "syy": M * h * h}


def private_moments(X: np.ndarray, y: np.ndarray, dp) -> dict[str, object]:
    """The ``"moments"`` reply under differential privacy: sums of ``x - c``, ``(x - c)^2``,
    ``y - mid``, ``(y - mid)^2`` and the event count."""
    U = np.asarray(X, dtype=np.float64) - dp.center_for(np.shape(X)[1])
    v = np.asarray(y, dtype=np.float64) - target_band(dp)[0]
    return {"n": float(len(v)), "sx": U.sum(axis=0), "sxx": (U * U).sum(axis=0),
            "sy": float(v.sum()), "syy": float(v @ v)}


def dp_moments_scaling(tot: dict, dp, fit_intercept: bool):
    """Shifts and scales from the noisy summed ``"moments"`` (post-processing).

    As :func:`~fedlatent.models.hlcr.scaling.moments_scaling`, with every estimate projected
    on what clipped data allow: the mean in the clipping ball (in ``target_range``), each
    variance in ``[(f b)^2, b^2]`` with ``b`` its bound (``R`` per feature, the half-width for
    the target; about the origin without an intercept) and ``f = SCALE_FLOOR``.

    Returns
    -------
    x_shift, x_scale, y_shift, y_scale, n_events
        ``n_events`` the noisy event count (at least 1).
    """
    n = max(float(tot["n"]), 1.0)
    c = dp.center_for(len(np.asarray(tot["sx"]).reshape(-1)))
    mid, h = target_band(dp)
    R = float(dp.clip)
    du = np.asarray(tot["sx"], dtype=np.float64) / n  # mean of x - c
    norm = float(np.linalg.norm(du))
    if norm > R:
        du = du * (R / norm)
    dv = float(np.clip(float(tot["sy"]) / n, -h, h))  # mean of y - mid
    vu = np.asarray(tot["sxx"], dtype=np.float64) / n  # mean of (x - c)^2
    vv = float(tot["syy"]) / n
    if fit_intercept:
        bx, by = np.full(len(c), R), h
        vx, vy = vu - du**2, vv - dv**2
        mx, my = c + du, mid + dv
    else:  # root mean squares about the origin
        bx, by = R + np.abs(c), max(abs(dp.target_range[0]), abs(dp.target_range[1]))
        vx, vy = vu + 2 * c * du + c**2, vv + 2 * mid * dv + mid**2
        mx, my = np.zeros(len(c)), 0.0
    sx = np.sqrt(np.clip(vx, (SCALE_FLOOR * bx) ** 2, bx**2))
    sy = math.sqrt(min(max(vy, (SCALE_FLOOR * by) ** 2), by**2))
    return mx, sx, float(my), float(sy), n


def noise_ridge(model, params, dp, noise_multiplier: float, n_agents: int,
                threshold: int | None) -> float:
    """The eigenvalue level ``tau`` below which the server lifts a cluster's noisy ``X^T X``
    (sum over the agents) by a ridge: ``sd * sqrt(2 F)``, about the spectral norm of the
    symmetrized noise the sum carries (``sd`` its entry standard deviation:
    ``sqrt(n_agents)`` agents' local noise, or the calibrated noise times
    ``sqrt(n_agents / threshold)`` when distributed). A function of public quantities only
    (the setting, the plan, the broadcast scaling)."""
    from ...engine.privacy.client_dp import matrix_noise_scale

    return matrix_noise_scale(model.dp_sensitivity(params, dp), "XtX", noise_multiplier,
                              dp.noise, n_agents, threshold, model.F)


def spread_start(params, K: int, rng: np.random.Generator, per: int = 10) -> dict:
    """A data-free private start: ``K`` coefficient vectors picked by farthest point among
    ``per * K`` draws from ``N(0, I / F)`` (standardized units: a fit explaining the target's
    whole variance has ``||w||`` about 1), set as the clusters' prior means (``c_k = D_k w_k``
    with the prior ``D_k``). Round 1 then sends each entity to the nearest one, as k-means++
    would, instead of drawing every label from identical clusters: under differential privacy
    each round costs budget, and symmetric clusters need many to split. No data are read."""
    D = np.asarray(params["D"], dtype=np.float64)
    F = D.shape[1]
    Z = rng.standard_normal((per * K, F)) / math.sqrt(F)
    picked = [int(rng.integers(per * K))]
    d2 = np.sum((Z - Z[picked[0]]) ** 2, axis=1)
    for _ in range(K - 1):
        picked.append(int(np.argmax(d2)))
        d2 = np.minimum(d2, np.sum((Z - Z[picked[-1]]) ** 2, axis=1))
    W = Z[picked]
    return {"c": np.einsum("kij,kj->ki", D, W), "coef": W}


def sse_from_sums(XtX: np.ndarray, Xty: np.ndarray, yty: np.ndarray,
                  coef: np.ndarray) -> np.ndarray:
    """Per-cluster squared error ``y^T y - 2 w^T X^T y + w^T X^T X w`` of the coefficients
    ``coef`` (K, F) from the clusters' sums (post-processing of a private release); (K,),
    floored at 0."""
    w = np.asarray(coef, dtype=np.float64)
    sse = (np.asarray(yty, dtype=np.float64) - 2.0 * np.einsum("kf,kf->k", w, Xty)
           + np.einsum("kf,kfg,kg->k", w, XtX, w))
    return np.maximum(sse, 0.0)
