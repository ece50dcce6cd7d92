"""Standard errors, confidence intervals and summaries of a fitted EM model.

The covariance of the parameters is the inverse of the observed information of the mixture
log-likelihood at the fitted parameters, by Louis' formula (Louis 1982): for every record,

    I_i = sum_k r_ik (-H_ik) - [sum_k r_ik s_ik s_ik^T - s_i s_i^T],   s_i = sum_k r_ik s_ik

(``s_ik`` and ``H_ik`` the score and Hessian of the complete-data log-density
``log pi_k + log f_k(x_i)``, ``r_ik`` the posterior probability of component k). It is exactly
minus the Hessian of the observed log-likelihood, a sum over records, so each client sends its
own sum (a P x P matrix, P the free parameters) in one extra exchange, asked after the fit on
the first call to :meth:`InferenceMixin.cov_params`: through the checked query, or through
secure aggregation when the fit used it (the server then sees only the total).

The same exchange brings the empirical information and the sites' and entities' summed score
outer products, for the robust and cluster-robust sandwiches (``cov_type``,
:mod:`fedlatent.engine.estimation.covariance`).

Under differential privacy it is refused: the clients' noise is not in the information, so the
intervals would be too narrow by an unknown amount.

A model gives (``_inference_layout``) the free parametrization its clients use (weights by
their first K-1 values, then each component's parameters) and the linear map from it to the
reported parameters (all K weights, the regression coefficients or means, the variances).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedlatent.engine.estimation.covariance import (
    COV_TYPES,
    GROUPS,
    CovarianceChoice,
    InformationSums,
    InformationTotals,
    choose_covariance,
    reply_shapes,
)
from fedlatent.engine.estimation.estimator import FitContext, check_is_fitted
from fedlatent.engine.stats import units_number

__all__ = [
    "INFORMATION_QUERY",
    "InferenceLayout",
    "InformationSums",
    "louis_blocks",
    "InferenceMixin",
    "Summary",
    "federated_information",
    "louis_information",
    "sites_info",
    "weight_row",
    "weight_scores",
    "z_table",
]

logger = logging.getLogger(__name__)

#: the client query that returns a client's summed observed information (and its row count)
INFORMATION_QUERY = "information"


@dataclass(frozen=True)
class InferenceLayout:
    """What a model reports and how it maps from the free parametrization.

    Attributes
    ----------
    index : list of (str, str)
        (component, parameter) of each reported value, e.g. ``("1", "x0")``.
    estimate : ndarray (R,)
        The reported values.
    jacobian : ndarray (R, P)
        d reported / d free parameters (linear: the reported parameters are affine in them).
    payload : dict
        The query payload (``params/<name>``: the fitted parameters in the model's form).
    n_scale : int, default 0
        Free parameters that are noise variances (a regression's scale): left out of the
        parameter count of the cluster-robust small-sample factor, as statsmodels leaves a
        linear model's scale out of ``k_params``.
    sums : bool, default False
        Whether the model's clients answer the query with the score sums too (the reply of
        :class:`InformationSums`: empirical information, sites' and entities' score outer
        products); without them only the observed information is asked and ``cov_type``
        other than ``"observed"`` is refused.
    """

    index: list[tuple[str, str]]
    estimate: np.ndarray
    jacobian: np.ndarray
    payload: dict[str, Any]
    n_scale: int = 0
    sums: bool = False

    @property
    def n_free(self) -> int:
        return int(self.jacobian.shape[1])


def weight_row(k: int, K: int, P: int) -> np.ndarray:
    """The row of the reported ``pi_k`` in the map from the ``P`` free parameters, whose first
    ``K - 1`` are ``pi_1..pi_{K-1}`` (``pi_K = 1 - sum``): a unit row, or ``-1`` on all of
    them for the last weight."""
    row = np.zeros(P)
    if k < K - 1:
        row[k] = 1.0
    else:
        row[:K - 1] = -1.0
    return row


def weight_scores(weights: np.ndarray) -> np.ndarray:
    """``a_k`` (K, K-1): the score of ``log pi_k`` in the free weights ``pi_1..pi_{K-1}``
    (``pi_K = 1 - sum``); ``-d2 log pi_k = a_k a_k^T``."""
    w = np.asarray(weights, dtype=np.float64)
    K = w.size
    a = np.zeros((K, K - 1))
    a[np.arange(K - 1), np.arange(K - 1)] = 1.0 / w[:-1]
    a[K - 1, :] = -1.0 / w[K - 1]
    return a


def louis_information(resp: np.ndarray, scores: np.ndarray, complete: np.ndarray,
                      weight: np.ndarray | None = None) -> np.ndarray:
    """Louis' observed information of a block of records (:func:`louis_blocks`' first)."""
    return louis_blocks(resp, scores, complete, weight)[0]


def louis_blocks(resp: np.ndarray, scores: np.ndarray, complete: np.ndarray,
                 weight: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Louis' observed information of a block of records.

    Parameters
    ----------
    resp : ndarray (n, K)
        Posterior component probabilities of the records.
    scores : ndarray (n, K, P)
        Complete-data score of each record under each component, in the free parameters.
    complete : ndarray (P, P)
        ``sum_i sum_k r_ik (-H_ik)``, the expected complete-data information of the block
        (with ``weight``: each record's term times its weight).
    weight : ndarray (n,) or None
        Frequency weights: a record of weight ``w`` counts ``w`` times (as ``w`` copies).

    Returns
    -------
    info : ndarray (P, P)
        ``complete - sum_i [sum_k r_ik s_ik s_ik^T - s_i s_i^T]``.
    s : ndarray (n, P)
        Each record's observed-data score ``s_i = sum_k r_ik s_ik``.
    """
    n, K, P = scores.shape
    s = np.einsum("nk,nkp->np", resp, scores)
    wr = resp if weight is None else resp * weight[:, None]
    weighted = (scores * wr[:, :, None]).reshape(n * K, P)
    ws = s if weight is None else s * weight[:, None]
    info = complete - weighted.T @ scores.reshape(n * K, P) + ws.T @ s
    return 0.5 * (info + info.T), s


def _context(est, fd, runtime):
    """A checked-exchange context on the clients of the fit (or of ``fd`` / ``runtime``)."""
    from fedlatent.engine.privacy.disclosure import effective
    from fedlatent.engine.protocol.exchange import setup_clients
    from fedlatent.engine.transport.inprocess import InProcessRuntime

    name = type(est).__name__
    fed = est._federation()
    if fed.privacy is not None:
        raise ValueError(f"{name}: standard errors are refused under differential privacy: the "
                         "clients' noise is not in the observed information, so the intervals "
                         "would be too narrow by an unknown amount; fit with privacy=None for "
                         "inference")
    if fd is None and runtime is None:  # a verified fit: through its own channel
        from fedlatent.engine.estimation.verified_info import verified_context

        kept = verified_context(est)
        if kept is not None:
            return kept
    rt = runtime if runtime is not None else (
        InProcessRuntime(fd) if fd is not None else getattr(est, "_runtime", None))
    if rt is None:
        raise ValueError(f"{name} has no clients to ask for the information (a loaded model): "
                         "give the data of the fit, e.g. est.cov_params(fd)")
    rt = fit_sites(est, rt)
    model = est._make_model(fd)
    n_units = setup_clients(rt, model, effective(fed.disclosure, fed.secure_aggregation))
    ctx = FitContext(rt, model, fed, int(getattr(est, "seed_", 0)), n_units=n_units)
    if fed.secure_aggregation:
        from fedlatent.engine.secagg.secure import open_channel

        ctx.secure = open_channel(rt, fed, n_units, 1)
    return ctx


def fit_sites(est, runtime):
    """``runtime`` without the sites the fit of ``est`` left out (``excluded_clients_``): the
    information is the fit's, over the sites it was fitted on."""
    from fedlatent.engine.protocol.runtime import SiteSubset

    out = set(getattr(est, "excluded_clients_", None) or {}) & set(runtime.client_ids)
    return SiteSubset(runtime, out) if out else runtime


def federated_information(est, layout: InferenceLayout, fd=None,
                          runtime=None) -> InformationTotals:
    """The information sums over every client (:class:`InformationTotals`).

    One exchange of :data:`INFORMATION_QUERY`: each reply is checked for its shapes and
    finite values and its matrices for symmetry; under secure aggregation only the totals are
    seen (and checked)."""
    from fedlatent.engine.faults import FederatedFitError
    from fedlatent.engine.protocol.exchange import array, number

    ctx = _context(est, fd, runtime)
    P = layout.n_free
    shapes = reply_shapes(P)
    if not layout.sums:  # a model whose clients send the observed information alone
        shapes = {k: shapes[k] for k in ("n", "loglik", "information")}
    what = "standard errors (observed information)"
    if ctx.secure is not None:
        tot = ctx.ask_sum(INFORMATION_QUERY, layout.payload, shapes=shapes, what=what)
    else:
        rep = ctx.ask(INFORMATION_QUERY, layout.payload, what=what,
                      expect={k: number(low=0) if k.startswith("n") else
                              (number() if not shp else array(*shp))
                              for k, shp in shapes.items()})
        for c, r in rep.items():
            for key in ("information", "opg", "site_meat", "entity_meat")[:len(shapes) - 2]:
                m = np.asarray(r[key], dtype=np.float64)
                if not np.allclose(m, m.T, rtol=1e-8, atol=1e-10 * max(np.abs(m).max(), 1.0)):
                    raise FederatedFitError(f"client {c!r} sent a {key} matrix that is not "
                                            "symmetric; check that client's fedlatent version")
        tot = {k: sum(np.asarray(r[k], dtype=np.float64) for r in rep.values()) for k in shapes}
    got = (lambda k: np.asarray(tot[k]) if k in tot else None)
    return InformationTotals(
        np.asarray(tot["information"]), got("opg"), got("site_meat"), got("entity_meat"),
        units_number(round(float(tot["n"]), 9)), float(tot["loglik"]),
        int(round(float(tot.get("n_sites", 0)))), int(round(float(tot.get("n_entities", 0)))))


def z_table(estimate: np.ndarray, cov: np.ndarray, alpha: float = 0.05):
    """(std err, z, two-sided p-value, lower, upper) of normal-theory intervals."""
    from scipy import stats

    se = np.sqrt(np.clip(np.diag(cov), 0.0, None))
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(se > 0, estimate / se, np.nan)
    p = 2.0 * stats.norm.sf(np.abs(z))
    q = stats.norm.ppf(1.0 - alpha / 2.0)
    return se, z, p, estimate - q * se, estimate + q * se


def _check_alpha(alpha: float) -> float:
    alpha = float(alpha)
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1) (0.05 for 95% intervals), got {alpha}")
    return alpha


class Summary:
    """A statsmodels-style table of a fitted model's parameters.

    Attributes
    ----------
    title : str
    info : dict of str to str
        Header lines (model, rows, log-likelihood...).
    table : pandas.DataFrame
        Indexed by (component, parameter), columns ``coef``, ``std err``, ``z``, ``P>|z|``
        and the interval's bounds (``[0.025``, ``0.975]`` at alpha 0.05).
    """

    def __init__(self, title: str, info: dict[str, str], table):
        self.title, self.info, self.table = title, dict(info), table

    def as_frame(self):
        """The parameter table (a copy)."""
        return self.table.copy()

    def __str__(self) -> str:
        body = self.table.to_string(float_format=lambda v: f"{v:.4g}")
        width = max(len(line) for line in body.splitlines())
        head = [self.title.center(width), "=" * width]
        head += [f"{k + ':':<24}{v}" for k, v in self.info.items()]
        return "\n".join(head + ["-" * width, body, "=" * width])

    __repr__ = __str__


def sites_info(est) -> dict[str, str]:
    """The header lines of a summary about the sites: those left out of the fit at its setup
    (``excluded_clients_``), and how often sites were missing from a round (a round's reply
    refused or not given: left out of that round only). Empty when every site took part in
    every round."""
    from fedlatent.data.validation import NAMES_SHOWN

    info = {}
    out = dict(getattr(est, "excluded_clients_", None) or {})
    if out:
        names = ", ".join(repr(c) for c in list(out)[:NAMES_SHOWN])
        more = f" and {len(out) - NAMES_SHOWN} more" if len(out) > NAMES_SHOWN else ""
        info["Sites left out"] = (f"{len(out)}: {names}{more} (refused the setup by a rule; "
                                  "excluded_clients_ says why)")
    rounds = [r for r in getattr(est, "history_", None) or [] if hasattr(r, "missing")]
    counts: dict[str, int] = {}
    for r in rounds:
        for c in list(r.missing) + list(getattr(r, "rejected", {}) or {}):
            counts[c] = counts.get(c, 0) + 1
    if counts:
        top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        shown = ", ".join(f"{c!r} {n}" for c, n in top[:NAMES_SHOWN])
        more = f" and {len(top) - NAMES_SHOWN} more" if len(top) > NAMES_SHOWN else ""
        info["Missing from rounds"] = (f"{len(top)} site(s) of {len(rounds)} rounds: "
                                       f"{shown}{more} (history_ 'missing', 'rejected')")
    return info


def _check_cov_type(cov_type, groups) -> None:
    if cov_type is not None and cov_type not in COV_TYPES:
        raise ValueError(f"cov_type must be None or one of {', '.join(map(repr, COV_TYPES))}, "
                         f"got {cov_type!r}")
    if groups not in GROUPS:
        raise ValueError(f"groups must be one of {', '.join(map(repr, GROUPS))} (the clusters "
                         f"of cov_type='cluster'), got {groups!r}")


class InferenceMixin:
    """``cov_params``, ``bse_``, ``conf_int`` and ``summary`` for a fitted EM estimator whose
    model answers :data:`INFORMATION_QUERY` and which defines ``_inference_layout()``.

    ``cov_type`` (:mod:`fedlatent.engine.estimation.covariance`): None (the default: the
    observed information where it is positive definite, else the empirical one, said so),
    ``"observed"``, ``"empirical"``, ``"robust"`` or ``"cluster"`` (with ``groups="site"`` or
    ``"entity"``: sandwiches from the sites' or the entities' summed scores, both federated
    sums)."""

    def _inference_layout(self) -> InferenceLayout:  # pragma: no cover - per estimator
        raise NotImplementedError

    def information_totals(self, fd=None, *, runtime=None) -> InformationTotals:
        """The information sums over the clients, asked once (cached with the fitted
        parameters). ``fd``/``runtime``: the clients to ask (default: those of the fit, kept in
        this process); needed for a loaded model."""
        check_is_fitted(self)
        layout = self._inference_layout()
        key = np.asarray(layout.estimate, dtype=np.float64).tobytes()
        cached = getattr(self, "_information_cache", None)
        if cached is not None and cached[0] == key and fd is None and runtime is None:
            return cached[1]
        tot = federated_information(self, layout, fd, runtime)
        self._information_cache = (key, tot)
        return tot

    def observed_information(self, fd=None, *, runtime=None) -> np.ndarray:
        """The observed information (P, P) in the free parameters (Louis), from the clients."""
        return self.information_totals(fd, runtime=runtime).information

    def _covariance(self, fd, runtime, cov_type, groups) -> CovarianceChoice:
        _check_cov_type(cov_type, groups)
        layout = self._inference_layout()
        tot = self.information_totals(fd, runtime=runtime)
        return choose_covariance(tot, layout.jacobian, layout.index, cov_type, groups,
                                 layout.n_free - layout.n_scale, type(self).__name__)

    def cov_params(self, fd=None, *, runtime=None, cov_type: str | None = None,
                   groups: str = "site"):
        """Covariance of the reported parameters (a DataFrame indexed by (component,
        parameter) both ways), mapped from the free parameters; ``cov_type`` and ``groups``:
        see the class docstring (NaN rows: parameters along a degenerate direction)."""
        import pandas as pd

        layout = self._inference_layout()
        choice = self._covariance(fd, runtime, cov_type, groups)
        idx = pd.MultiIndex.from_tuples(layout.index, names=["component", "parameter"])
        return pd.DataFrame(choice.cov, index=idx, columns=idx)

    @property
    def bse_(self):
        """Standard errors of the reported parameters (a Series, statsmodels' ``bse``)."""
        import pandas as pd

        cov = self.cov_params()
        return pd.Series(np.sqrt(np.clip(np.diag(cov.to_numpy()), 0, None)), index=cov.index,
                         name="std err")

    def conf_int(self, alpha: float = 0.05, *, cov_type: str | None = None,
                 groups: str = "site"):
        """Normal-theory ``1 - alpha`` intervals of the reported parameters (a DataFrame with
        columns ``lower``, ``upper``)."""
        import pandas as pd

        alpha = _check_alpha(alpha)
        cov = self.cov_params(cov_type=cov_type, groups=groups)
        est = np.asarray(self._inference_layout().estimate, dtype=np.float64)
        _, _, _, lo, hi = z_table(est, cov.to_numpy(), alpha)
        return pd.DataFrame({"lower": lo, "upper": hi}, index=cov.index)

    def summary(self, alpha: float = 0.05, *, cov_type: str | None = None,
                groups: str = "site") -> Summary:
        """A statsmodels-style table per component: estimate, std err, z, P>|z| and the
        ``1 - alpha`` interval; the header says which covariance, whether the fit converged
        and how far from the optimum it may be."""
        import pandas as pd

        alpha = _check_alpha(alpha)
        layout = self._inference_layout()
        choice = self._covariance(None, None, cov_type, groups)
        est = np.asarray(layout.estimate, dtype=np.float64)
        se, z, p, lo, hi = z_table(est, choice.cov, alpha)
        idx = pd.MultiIndex.from_tuples(layout.index, names=["component", "parameter"])
        table = pd.DataFrame({"coef": est, "std err": se, "z": z, "P>|z|": p,
                              f"[{alpha / 2:g}": lo, f"{1 - alpha / 2:g}]": hi}, index=idx)
        tot = self.information_totals()
        info = {"Model": type(self).__name__, "Components": str(self.n_components_),
                "Observations": str(tot.n), "Log-likelihood": f"{tot.loglik:.6g}",
                "Converged": str(bool(self.converged_)),
                "Distance to optimum": optimum_distance(self), "Covariance": choice.kind,
                **sites_info(self)}
        if choice.note:
            info["Covariance note"] = choice.note
        if choice.unidentified:
            info["Unidentified (no SE)"] = ", ".join(choice.unidentified[:10]) + (
                f" and {len(choice.unidentified) - 10} more"
                if len(choice.unidentified) > 10 else "")
        return Summary(f"{type(self).__name__} results", info, table)


def optimum_distance(est) -> str:
    """How far from the optimum the fitted parameters may be, in standard errors, from the
    last rounds' objectives (:mod:`fedlatent.engine.rounds.stopping`): plain EM only."""
    from fedlatent.engine.rounds.stopping import aitken_gap, gap_in_se

    fed = est._federation()
    hist = getattr(est, "history_", None)
    if hist is None or not fed.is_plain_em or fed.acceleration is not None:
        return "not estimated (not plain EM)"
    obj = [r.objective for r in hist]
    n = getattr(est, "_information_cache", (None, None))[1]
    gap = aitken_gap(obj, float(n.n)) if n is not None and len(obj) >= 3 else float("inf")
    if not np.isfinite(gap):
        return "not estimated (the last rounds were not in EM's linear regime)"
    return (f"at most {gap_in_se(gap):.2g} std err (log-likelihood {gap:.2g} below its "
            "limit, Aitken)")


def degenerate_reason(weights, variances, floor: float, n_rows: int | None,
                      min_rows: int) -> str:
    """Why a fitted mixture has a degenerate component ("" when none): a weight worth fewer
    than ``min_rows`` of the ``n_rows`` rows (or below 1e-8 when ``n_rows`` is unknown), or a
    variance (per component, its smallest; ``floor`` the regularization added to it) at most
    1e-6 of the largest. For the size selection
    (:func:`fedlatent.engine.contract.selection.skip_reason`)."""
    w = np.asarray(weights, dtype=np.float64)
    small = w * n_rows < min_rows if n_rows else w < 1e-8
    if small.any():
        k = int(np.flatnonzero(small)[0])
        return f"component {k} has weight {w[k]:.3g} (a degenerate component)"
    raw = np.asarray(variances, dtype=np.float64) - floor
    tiny = raw <= 1e-6 * max(float(raw.max()), 0.0)
    if tiny.any():
        k = int(np.flatnonzero(tiny)[0])
        return f"component {k} has a (near) zero variance {raw[k] + floor:.3g} (degenerate)"
    return ""
