"""``LatentClassRegression``: a mixture of linear regressions fitted by federated EM.

The scikit-learn estimator on the base estimator's hooks (it never overrides ``fit``): the
target is a column of the :class:`~fedlatent.data.FederatedDataset`, the initialization is
flexmix's random memberships drawn on the clients and summed through the checked exchange, and
the round loop is the engine's FedEM loop.
"""

from __future__ import annotations

import logging
import warnings

import numpy as np

from ...data.dataset import FederatedDataset
from ...engine.contract.mixture import random_membership_stats
from ...engine.contract.model import Capabilities, Params
from ...engine.contract.params import (
    ROUND_LOOP,
    Instance,
    Integer,
    Options,
    Real,
    store_params,
)
from ...engine.contract.registry import register_estimator
from ...engine.contract.selection import AUTO_SIZE, Selection, bic_selection, check_candidates
from ...engine.estimation.checks import check_enough_rows, check_weights_init
from ...engine.estimation.estimator import FitContext, check_is_fitted
from ...engine.estimation.inference import InferenceMixin
from ...engine.estimation.regression_mixture import FederatedRegressionMixture
from ...engine.node.replay_start import register_start
from ...engine.rounds.loop import FitResult
from ...engine.stats import Stats
from ..concomitant import load_concomitant, save_concomitant
from .columns import column_roles
from .dp import _spread, initialize_private, lcr_dp_sensitivity, shift_for
from .families import FAMILIES
from .glm_estimator import (
    glm_capabilities,
    glm_fitted_params,
    glm_predict_mean,
    glm_start,
    glm_store,
    glm_target_problem,
)
from .glm_model import LCRGLMModel
from .math import lcr_m_step, lcr_stat_shapes, n_free_parameters
from .model import LCRModel

__all__ = ["LatentClassRegression", "initialize_random_memberships", "random_membership_starts",
           "spread_around_pooled"]

logger = logging.getLogger(__name__)


def initialize_random_memberships(ctx: FitContext, n_components: int, n_coef: int,
                                  reg_noise: float, spread: bool = False) -> Params:
    """flexmix's default start (random memberships), federated: every client draws random
    memberships for each of its rows (uniform on the simplex; its own generator, keyed by the
    seed, the client and the query), sends the per-component sums, and the server runs the
    M-step on their total. Soft rather than flexmix's hard random labels, so that no
    component's sums on a small client are a single record's values.

    Every reply is checked (shapes, finite values, counts >= 0); a client that does not answer
    or answers badly stops the fit with an error naming it. ``spread=True``: the same exchange,
    then :func:`spread_around_pooled` (the default start).

    Returns
    -------
    dict with ``weights`` (K,), ``beta`` (K, n_coef), ``noise_variance`` (K,)
    """
    spread_start, random_start = random_membership_starts(ctx, n_components, n_coef, reg_noise)
    return spread_start if spread else random_start


@register_start("lcr")
def _lcr_start(model, ctx) -> list[Params]:
    """LCR's starts on a verifying site: ``init_params="spread"`` and ``"random"`` from the one
    random-membership exchange (none under differential privacy: the noisy start of .dp)."""
    if model.noisy:
        return []
    return list(random_membership_starts(ctx, model.K, int(ctx.n_features)
                                         + int(model.fit_intercept), model.reg))


def random_membership_starts(ctx: FitContext, n_components: int, n_coef: int,
                             reg_noise: float) -> tuple[Params, Params]:
    """``(spread, random)``: the two starts of one random-membership exchange
    (:func:`spread_around_pooled` and the M-step on the sums); a verifying site replays both
    (:meth:`~fedlatent.models.lcr.model.LCRModel.replay_start`)."""
    shapes = lcr_stat_shapes(n_components, n_coef)
    S = random_membership_stats(ctx, shapes, nonnegative=("nk", "syy"))
    weights, beta, var = lcr_m_step(S, reg_noise)
    return (spread_around_pooled(S, reg_noise, ctx.seed),
            {"weights": weights, "beta": beta, "noise_variance": var})


def spread_around_pooled(S: Stats, reg_noise: float, seed: int) -> Params:
    """The default start: ``K`` lines spread around the pooled regression, from the summed
    random-membership statistics ``S`` (memberships sum to 1 on every row, so the sums over
    the components are the pooled sums ``n``, ``sum x~ x~^T``, ``sum x~ y``, ``sum y^2``).

    The pooled least-squares line ``b`` (residual variance ``s^2``) is spread as the private
    start is (:func:`fedlatent.models.lcr.dp.initialize_private`): ``b_k = b + s A^(-1/2) z_k``
    with ``A`` the mean of ``x~ x~^T`` (each line's predictions differ from the pooled one's by
    about ``s`` on the data) and ``z_k`` spread-out draws keyed by the seed; variances
    ``s^2``, weights ``1 / K``. The random-membership start (``init_params="random"``) begins
    near the symmetric point where every component is the pooled line and EM leaves it slowly
    (on Hsb82 it stops there); this one starts away from it."""
    pooled = Stats({k: v.sum(axis=0, keepdims=True) for k, v in S.items()})
    _, b, var = lcr_m_step(pooled, reg_noise)
    K, p = S["sxy"].shape
    n = float(pooled["nk"][0])
    s2 = float(var[0])
    vals, vecs = np.linalg.eigh(0.5 * (pooled["sxx"][0] + pooled["sxx"][0].T) / n)
    vals = np.maximum(vals, max(1e-12 * float(np.abs(vals).mean()), 1e-300))
    rng = np.random.default_rng(np.random.SeedSequence(int(seed), spawn_key=(0x1C8,)))
    Z = _spread(p, K, rng)
    delta = ((Z @ vecs) / np.sqrt(vals)) @ vecs.T * np.sqrt(s2) if K > 1 else np.zeros((1, p))
    return {"weights": np.full(K, 1.0 / K), "beta": b[0][None] + delta,
            "noise_variance": np.full(K, s2)}


def _nearly_identical(params: Params, rel: float = 0.05) -> bool:
    """Whether every component's line and noise are within ``rel`` of the others' (the
    symmetric point a random-membership start begins near)."""
    beta, sd = params["beta"], np.sqrt(params["noise_variance"])
    scale = float(np.max(np.abs(beta))) + float(np.max(sd))
    spread = max(float(np.ptp(beta, axis=0).max()), float(np.ptp(sd)))
    return spread <= rel * scale


def _target_problem(cid: str, cd, target: str) -> str | None:
    """What is wrong with one client's target (None when it is usable)."""
    if cd.y is None:
        return f"client {cid!r} has no target {target!r}"
    y = np.asarray(cd.y)
    if y.ndim != 1 or y.shape[0] != cd.X.shape[0]:
        return f"client {cid!r}: target {target!r} has shape {y.shape} for {cd.X.shape[0]} rows"
    if y.dtype.kind not in "biuf":
        return (f"client {cid!r}: target {target!r} is not numeric (dtype {y.dtype}); "
                "encode it as numbers")
    bad = ~np.isfinite(y.astype(np.float64))
    if bad.any():
        return (f"client {cid!r}: target {target!r} has {int(bad.sum())} NaN or infinite "
                "values; drop those rows before fitting")
    if y.shape[0] < 1:
        return f"client {cid!r} has no rows; remove it or give it data"
    return None


@register_estimator(
    "lcr", target=True,
    description="Latent class regression: mixture of linear regressions by federated EM",
)
class LatentClassRegression(InferenceMixin, FederatedRegressionMixture):
    """Latent class regression (a mixture of linear regressions) fitted by federated EM.

    ``p(y | x) = sum_k w_k N(y; x^T coef_k + intercept_k, noise_variance_k)``. Clients send,
    per component, ``sum r``, ``sum r x~ x~^T``, ``sum r x~ y``, ``sum r y^2`` (``x~ = [x, 1]``)
    and their summed log-likelihood; the server's M-step is an unregularized weighted
    least-squares solve per component. With full participation and step 1 the iterates are
    those of centralized EM on the pooled rows (R's flexmix with ``FLXMRglm()``).

    ``family="poisson"`` (log link) and ``family="binomial"`` (logit link, ``y`` successes out
    of ``trials``) make the components generalized linear models (flexmix's
    ``FLXMRglm(family=...)``): clients send each component's responsibility-weighted gradient
    and Hessian at the broadcast coefficients and the server takes one Newton (IRLS) step a
    round, a generalized EM (:mod:`fedlatent.models.lcr.families`). ``concomitant=[...]``
    makes the class weights a multinomial logit of those columns (flexmix's
    ``FLXPmultinom``), updated by one Newton step a round from the same kind of sums
    (:mod:`fedlatent.models.concomitant`). Newton statistics hold only at the parameters they
    were computed at, so such a fit takes every client each round, step 1 and full passes (the
    engine refuses the rest, naming it).

    Parameters
    ----------
    n_components : int or "auto", default 2
        "auto": one fit per value of ``n_components_candidates``, the one of lowest BIC
        (:meth:`bic` on the fitted data, computed on the clients) is kept; ``n_components_``
        is the chosen number and ``selection_scores_`` every candidate's BIC.
    fit_intercept : bool, default True
    max_rounds : int or None, default None
        Rounds at most (round 1 is the E-step at the initial parameters).
        None: 1,000 rounds (100 with a numeric ``tol``), or under
        ``Federation(privacy=...)`` 3 rounds (every round is
        paid from the privacy budget; ``fedlatent.engine.rounds.loop.PRIVATE_MAX_ROUNDS``).
    tol : float or "auto", default "auto"
        "auto": stop once every parameter is within 0.1 standard error of the optimum (the
        summed log-likelihood within 0.005 nats of its limit, by Aitken's estimate from the
        last rounds: :mod:`fedlatent.engine.rounds.stopping`). A number: stop when the mean
        per-row log-likelihood changes by less than ``tol`` (EM leaves a start slowly: on
        the mlmRev Exam data the former default 1e-4 stopped 4.5 standard errors away).
    reg_noise : float, default 1e-6
        Added to every noise variance (a component fitting a few rows exactly would otherwise
        collapse to a zero variance and an infinite likelihood).
    init_params : {"spread", "random"}, default "spread"
        "random": flexmix's start, random memberships drawn on every client (uniform on the
        simplex, each client's own seeded generator), summed through the checked exchange, and
        the M-step on their total. "spread": the same exchange, then ``K`` lines spread around
        the pooled regression it yields (:func:`spread_around_pooled`): the random start begins
        near the symmetric point where every component is the pooled line, which EM leaves
        slowly and a fit may never leave (on Hsb82, mathach ~ ses, it stops there: pooled
        OLS in disguise).
    n_init : int or None, default None
        Starts (scikit-learn's ``n_init``, flexmix's ``nrep``): each from its own seed, the
        one of highest final log-likelihood kept (``init_scores_``, ``best_start_``;
        :mod:`fedlatent.engine.contract.starts`). None: 3 starts with full participation and full
        passes, else 1 (partial participation or mini-batches, where scoring a start costs an
        exchange; differential privacy; a checkpoint; a complete explicit start). On Hsb82
        (mathach ~ ses, client = sector, 20% of the rows held out) the defaults beat pooled
        OLS in held-out log-likelihood for each of ten seeds (-3.225 to -3.246 per row
        against -3.270); one start alone ends at a worse optimum, below OLS, for 4 seeds in
        10.
    weights_init : array-like of shape (n_components,) or None
    coef_init : array-like of shape (n_components, n_features) or None
    intercept_init : array-like of shape (n_components,) or None
        Only with ``fit_intercept=True``.
    noise_variance_init : array-like of shape (n_components,) or None
        Explicit initial parameters. When all of them are given (``intercept_init`` only with
        an intercept) the fit starts there and no initialization exchange runs; otherwise it
        starts as flexmix does, from random memberships (every client draws memberships of
        each of its rows uniformly on the simplex, with its own seeded generator, and sends the
        per-component sums; ``init_params`` says what the server makes of their total), and
        the given parts replace the corresponding parts of that start.
    federation : fl.Federation or None
        Participation, step size, compression, control variates, variance reduction, and
        ``privacy=fl.DifferentialPrivacy(..., target_range=(lo, hi))`` (required): rows clipped
        around the public centre, targets to the range, statistics about both centres, and a
        private start from the pooled sums (:mod:`fedlatent.models.lcr.dp`).
    random_state : int or None
    n_components_candidates : list of int or None, default None
        The numbers of components ``n_components="auto"`` tries; None: 1 to 6.
    family : {"gaussian", "poisson", "binomial"}, default "gaussian"
        The components' distribution of ``y`` given ``x``, with its canonical link (identity,
        log, logit). Poisson targets are counts >= 0; binomial targets successes in
        ``[0, trials]`` (0/1 without ``trials``).
    concomitant : list of str or None, default None
        Feature columns the class weights depend on (a multinomial logit with an intercept;
        they are not regressors). None: those of the data's formula after ``|``
        (``from_pandas(..., formula="y ~ x | z")``), or constant weights.
    offset : str or None, default None
        A feature column added to every component's linear predictor with coefficient 1 (the
        log exposure of Poisson counts); not a regressor.
    trials : str or None, default None
        With ``family="binomial"``: the feature column of each row's number of trials (not a
        regressor). None: one trial per row.

    Attributes
    ----------
    n_components_ : int
        The number of components of the fit (the chosen one with "auto").
    selection_scores_ : DataFrame
        Only with "auto": per candidate (index ``n_components``), ``bic``, ``loglik`` (summed
        over the rows), ``n_parameters``, ``n_iter``, ``converged`` and ``error``.
    weights_ : ndarray of shape (n_components,)
    coef_ : ndarray of shape (n_components, n_regressors)
        One coefficient per regressor (every feature but the concomitant, offset and trials
        columns; with a formula, its design).
    intercept_ : ndarray of shape (n_components,)
        Zeros when ``fit_intercept=False``.
    noise_variance_ : ndarray of shape (n_components,)
        NaN for the Poisson and binomial families (no dispersion parameter).
    concomitant_coef_ : ndarray of shape (n_components, n_concomitant)
        With concomitant variables: each class's logit coefficients (class 0, the reference,
        all zeros); ``concomitant_intercept_`` (n_components,) its intercepts. ``weights_``
        is then the mean class share over the rows of the fit.
    formula_ : FormulaDesign or None
        The formula the data were built from (``FederatedDataset.from_pandas(...,
        formula=...)``); ``predict`` and ``score`` apply it to a DataFrame of its variables.
    history_ : History
        One record per round (objective, bytes, participants, seconds...).
    converged_ : bool
    n_iter_ : int
        Rounds run (``n_rounds_`` is an alias).
    lower_bound_ : float
        Mean per-row log-likelihood at the last round's broadcast parameters.
    init_scores_ : DataFrame
        Only with more than one start: per start (index ``start``), its ``seed``, ``score``
        (final mean log-likelihood over every client), ``n_iter`` and ``converged``;
        ``best_start_`` is the kept one.
    feature_names_in_, n_features_in_

    Notes
    -----
    The random-membership start (``init_params="random"``) begins near the symmetric point
    where every component is the pooled regression, and EM leaves it slowly: with a loose
    ``tol`` the fit can stop there in a few rounds (a ConvergenceWarning says so). flexmix uses
    a tolerance of 1e-6 and restarts; the default ``"spread"`` start begins away from it.

    A component whose responsibility mass becomes (numerically) zero during the rounds keeps
    its previous coefficients and variance with weight 0 (it then predicts nothing and takes no
    rows); at initialization an empty component is an error asking for another
    ``random_state`` or fewer components.

    References
    ----------
    DeSarbo, Cron (1988), "A maximum likelihood methodology for clusterwise linear
    regression", Journal of Classification 5; Leisch (2004), "FlexMix", Journal of Statistical
    Software 11(8).

    Examples
    --------
    >>> import numpy as np, fedlatent as fl
    >>> rng = np.random.default_rng(0)
    >>> def client(n):
    ...     x = rng.uniform(0, 10, size=(n, 1)); z = rng.random(n) < 0.5
    ...     return x, np.where(z, 5 + 2 * x[:, 0], 15 - x[:, 0]) + rng.normal(size=n)
    >>> fd = fl.FederatedDataset.from_arrays({c: client(100) for c in range(4)})
    >>> lcr = fl.LatentClassRegression(2, random_state=0).fit(fd)
    >>> lcr.coef_.shape
    (2, 1)
    """

    _save_arrays = ("weights_", "coef_", "intercept_", "noise_variance_")
    _load_nonfinite = ("noise_variance_",)  # NaN for the Poisson and binomial families
    _multi_start = True  # n_init: engine/contract/starts.py
    _default_n_init = 3  # n_init=None
    _score_name = "mean log-likelihood"

    # rows with a missing target are left out (LCRModel.fit_data; issue 25); NaN covariates are
    # refused: a conditional model has no model for x. Differential privacy: the Gaussian family
    # with constant weights, no offset and no trials (the others: _refuse_private)
    capabilities = Capabilities(secure_aggregation=True, differential_privacy=True,
                                missing_target=True)

    def _refuse_private(self, fd, federation) -> None:
        """The Newton statistics (Poisson and binomial families, concomitant variables) have
        no per-record bound yet: refused with the reason (:func:`.glm_estimator.
        glm_capabilities`); the Gaussian family's closed-form fit as before."""
        if not self._plain_settings():
            caps = glm_capabilities(self.family)
            raise ValueError(f"{type(self).__name__} refuses Federation(privacy="
                             f"DifferentialPrivacy(...)): {caps.privacy_refusal}; fit it with "
                             "privacy=None")
        super()._refuse_private(fd, federation)

    @property
    def _dp_init_releases(self) -> int:
        """One release (the pooled sums of the private start) unless the start is explicit."""
        return 0 if self._explicit_init() else 1

    _parameter_constraints = {
        **ROUND_LOOP,
        "max_rounds": [None, Integer(1)],
        "tol": [Real(0), Options("auto")],
        "n_components": [AUTO_SIZE],
        "fit_intercept": ["boolean"],
        "reg_noise": LCRModel.config_constraints["reg_noise"],  # (the model's: a node's too)
        "init_params": [Options("spread", "random")],
        "n_init": [None, Integer(1)],
        "weights_init": [None, "array-like"],
        "coef_init": [None, "array-like"],
        "intercept_init": [None, "array-like"],
        "noise_variance_init": [None, "array-like"],
        "n_components_candidates": [None, "array-like"],
        "family": [Options(*FAMILIES)],
        "concomitant": [None, Instance(list, tuple, desc="a list of column names")],
        "offset": [None, str],
        "trials": [None, str],
    }

    def __init__(
        self,
        n_components: int = 2,
        *,
        fit_intercept: bool = True,
        max_rounds: int | None = None,
        tol: float | str = "auto",
        reg_noise: float = 1e-6,
        init_params: str = "spread",
        n_init: int | None = None,
        weights_init=None,
        coef_init=None,
        intercept_init=None,
        noise_variance_init=None,
        federation=None,
        random_state=None,
        n_components_candidates=None,
        family: str = "gaussian",
        concomitant=None,
        offset: str | None = None,
        trials: str | None = None,
    ):
        store_params(self, locals())

    # ---- validation -------------------------------------------------------------------------
    def _check_params(self) -> None:
        K = self.n_components
        if K == "auto" and self.federation is not None and self.federation.privacy is not None:
            raise ValueError("LatentClassRegression: n_components='auto' is chosen by the BIC on "
                             "log-likelihoods released outside the privacy budget; give "
                             "n_components a number under differential privacy")
        if K == "auto":
            check_candidates(self.n_components_candidates, range(1, 7), "n_components",
                             "n_components_candidates")
            given = [k for k in ("weights_init", "coef_init", "intercept_init",
                                 "noise_variance_init") if getattr(self, k) is not None]
            if given:
                raise ValueError(f"{given[0]} fixes the number of components, but n_components="
                                 "'auto' chooses it; give n_components a number or leave "
                                 f"{given[0]} out")
        if self.intercept_init is not None and not self.fit_intercept:
            raise ValueError("intercept_init is given but fit_intercept=False; leave it out or "
                             "set fit_intercept=True")
        check_weights_init(self.weights_init, K)
        if self.intercept_init is not None and np.shape(self.intercept_init) != (K,):
            raise ValueError(f"intercept_init must have shape {(K,)}, got "
                             f"{np.shape(self.intercept_init)}")
        if self.noise_variance_init is not None:
            if self.family != "gaussian":
                raise ValueError(f"noise_variance_init is given but family={self.family!r} has "
                                 "no noise variance; leave it out")
            v = np.asarray(self.noise_variance_init, float)
            if v.shape != (K,) or np.any(v <= 0):
                raise ValueError(f"noise_variance_init must be {K} positive numbers, got {v!r}")
        if self.trials is not None and self.family != "binomial":
            raise ValueError(f"trials={self.trials!r} is given but family={self.family!r}; "
                             "trials are the binomial family's: set family='binomial' or leave "
                             "trials out")

    def _plain_settings(self) -> bool:
        """The Gaussian family with constant weights, no offset and no trials (the closed-form
        model, :class:`LCRModel`), as far as the constructor's parameters say."""
        return (self.family == "gaussian" and not self.concomitant and self.offset is None
                and self.trials is None)

    def _validate_target(self, fd) -> None:
        target = fd.target_name or "y"
        if not fd.has_target:
            raise ValueError(
                "LatentClassRegression needs a target: the federated dataset has none; build it "
                "with FederatedDataset.from_pandas(..., target='y') or "
                "from_arrays({client: (X, y)})"
            )
        if getattr(fd, "is_remote", False):  # each node checked its own rows (_describe_local)
            empty = [c for c, m in fd.sizes.items() if m < 1]
            if empty:
                raise ValueError(f"client {empty[0]!r} has no rows; remove it or give it data")
            return
        roles = None if self.family == "gaussian" else self._roles(fd)
        for cid, cd in fd.items():
            problem = _target_problem(cid, cd, target) or (
                None if roles is None else glm_target_problem(self.family, cid, cd, target,
                                                              roles, fd.feature_names))
            if problem is not None:
                raise ValueError(problem)

    def _validate_data(self, fd) -> None:
        self._validate_target(fd)
        dp = self._federation().privacy
        if dp is not None:  # the refusal before any message (lcr_dp_sensitivity's own)
            lcr_dp_sensitivity(dp, fd.n_features, self.fit_intercept)
        check_enough_rows(fd, self.n_components, "n_components", unit="rows")
        K, d = self.n_components, len(self._roles(fd).regressors)
        if self.coef_init is not None and np.shape(self.coef_init) != (K, d):
            raise ValueError(f"coef_init must have shape {(K, d)}, got {np.shape(self.coef_init)}")

    def _describe_local(self, fd: FederatedDataset) -> dict:
        self._validate_params()
        self._validate_target(fd)
        return {}

    # ---- columns ----------------------------------------------------------------------------
    def _roles(self, fd=None):
        """The columns' roles (:func:`.columns.column_roles`) in ``fd``, or in the fitted
        features (None). A formula dataset's design gives the regressors and, unless
        ``concomitant`` names them, the concomitant variables; ``fit_intercept`` must then
        agree with the formula's intercept."""
        if fd is None:
            names, formula = list(self.feature_names_in_), getattr(self, "formula_", None)
        else:
            names, formula = list(fd.feature_names), getattr(fd, "formula", None)
        if formula is not None and bool(formula.intercept) != bool(self.fit_intercept):
            raise ValueError(f"the formula {formula.formula!r} has "
                             f"{'an' if formula.intercept else 'no'} intercept but "
                             f"fit_intercept={self.fit_intercept}; set fit_intercept="
                             f"{bool(formula.intercept)} (or change the formula)")
        return column_roles(names, self.concomitant, self.offset, self.trials, formula)

    def _glm(self, roles=None, K=None) -> LCRGLMModel:
        """The generalized model's math for these roles (every setting; prediction too)."""
        roles = self._roles() if roles is None else roles
        return LCRGLMModel(self._fitted_k() if K is None else K, self.family,
                           self.fit_intercept, self.reg_noise, roles.regressors,
                           roles.concomitant, roles.offset, roles.trials)

    def _coef_width(self) -> int:
        return len(self._roles().regressors)

    # ---- fitting hooks ----------------------------------------------------------------------
    def _selection(self) -> Selection | None:
        return bic_selection(self, range(1, 7))

    def _fitted_k(self) -> int:
        """The number of components of the fitted model."""
        return int(np.shape(self.weights_)[0])

    def _make_model(self, fd):
        K = self._fitted_k() if self.n_components == "auto" else self.n_components
        roles = self._roles(fd)
        if self.family != "gaussian" or not roles.plain:
            return self._glm(roles, K)
        dp = self._federation().privacy
        if dp is None:
            return LCRModel(K, self.fit_intercept, self.reg_noise)
        return LCRModel(K, self.fit_intercept, self.reg_noise, dp={
            "n_features": fd.n_features,
            "shift": shift_for(dp, fd.n_features, self.fit_intercept)})

    def _explicit_init(self) -> bool:
        return (self.weights_init is not None and self.coef_init is not None
                and (self.noise_variance_init is not None or self.family != "gaussian")
                and (self.intercept_init is not None or not self.fit_intercept))

    def _initialize(self, ctx: FitContext) -> Params:
        K = self.n_components
        glm = isinstance(ctx.model, LCRGLMModel)
        d = len(ctx.model.regressors) if glm else ctx.n_features
        p = d + int(self.fit_intercept)
        if self._explicit_init():
            params = {}
        elif ctx.privacy is not None:
            params = initialize_private(ctx, K, p, self.reg_noise)
        else:
            params = initialize_random_memberships(ctx, K, p, self.reg_noise,
                                                   spread=self.init_params == "spread")
        if self.weights_init is not None:
            params["weights"] = np.asarray(self.weights_init, float).copy()
        if self.coef_init is not None or self.intercept_init is not None:
            beta = np.array(params["beta"], copy=True) if "beta" in params else np.zeros((K, p))
            if self.coef_init is not None:
                beta[:, :d] = np.asarray(self.coef_init, float)
            if self.intercept_init is not None:
                beta[:, d] = np.asarray(self.intercept_init, float)
            params["beta"] = beta
        if self.noise_variance_init is not None:
            params["noise_variance"] = np.asarray(self.noise_variance_init, float).copy()
        return glm_start(ctx.model, params) if glm else params

    def _store(self, result: FitResult, model) -> None:
        p = result.params
        d = len(model.regressors) if isinstance(model, LCRGLMModel) else self.n_features_in_
        self.weights_ = np.asarray(p["weights"], float)
        self.coef_ = np.asarray(p["beta"][:, :d], float)
        self.intercept_ = (np.asarray(p["beta"][:, d], float) if self.fit_intercept
                           else np.zeros(self.weights_.shape[0]))
        self.noise_variance_ = np.asarray(p.get("noise_variance", np.full(
            self.weights_.shape[0], np.nan)), float)
        glm_store(self, p)
        self.n_components_ = int(self.weights_.shape[0])
        self.lower_bound_ = float(result.history[-1].objective)
        self.degenerate_components_ = []
        if not isinstance(model, LCRGLMModel):  # the plain Gaussian M-step holds the floor
            from .inference import degenerate_components  # (its SciPy only when fitted)

            self.degenerate_components_ = degenerate_components(
                result.S_hat, p, self.reg_noise, type(self).__name__)
        if (result.converged and self.n_components > 1 and self.family == "gaussian"
                and _nearly_identical(p)):
            from ...engine.errors import ConvergenceWarning

            warnings.warn(
                f"LatentClassRegression stopped after {result.n_rounds} rounds with nearly "
                "identical components: EM leaves the symmetric random start slowly and the "
                f"mean log-likelihood changed by less than tol={self.tol}; lower tol (flexmix "
                "uses 1e-6) or give initial parameters",
                ConvergenceWarning, stacklevel=3,
            )

    def _check_loaded(self) -> None:
        from ...engine.protocol import loadcheck as lc

        super()._check_loaded()
        if self.family == "gaussian":
            lc.expect_positive(self, "noise_variance_")
        elif not np.all(np.isnan(self.noise_variance_)):
            raise ValueError(f"noise_variance_ must be NaN for family={self.family!r}")

    def _after_load(self) -> None:
        self.n_components_ = self._fitted_k()
        if not hasattr(self, "lower_bound_") and len(self.history_):
            self.lower_bound_ = float(self.history_[-1].objective)

    def _save_extra(self) -> dict:
        return {**super()._save_extra(), **save_concomitant(self)}

    def _load_extra(self, meta: dict) -> None:
        super()._load_extra(meta)
        self.concomitant_coef_, self.concomitant_intercept_ = load_concomitant(
            meta, self._fitted_k(), len(self._roles().concomitant))

    # ---- prediction -------------------------------------------------------------------------
    def _fitted_params(self) -> Params:
        check_is_fitted(self)
        beta = self.coef_
        if self.fit_intercept:
            beta = np.hstack([self.coef_, self.intercept_[:, None]])
        return glm_fitted_params(self, {"weights": self.weights_, "beta": beta,
                                        "noise_variance": self.noise_variance_})

    def _estimate_weighted_log_prob(self, X: np.ndarray, y: np.ndarray) -> np.ndarray:
        model = self._glm()
        rp = model.parts(X, y)
        p = self._fitted_params()
        return model.component_log_prob(p, rp) + model.log_prior(p, rp)

    def _predict_mean(self, X: np.ndarray) -> np.ndarray:
        return glm_predict_mean(self._glm(), self._fitted_params(), X)

    def predict_components(self, X) -> np.ndarray:
        """Each component's mean response (the Gaussian family: its regression line
        ``x^T coef_k + intercept_k``), shape (n, K)."""
        return glm_predict_mean(self._glm(), self._fitted_params(), self._check_X(X),
                                components=True)

    # ---- inference (fedlatent.engine.estimation.inference, .inference) ---------------------------
    def _inference_layout(self):
        p = self._fitted_params()
        roles = self._roles()
        names = [str(self.feature_names_in_[j]) for j in roles.regressors] + (
            ["intercept"] if self.fit_intercept else [])
        if not (self.family == "gaussian" and roles.plain):
            from .glm_inference import glm_layout

            return glm_layout(self._glm(roles), p, names,
                              [str(self.feature_names_in_[j]) for j in roles.concomitant])
        from .inference import lcr_layout

        return lcr_layout(p["weights"], p["beta"], p["noise_variance"], names)

    def _degenerate_reason(self, n_rows: int | None) -> str:
        """A degenerate component ("" when none), for the size selection: weight worth fewer
        rows than its coefficients and variance, or a noise variance at its floor."""
        from ...engine.estimation.inference import degenerate_reason

        held = list(getattr(self, "degenerate_components_", []) or [])
        if held:
            return (f"component {held[0]} collapsed onto a point mass (its noise variance at "
                    "the floor; degenerate)")
        p = self.coef_.shape[1] + int(self.fit_intercept)
        if self.family != "gaussian":
            return degenerate_reason(self.weights_, np.ones_like(self.weights_), 0.0, n_rows, p)
        return degenerate_reason(self.weights_, self.noise_variance_, self.reg_noise, n_rows,
                                 p + 1)

    def predict_interval(self, X, alpha: float = 0.05) -> np.ndarray:
        """Central ``1 - alpha`` prediction intervals of y given x from the fitted mixture
        predictive distribution ``sum_k w_k N(x^T coef_k + intercept_k, noise_variance_k)``
        (plug-in: the parameters' own uncertainty is not added), shape (n, 2): lower, upper.
        Its quantiles are found by bisection. The Gaussian family with constant weights."""
        from ...engine.estimation.inference import _check_alpha
        from .inference import mixture_quantiles

        if not (self.family == "gaussian" and self._roles().plain):
            raise ValueError("predict_interval is the Gaussian family's with constant weights "
                             f"(family={self.family!r}, concomitant={self.concomitant!r}, "
                             f"offset={self.offset!r})")
        alpha = _check_alpha(alpha)
        p = self._fitted_params()
        means = self.predict_components(X)
        return mixture_quantiles(means, np.sqrt(p["noise_variance"]), p["weights"],
                                 np.array([alpha / 2.0, 1.0 - alpha / 2.0]))

    def _n_parameters(self) -> int:
        K = self._fitted_k()
        p = self.coef_.shape[1] + int(self.fit_intercept)
        if self.family == "gaussian" and self._roles().plain:
            return n_free_parameters(K, p)
        c = len(self._roles().concomitant)
        prior = (K - 1) * (c + 1) if c else K - 1
        return int(K * p + K * int(self.family == "gaussian") + prior)
