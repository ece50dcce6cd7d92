"""The HLCR estimator: hooks of the base estimator (it never overrides ``fit``) and prediction.

The base estimator's ``fit`` validates the parameters (the declarative table below, then
``_check_params``), checks the data (``_validate_data``), sets the agents up, calls
``_initialize`` (the checked ``"sizes"`` exchange, then Algorithm 3's prior start) and ``_run``
(one of the two solvers of :mod:`.solvers`), and stores the result (``_store``).

References
----------
Yang, Carette, Jimbo, Maruyama, "Federated Latent Class Regression for Hierarchical Data",
2022: Algorithms 2 and 3, eqs. (1)-(10).
"""

from __future__ import annotations

import logging
from dataclasses import replace

import numpy as np

from ...data.dataset import DataValidationError, FederatedDataset
from ...engine.contract.model import Capabilities, Params
from ...engine.contract.params import ROUND_LOOP, Integer, Options, Real, store_params
from ...engine.contract.registry import register_estimator
from ...engine.estimation.estimator import FederatedEstimator, FitContext
from ...engine.fedem.federation import Federation
from ...engine.fedem.history import History
from ...engine.protocol.exchange import number
from ...engine.rounds.loop import FederatedFitError, LoopOptions
from ...engine.stats import units_number
from .fitting import (
    HYPER_START,
    TAU_START,
    HLCRHistory,
    chain_for,
    check_random_intercept,
    finish_chain,
    secure_sizes,
    start_params,
    store_fit,
    uses_random_intercept,
)
from .inference import HLCRInference, extra_chains, store_chains
from .math import check_entities, posterior_means
from .model import SIZES_QUERY, HLCRModel
from .predict import HLCRPrediction
from .privacy import noise_ridge, spread_start
from .selection import choose_k
from .solvers import ChainSettings, HLCRFit, run_federated, run_gibbs
from .waic import fit_by_waic, waic_selection, warm_start

__all__ = ["HLCR"]

logger = logging.getLogger(__name__)

SOLVERS = ("gibbs", "federated")
#: ``thin=None`` keeps about this many draws per chain: the R-hat of independent draws of
#: this length is what :func:`.inference.rhat_threshold` bounds
KEEP = 50
_POSITIVE = Real(0, closed="neither", desc="a finite number > 0")


@register_estimator(
    "hlcr", target=True, entity=True,
    description="HLCR / FedHLCR: hierarchical latent class regression by Gibbs (Yang et al.)",
)
class HLCR(HLCRInference, HLCRPrediction, FederatedEstimator):
    """Hierarchical latent class regression (HLCR) and its federated version (FedHLCR).

    Parameters
    ----------
    n_clusters : int or "auto", default 4
        Number of linear models K (>= 1). "auto": the K of ``n_clusters_range`` with the best
        held-out predictive log-likelihood (every agent holds out ``holdout`` of each entity's
        events, fits run on the rest, each agent scores its held-out events locally and only
        the two sums cross); then a fit with that K on all events. ``n_clusters_`` and
        ``k_scores_`` record the choice.
    alpha, beta : float, default 1.0
        Concentrations of the global and per-agent label priors (eq. (2)).
    delta : float or "auto", default "auto"
        Prior standard deviation of the coefficients, ``w_k ~ N(0, delta^2 I)``. "auto": drawn
        by Gibbs under an inverse-gamma prior on ``delta^2`` (see Notes). With
        ``standardize``, a fixed delta applies to the standardized coefficients.
    sigma : float or "auto", default "auto"
        Noise standard deviation (> 0) in the target's units; "auto": drawn by Gibbs under an
        inverse-gamma prior on ``sigma^2``. A number keeps it fixed, as in the paper.
    solver : {"federated", "gibbs"}, default "federated"
        "federated": FedHLCR (Algorithm 3) on the engine with ``federation``. "gibbs": the
        exact centralized collapsed Gibbs sampler (Algorithm 2) on the pooled data, a reference.
    max_rounds : int, default 100
        Rounds (federated, the initialization round included) or sweeps (gibbs); all run.
    burn_in : int or None, default None (``max_rounds // 2``)
        Iterations discarded before the retained draws (always honoured).
    tol : float, default 0.0
        0: run every iteration (a sampler does not converge because one sweep moved no
        label). > 0: the paper's stopping rule (Fig. 3), stop after ``burn_in`` once the mean
        per-entity log joint changes by less than ``tol``.
    federation : fl.Federation or None
        Federated solver settings; the paper's smoothing is
        ``Federation(step_size=gamma, participation=f, control_variates=False)``.
    fit_intercept : bool, default True
        Append a constant feature (its coefficient has the same prior).
    random_state : int, Generator or None
    verbose : bool or None
        Progress bar.
    standardize : bool or "auto", default "auto"
        Fit on standardized features and target (moments summed over the agents in one checked
        exchange; without an intercept, scaled but not centred); everything fitted is reported
        in the user's units. "auto": when sigma or delta is "auto".
    thin : int, default 1
        Keep every ``thin``-th iteration after ``burn_in``.
    n_clusters_range : (int, int), default (1, 6)
        Smallest and largest K tried by ``n_clusters="auto"``.
    holdout : float, default 0.2
        Fraction of each entity's events held out to score K (``n_clusters="auto"``).
    dp_max_events : int or None, default None
        Under ``Federation(privacy=DifferentialPrivacy(...))`` (and only there; required
        then): the unit of privacy is an entity, and every agent keeps the first
        ``dp_max_events`` events of each entity (its row order) so that one entity's
        influence is bounded (:mod:`fedlatent.models.hlcr.privacy`). The noise grows with it;
        about the typical number of events per entity is a good value.
    n_chains : int or None, default None
        Chains run (each from its own seed; :mod:`fedlatent.models.hlcr.inference`): chain 0
        is the fit (its draws are ``draws_*``, what ``predict`` uses), the others serve
        ``summary()`` (R-hat, ESS) and the verdict: a ConvergenceWarning when the R-hat of a
        label-invariant quantity exceeds 1.01 (or, for short chains, what independent draws
        exceed in 1% of the cases; see ``rhat_invariant_``). None: 2, or 1 under differential
        privacy or secure aggregation (refused there: another chain would be paid from the
        budget, or rerun the masked rounds).
    random_intercept : bool or "auto", default "auto"
        A mixture of random-intercept regressions: every entity's events share an intercept
        ``u_e ~ N(0, tau^2)`` around its cluster's, integrated out in closed form from the
        entity's statistics (:mod:`fedlatent.models.hlcr.random_intercept`; agents still send
        only per-cluster sums, one more of them). With one cluster and a flat prior (large
        ``delta``) it is the random-intercept linear mixed model (statsmodels MixedLM).
        Needs ``fit_intercept``; not with ``n_clusters="auto"`` or differential privacy.
        "auto": on wherever it is available (off without ``fit_intercept``, with
        ``n_clusters="auto"`` or under differential privacy); it is the default because it
        was no worse than MixedLM's random intercept on every split of Hsb82 and sleepstudy
        (the paper's model, False, lost on 5 of 10: docs/experiments.md). False: the paper's
        HLCR.
    tau : float or "auto", default "auto"
        The random intercept's sd in the target's units; "auto": learned by an EM-style
        update (``tau^2`` = the mean over entities of ``E[u_e^2 | y_e]``; empirical Bayes,
        its fixed point with one cluster is the ML estimate). Used with ``random_intercept``.
    Attributes
    ----------
    coef_ : ndarray of shape (K, n_features)
        Posterior means of the cluster coefficients at the point estimate, user's units.
    intercept_ : ndarray of shape (K,)
    covariances_, precisions_, c_ : ndarrays (K, F, F), (K, F, F), (K, F)
        Posterior covariances ``H_k``, precisions ``D_k`` and ``c_k = D_k w_k`` (F counts the
        intercept last), user's units.
    sigma_, delta_ : float
        Noise sd (user's units) and coefficient prior sd (fit units) of the point estimate:
        the fixed values, or the root mean of the retained draws of sigma^2, delta^2.
    draws_precisions_, draws_c_, draws_counts_, draws_labels_, draws_sigma_ : ndarrays
        The retained draws (after burn-in and thinning), user's units: what "mean"
        predictions average over. ``draws_labels_`` is -1 where the server cannot see labels.
    cluster_counts_ : ndarray of shape (K,)
        Entities per cluster ``N^(k)`` (smoothed in the federated solver).
    labels_ : ndarray of int, shape (n_pairs,)
        Cluster of every known (agent, entity) pair listed in ``pair_agents_``,
        ``pair_entities_``: the most frequent label over the retained sweeps (gibbs), the
        agents' last labels (federated; read from the runtime's client states, possible
        in-process, never from a message).
    n_clusters_ : int
        K used (``n_clusters``, or the choice of "auto").
    k_scores_ : dict of int to float
        With ``n_clusters="auto"``: mean held-out log predictive density per held-out event
        (user's units) of every K tried.
    feature_mean_, feature_scale_, target_mean_, target_scale_ :
        The internal standardization (0 and 1 without it).
    mixing_ : float
        RMS difference between the training-set predictive means of the first and the second
        half of the retained draws, over the target's sd (NaN when the labels are not visible).
    n_entities_, n_events_ : int
        Entities (agent-entity pairs) and events in the federation, as reported in the
        checked initialization exchange. Under differential privacy: the entities set up and
        the noisy count of the events the fit used (-1 without standardization: not
        released).
    history_ : History
        One row per iteration; ``history_.to_frame()`` adds ``log_joint``, ``train_mse``
        (user's units) and ``pred_change`` (retained iterations: RMS change of the running
        posterior predictive mean of the training events, over the target's sd).
    chains_ : dict of ndarrays (n_chains, T, ...)
        Every chain's retained draws (user's units; clusters matched to chain 0's):
        ``coef`` and ``coef_var`` (the conditional posterior means and variances of the
        coefficients, intercept last), ``share``, ``sigma``, ``delta``. Not saved.
    n_chains_ : int
    rhat_max_ : float
        The largest rank-normalized split R-hat of ``summary()`` (NaN with one chain).
    rhat_invariant_ : float
        The largest R-hat of the label-invariant quantities (the per-entity log joint, the
        training MSE, and sigma, tau, delta where drawn or learned): what judges the chains
        (NaN with one chain).
    n_iter_, converged_ : int, bool
        Iterations run; with several chains of at least 4 draws (and ``tol == 0``),
        ``converged_`` is ``rhat_invariant_`` at most
        :func:`~fedlatent.models.hlcr.inference.rhat_threshold` (1.01, or for short chains
        the R-hat independent draws exceed in 1% of the cases); with one chain,
        ``mixing_ < 0.02`` (two halves of the retained draws predict the same within 2% of
        the target's sd); with ``tol > 0``, whether the ``tol`` rule stopped the run.
    tau_ : float
        The entity random intercept's sd (user's units): the fixed ``tau``, or the root mean
        of its retained values; 0 without ``random_intercept``.
    random_effects_ : ndarray of shape (n_pairs,)
        Each known pair's posterior mean intercept (the BLUP, averaged over the retained
        draws; user's units) that ``predict`` adds to its events; 0 without
        ``random_intercept`` or where the labels are not visible.
    random_effects_var_ : ndarray of shape (n_pairs,)
        Their posterior variances (user's units; over the retained draws), which
        ``predict_interval`` adds to the predictive variance; ``tau_**2`` where the labels are
        not visible, 0 without the random intercept.
    random_intercept_ : bool
        Whether the fit had the random intercept (``random_intercept``, "auto" resolved).
    draws_tau_ : ndarray of shape (n_draws,)
        tau at every retained draw (user's units; 0 without ``random_intercept``).

    Notes
    -----
    Differential privacy (``Federation(privacy=...)``, ``solver="federated"``): needs
    ``target_range`` and ``dp_max_events``; the unit is an entity with its (capped) events,
    labels are drawn under the global prior only (the within-agent counts of eq. (2) would
    make the agent the unit), the standardizing moments are one noisy release and every round
    one more; ``n_clusters="auto"`` and held-out scoring are refused, ``mixing_`` is NaN (it
    reads the agents' rows). See :mod:`fedlatent.models.hlcr.privacy`.

    sigma and delta are estimated by a partially collapsed Gibbs step rather than empirical
    Bayes: after every sweep (server step in FedHLCR) the coefficients are drawn given the
    labels, then ``sigma^2 ~ IG(1 + n/2, 1 + SSE/2)`` and ``delta^2 ~ IG(1 + KF/2, 1 +
    sum ||w_k||^2/2)`` (standardized units). The draws use only the clusters' summed statistics
    the agents already send (no extra message), they stay conjugate, and their uncertainty
    enters the predictive mean; empirical Bayes would need an optimizer inside every round.

    References
    ----------
    Yang, Carette, Jimbo, Maruyama, "Federated Latent Class Regression for Hierarchical Data",
    2022: Algorithms 2 and 3, eqs. (1)-(10). van Dyk and Park (2008), partially collapsed Gibbs.
    """

    _save_arrays = ("coef_", "intercept_", "precisions_", "c_", "covariances_",
                    "cluster_counts_", "labels_", "pair_agents_", "pair_entities_",
                    "history_log_joint_", "history_train_mse_",
                    "draws_precisions_", "draws_c_", "draws_counts_", "draws_labels_",
                    "draws_sigma_", "feature_mean_", "feature_scale_", "random_effects_",
                    "draws_tau_", "random_effects_var_")
    _score_name = "mse"
    @property
    def capabilities(self) -> Capabilities:
        """FedHLCR runs on the engine's round loop (every sum secure) and releases noisy
        cluster sums (:mod:`.privacy`); the Gibbs solver pools the rows, so there is neither a
        sum to aggregate securely nor a release to add noise to."""
        if self.solver == "gibbs":
            return Capabilities(
                secure_refusal="solver='gibbs' pools the rows in one place; use "
                               "solver='federated'",
                privacy_refusal="solver='gibbs' pools the rows in one place (nothing is "
                                "released that noise could protect); use solver='federated'",
                missing_target=True)
        return Capabilities(secure_aggregation=True, differential_privacy=True,
                            missing_target=True)  # NaN targets: rows left out (issue 25)

    @property
    def _dp_init_releases(self) -> int:
        """The standardizing moments (when the fit standardizes); nothing else."""
        return int(self._standardizes())
    _load_nonfinite = ("history_log_joint_", "history_train_mse_")
    _load_text = ("pair_agents_", "pair_entities_")  # ids: the only text a saved HLCR holds
    MIXING_TOL = 0.02

    _parameter_constraints = {
        **ROUND_LOOP,
        "alpha": [_POSITIVE],
        "beta": [_POSITIVE],
        "delta": [_POSITIVE, Options("auto")],
        "sigma": [_POSITIVE, Options("auto")],
        "solver": [Options(*SOLVERS)],
        "burn_in": [None, Integer(0)],
        "fit_intercept": ["boolean"],
        "standardize": ["boolean", Options("auto")],
        "thin": [None, Integer(1)],
        "holdout": [Real(0, 0.5, closed="neither")],
        "dp_max_events": [None, Integer(1)],
        "n_chains": [None, Integer(1)],
        "random_intercept": ["boolean", Options("auto")],
        "tau": [_POSITIVE, Options("auto")],
    }

    def __init__(self, n_clusters: int | str = "auto", alpha: float = 1.0, beta: float = 1.0,
                 delta: float | str = "auto", sigma: float | str = "auto",
                 solver: str = "federated", max_rounds: int = 400, burn_in: int | None = None,
                 tol: float = 0.0, federation: Federation | None = None,
                 fit_intercept: bool = True, random_state=None, verbose: bool | None = None,
                 standardize: bool | str = "auto", thin: int | None = None,
                 n_clusters_range: tuple[int, int] = (1, 6), holdout: float = 0.2,
                 dp_max_events: int | None = None, n_chains: int | None = None,
                 random_intercept: bool | str = "auto", tau: float | str = "auto"):
        store_params(self, locals())

    # ---- validation -------------------------------------------------------------------------
    def _check_params(self) -> None:
        K = self.n_clusters
        if not (K == "auto" or (isinstance(K, int | np.integer) and not isinstance(K, bool)
                                and K >= 1)):
            raise ValueError(f"n_clusters must be an integer K >= 1, got {K!r} (or 'auto' to "
                             "choose K by held-out predictive likelihood)")
        rng_ = self.n_clusters_range
        ok = (isinstance(rng_, tuple | list) and len(rng_) == 2
              and all(isinstance(v, int | np.integer) and not isinstance(v, bool) for v in rng_)
              and 1 <= rng_[0] <= rng_[1])
        if not ok:
            raise ValueError(f"n_clusters_range must be (low, high) with 1 <= low <= high, got "
                             f"{rng_!r}")
        if self.burn_in is not None and not self.burn_in < self.max_rounds:
            raise ValueError(
                f"burn_in must be None or in [0, max_rounds={self.max_rounds}), got "
                f"{self.burn_in!r}"
            )
        self._n_chains()
        check_random_intercept(self)
        fed = self.federation  # (a solver that refuses secure aggregation says so itself)
        if (K == "auto" and fed is not None and fed.secure_aggregation
                and self.capabilities.secure_aggregation):
            raise ValueError("HLCR: n_clusters='auto' (the default) chooses K from scores each "
                             "agent sends in the clear and from several chains, neither of "
                             "which secure aggregation allows; give n_clusters a number, e.g. "
                             "HLCR(n_clusters=2)")

    def _n_chains(self) -> int:
        """``n_chains``: as given (more than one refused under differential privacy or secure
        aggregation), or 2, 1 under either."""
        fed = self.federation
        guarded = fed is not None and (fed.privacy is not None or fed.secure_aggregation)
        if self.n_chains is None:
            return 1 if guarded else 2
        if guarded and self.n_chains > 1:
            raise ValueError(f"n_chains={self.n_chains}: more than one chain is refused under "
                             "differential privacy (each chain is paid from the budget) and "
                             "secure aggregation; give n_chains=1 or None")
        return int(self.n_chains)

    def _standardizes(self) -> bool:
        if self.standardize == "auto":
            return self.sigma == "auto" or self.delta == "auto"
        return bool(self.standardize)

    def _chain(self) -> ChainSettings:
        burn = self.max_rounds // 2 if self.burn_in is None else int(self.burn_in)
        thin = max(1, (self.max_rounds - burn) // KEEP) if self.thin is None else int(self.thin)
        return ChainSettings(burn, thin,
                             HYPER_START[0] if self.sigma == "auto" else float(self.sigma),
                             HYPER_START[1] if self.delta == "auto" else float(self.delta),
                             self.sigma == "auto", self.delta == "auto",
                             TAU_START if self.tau == "auto" else float(self.tau),
                             self.tau == "auto")

    def _describe_local(self, fd: FederatedDataset) -> dict:
        self._validate_params()
        self._validate_data(fd)
        return {}

    def _validate_data(self, fd: FederatedDataset) -> None:
        if getattr(fd, "is_remote", False):  # every node ran the checks below on its own data
            if self.solver == "gibbs":
                raise ValueError("solver='gibbs' pools the data and cannot run on a "
                                 "RemoteDataset; use solver='federated'")
            return
        for cid, cd in fd.items():
            if cd.entity is None:
                raise DataValidationError(
                    f"client {cid!r} has no entity column; HLCR needs agent-entity-event data: "
                    "build the dataset with entity='COLUMN' (FederatedDataset.from_pandas)"
                )
            if cd.y is None:
                raise DataValidationError(
                    f"client {cid!r} has no target; HLCR is a regression: give target='COLUMN'"
                )
            y = np.asarray(cd.y)
            if not (np.issubdtype(y.dtype, np.number) or y.dtype == bool):
                raise DataValidationError(
                    f"client {cid!r}: target {fd.target_name or 'y'!r} is not numeric (dtype "
                    f"{y.dtype}); HLCR regresses a number: encode the target as numbers"
                )
            if not np.all(np.isfinite(y.astype(np.float64))):
                raise DataValidationError(
                    f"client {cid!r}: target {fd.target_name or 'y'!r} has NaN or infinite "
                    "values; drop those rows before fitting"
                )
            check_entities(cd.entity, cid, cd.weight)

    def _selection(self):
        """``n_clusters="auto"`` with the random intercept: K by WAIC over candidates screened
        with short chains (:mod:`.waic`); None otherwise (a number, or the held-out choice of
        :mod:`.selection` inside the fit without the random intercept)."""
        if self.n_clusters != "auto" or not self._waic_selects():
            return None
        return waic_selection(self)

    def _waic_selects(self) -> bool:
        """``n_clusters="auto"`` chooses by WAIC where its candidates have the random
        intercept (``random_intercept`` True, or "auto" with ``fit_intercept``) and several
        chains (no differential privacy or secure aggregation); else by held-out events."""
        if self.random_intercept is True:
            return True
        fed = self.federation
        guarded = fed is not None and (fed.privacy is not None or fed.secure_aggregation)
        return self.random_intercept == "auto" and bool(self.fit_intercept) and not guarded

    def _fit_auto(self, fd, selection, *, runtime, **fit_kwargs):
        """The candidates compared on the sites admitting every one (the engine's rule,
        :mod:`fedlatent.engine.estimation.sites`), the chosen K's full chains run once, on
        every site that admits it (not a second time from scratch)."""
        from ...engine.estimation.sites import chosen_sites, finish_selection, selection_sites

        data, rt, selection, sites = selection_sites(self, fd, runtime, selection)
        fit_by_waic(self, data, selection, runtime=rt,
                    final_sites=lambda K: chosen_sites(fd, runtime, sites, K), **fit_kwargs)
        return finish_selection(self, fd, runtime, sites, selection.param,
                                {k: fit_kwargs[k] for k in ("progress", "callbacks")},
                                refit=False)

    def _degenerate_reason(self, n_rows) -> str:
        """No degenerate cluster test: a candidate K is skipped when its chains do not mix
        (``converged_`` False, :func:`~fedlatent.engine.contract.selection.skip_reason`)."""
        return ""

    def _make_model(self, fd: FederatedDataset) -> HLCRModel:
        K = self.n_clusters if self.n_clusters != "auto" else self.n_clusters_range[0]
        return self._model_for(fd.n_features, K)

    def _model_for(self, n_features: int, K: int, holdout: float = 0.0,
                   seed: int = 0) -> HLCRModel:
        ch = self._chain()
        fed = self.federation
        private = fed is not None and fed.privacy is not None
        return HLCRModel(K, self.alpha, self.beta, ch.delta, ch.sigma, self.fit_intercept,
                         n_features, estimate_sigma=ch.estimate_sigma,
                         estimate_delta=ch.estimate_delta, standardize=self._standardizes(),
                         holdout=holdout, holdout_seed=seed,
                         dp_max_events=self.dp_max_events if private else None,
                         random_intercept=uses_random_intercept(self), tau=ch.tau,
                         estimate_tau=ch.estimate_tau)

    def _refuse_private(self, fd, federation) -> None:
        """The engine's refusals, then HLCR's: ``n_clusters="auto"`` (held-out scores are
        outside the budget), no ``target_range`` (the target's sums are unbounded), no
        ``dp_max_events`` (an entity's events are unbounded)."""
        super()._refuse_private(fd, federation)
        if self.n_clusters == "auto":
            raise ValueError("HLCR: n_clusters='auto' scores every K on held-out events outside "
                             "the privacy budget; give n_clusters an integer under "
                             "differential privacy")
        if federation.privacy.target_range is None:
            raise ValueError("HLCR under differential privacy needs DifferentialPrivacy("
                             "target_range=(lo, hi)), a public bound on the target "
                             f"{getattr(fd, 'target_name', None) or 'y'!r}: without it one "
                             "entity moves X^T y and y^T y without limit")
        if self.dp_max_events is None:
            raise ValueError("HLCR under differential privacy protects an entity with all its "
                             "events: give HLCR(dp_max_events=M), the number of events every "
                             "agent keeps per entity (the first M in its row order)")

    # ---- the fit's hooks --------------------------------------------------------------------
    def _initialize(self, ctx: FitContext) -> Params:
        """Every agent reports its entity and event counts and its feature width (the checked
        ``"sizes"`` exchange: finite, >= 1, entities as at setup, the fit's width); with
        ``standardize``, its sums of x, x^2, y, y^2 (``"moments"``). Then the start of
        Algorithm 3 (line 2): the prior, ``D_k = I/delta^2``, ``c_k = 0``, zero counts. Round 1
        draws the first labels. The sizes change no fitted number."""
        if self.solver == "gibbs" and ctx.runtime_given:
            raise ValueError("solver='gibbs' pools the data: runtime/checkpoint options apply "
                             "to solver='federated' only")
        what = "initialization (agent sizes)"
        if ctx.privacy is not None:  # entity counts are public; events come with the moments
            from ...engine.privacy.disclosure import effective

            fed = ctx.federation  # the rule the agents apply, for the server's noise slack
            ctx.model.disclosure = effective(fed.disclosure, fed.secure_aggregation)
            sizes: dict = {}
            params = start_params(ctx, self._chain(), self._standardizes(), self.fit_intercept,
                                  sizes)
            self._sizes = (int(sum(ctx.n_units.values())),
                           int(round(sizes.get("n_events", -1))))
            if "T" in params:  # standardized: a spread-out start costs no budget
                rng = np.random.default_rng(np.random.SeedSequence(ctx.seed,
                                                                   spawn_key=(0x5EED,)))
                params.update(spread_start(params, ctx.model.K, rng))
            thr = None if ctx.secure is None else ctx.secure.config.threshold
            params["dp_ridge"] = np.array(noise_ridge(
                ctx.model, params, fed.privacy, ctx.privacy.calibration.noise_multiplier,
                len(ctx.client_ids), thr))
            return params
        if ctx.secure is not None:
            self._sizes = secure_sizes(ctx, what)
            return start_params(ctx, self._chain(), self._standardizes(), self.fit_intercept)
        sizes = ctx.ask(SIZES_QUERY, expect={"n_entities": number(low=1),
                                             "n_events": number(low=1),
                                             "n_features": number(low=1)}, what=what)
        n_ent = n_ev = 0
        for c in ctx.client_ids:
            r = {k: float(sizes[c][k]) for k in ("n_entities", "n_events", "n_features")}
            problem = None
            if r["n_entities"] != ctx.n_units[c]:
                problem = (f"reported {r['n_entities']:g} entities, {ctx.n_units[c]} at setup")
            elif r["n_events"] < r["n_entities"]:
                problem = (f"reported {r['n_events']:g} events for {r['n_entities']:g} "
                           "entities (every entity has an event)")
            elif r["n_features"] != ctx.n_features:
                problem = (f"has {r['n_features']:g} features, the fit has {ctx.n_features}")
            if problem:
                raise FederatedFitError(f"{what}: client {c!r} {problem}; nothing of this "
                                        "exchange was used")
            n_ent += int(r["n_entities"])
            n_ev += r["n_events"]  # with frequency weights, a weight sum
        self._sizes = (n_ent, units_number(n_ev))
        params = start_params(ctx, self._chain(), self._standardizes(), self.fit_intercept)
        warm = self.__dict__.pop("_warm", None)  # n_clusters="auto": another candidate's end
        return params if warm is None else warm_start(params, warm, ctx.model.K)

    def _run(self, ctx: FitContext, params0: Params, options: LoopOptions) -> HLCRFit:
        """``n_clusters="auto"``: :func:`.selection.choose_k` first. ``"gibbs"``: the
        centralized sampler on ``ctx.data``; ``"federated"``: the engine's round loop, its
        runtime wrapped in the tap that records every round's parameters."""
        self._k_scores = None
        if self.n_clusters == "auto":
            if options.checkpoint is not None or options.resume:
                raise ValueError("n_clusters='auto' runs one fit per candidate K: checkpoints "
                                 "apply to a fit with a given n_clusters")
            ctx, params0, self._k_scores = choose_k(self, ctx, options, super()._run)
        chain = chain_for(self._chain(), params0)
        if self.solver == "gibbs":
            result = run_gibbs(self, ctx, options, params0, chain)
        else:
            result = run_federated(ctx, params0, options, super()._run, chain)
        finish_chain(self, ctx if ctx.privacy is None else replace(ctx, data=None), params0,
                     result, options.tol)
        self._fit_start = (params0, chain)
        self._extra_chains = extra_chains(self, ctx, params0, options, chain, super()._run,
                                          self._n_chains())
        self._final_params = {k: np.array(v, copy=True) for k, v in result.params.items()}
        return result

    def _store(self, result: HLCRFit, model: HLCRModel) -> None:
        store_fit(self, result, *self._fit_start)
        store_chains(self, result, *self._fit_start, self._extra_chains)

    def _set_cluster_params(self, D, c, counts) -> None:
        D = np.asarray(D, dtype=np.float64)
        self.precisions_ = D
        self.c_ = np.asarray(c, dtype=np.float64)
        self.covariances_ = np.linalg.inv(D)
        W = posterior_means(D, self.c_)
        F = self.n_features_in_
        self.coef_ = W[:, :F]
        self.intercept_ = W[:, F] if self.fit_intercept else np.zeros(len(W))
        self.cluster_counts_ = np.asarray(counts, dtype=np.float64)

    # ---- persistence ------------------------------------------------------------------------
    def save(self, path, *, signer=None) -> None:
        """As the base's; the history is written without its derived columns (``log_joint``,
        ``train_mse`` and ``pred_change`` are saved as arrays and added back at load)."""
        full = self.history_
        self.history_ = History(full)
        try:
            super().save(path, signer=signer)
        finally:
            self.history_ = full

    def _save_extra(self) -> dict:
        scores = getattr(self, "k_scores_", None)
        return {"sizes": {"n_entities_": int(self.n_entities_),
                          "n_events_": int(self.n_events_)},
                "fit": {"n_clusters_": int(self.n_clusters_), "sigma_": float(self.sigma_),
                        "delta_": float(self.delta_), "mixing_": float(self.mixing_),
                        "tau_": float(self.tau_),
                        "random_intercept_": float(self.random_intercept_),
                        "target_mean_": float(self.target_mean_),
                        "target_scale_": float(self.target_scale_)},
                "k_scores": None if scores is None else {str(k): float(v)
                                                         for k, v in scores.items()},
                "pred_change": [None if not np.isfinite(v) else float(v)
                                for v in np.asarray(self._pred_change, dtype=float)]}

    def _load_extra(self, meta: dict) -> None:
        for k, v in meta.get("sizes", {}).items():
            setattr(self, k, int(v))
        fit = meta.get("fit", {})
        for k, v in fit.items():
            setattr(self, k, int(v) if k == "n_clusters_" else float(v))
        if "random_intercept_" in fit:
            self.random_intercept_ = bool(fit["random_intercept_"])
        self._pred_change = np.array([np.nan if v is None else v
                                      for v in meta.get("pred_change", [])], dtype=float)
        scores = meta.get("k_scores")
        self.k_scores_ = None if scores is None else {int(k): float(v)
                                                      for k, v in scores.items()}

    def _check_loaded(self) -> None:
        from ...engine.protocol import loadcheck as lc

        K, F = int(self.n_clusters_), int(self.n_features_in_)
        p = F + bool(self.fit_intercept)
        T = len(np.asarray(self.draws_sigma_))
        for name, shape in (("coef_", (K, F)), ("intercept_", (K,)), ("precisions_", (K, p, p)),
                            ("covariances_", (K, p, p)), ("c_", (K, p)),
                            ("cluster_counts_", (K,)), ("labels_", self.pair_agents_.shape),
                            ("pair_entities_", self.pair_agents_.shape),
                            ("draws_precisions_", (T, K, p, p)), ("draws_c_", (T, K, p)),
                            ("draws_counts_", (T, K)),
                            ("draws_labels_", (T, *self.pair_agents_.shape)),
                            ("feature_mean_", (F,)), ("feature_scale_", (F,)),
                            ("random_effects_", self.pair_agents_.shape), ("draws_tau_", (T,)),
                            ("random_effects_var_", self.pair_agents_.shape)):
            lc.expect_shape(self, name, shape)
        lc.expect_pd(self, "precisions_")
        lc.expect_pd(self, "covariances_")
        lc.expect_positive(self, "cluster_counts_", strict=False)
        lc.expect_positive(self, "draws_sigma_")
        lc.expect_labels(self, "labels_", K, low=-1)  # -1: a label the server never saw

    def _after_load(self) -> None:
        self.labels_ = np.asarray(self.labels_, dtype=np.int64)
        self.draws_labels_ = np.asarray(self.draws_labels_, dtype=np.int64)
        self.pair_agents_ = np.asarray(self.pair_agents_).astype(str)
        self.pair_entities_ = np.asarray(self.pair_entities_).astype(str)
        self.history_ = HLCRHistory(self.history_, self)
        self._path = []
