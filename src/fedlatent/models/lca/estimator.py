"""Latent class analysis fitted by federated EM (the model of R's poLCA).

Each row holds ``J`` categorical variables coded ``0 .. R_j - 1``; given its latent class the
variables are independent. Clients send, per class, the sum of the responsibilities and the
responsibility-weighted counts of each category (:mod:`.model`); the server's M-step divides.
The start is the engine's random-membership start (poLCA starts from random probabilities;
random memberships give the same kind of start from sums only, so it runs under secure
aggregation and differential privacy). With full participation and step 1 the iterates are
centralized EM's.

References
----------
Linzer and Lewis, "poLCA: An R Package for Polytomous Variable Latent Class Analysis", Journal
of Statistical Software 42(10), 2011.
"""

from __future__ import annotations

import numpy as np

from ...data.dataset import FederatedDataset
from ...engine.contract.model import Capabilities, Params
from ...engine.contract.params import ROUND_LOOP, Instance, Integer, Options, Real, store_params
from ...engine.contract.registry import register_estimator
from ...engine.estimation.base_mixture import FederatedMixture
from ...engine.estimation.estimator import FitContext, check_features
from ...engine.estimation.inference import InferenceMixin
from ...engine.rounds.loop import FitResult
from ..concomitant import concomitant_log_prior, load_concomitant, save_concomitant
from .math import TINY, lca_log_prob, n_free_parameters, offsets, one_hot
from .model import LCAModel, code_problem, lca_start

__all__ = ["LatentClassAnalysis"]


@register_estimator("lca", description="Latent class analysis (poLCA): a mixture of "
                    "independent categorical variables")
class LatentClassAnalysis(InferenceMixin, FederatedMixture):
    """Latent class analysis fitted by federated EM; raw rows never leave the clients.

    Parameters
    ----------
    n_components : int, default 2
        The number of latent classes.
    n_categories : int, list of int or None, default None
        Categories of each variable (one number: every variable). None: each client's largest
        code per column, plus one (read where the data are, like their feature names); give it
        under secure aggregation or differential privacy, where nothing but sums may cross.
    max_rounds : int or None, default None
        Rounds at most; None: 1,000 (100 with a numeric ``tol``), or the short private plan
        under ``Federation(privacy=...)``.
    tol : float or "auto", default "auto"
        "auto": stop once every parameter is within 0.1 standard error of the optimum (the
        summed log-likelihood within 0.005 nats of its limit, by Aitken's estimate from the
        last rounds: :mod:`fedlatent.engine.rounds.stopping`). A number: stop when the mean
        per-row log-likelihood changes by less than ``tol`` (scikit-learn's rule; poLCA's
        tolerance is 1e-10 on the summed one).
    n_init : int, default 1
        Starts (the whole fit once per start; the best final log-likelihood is kept).
    federation : fl.Federation or None
    random_state : int or None
    verbose : bool or None
    concomitant : list of str or None, default None
        Columns the class weights depend on (poLCA's covariates: a multinomial logit with an
        intercept, one Newton step a round from the clients' gradient and Hessian sums at the
        broadcast coefficients, :mod:`fedlatent.models.concomitant`); the other columns are
        the variables. Such a fit takes every client each round, step 1 and full passes, and
        no differential privacy (refused, naming the setting).

    Attributes
    ----------
    weights_ : ndarray (K,)
        Class shares.
    probabilities_ : ndarray (K, sum R_j)
        Per class, the probability of each category of each variable, variable after variable
        (``n_categories_`` says where each starts).
    n_categories_ : ndarray (J,)
    lower_bound_ : float
        Mean per-row log-likelihood at the last round's broadcast parameters.
    concomitant_coef_, concomitant_intercept_ : ndarray (K, c), (K,) or None
        With concomitant variables: each class's logit coefficients and intercept (class 0,
        the reference, zeros); ``weights_`` is then the mean class share of the fit's rows.

    Standard errors (``summary()``, ``bse_``, ``cov_params()``) come from Louis' observed
    information, one exchange (refused when a probability is 0: a boundary estimate).

    Examples
    --------
    >>> import numpy as np, fedlatent as fl
    >>> rng = np.random.default_rng(0)
    >>> fd = fl.FederatedDataset.from_arrays(
    ...     {c: rng.integers(0, 3, size=(60, 4)).astype(float) for c in range(3)})
    >>> lca = fl.LatentClassAnalysis(2, random_state=0, max_rounds=5).fit(fd)
    >>> lca.probabilities_.shape
    (2, 12)
    """

    _save_arrays = ("weights_", "probabilities_", "n_categories_")
    _parameter_constraints = {
        **ROUND_LOOP,
        "max_rounds": [None, Integer(1)],
        "tol": [Real(0), Options("auto")],
        "n_components": LCAModel.config_constraints["n_components"],  # (a node's check too)
        "n_categories": [None, Integer(1), "array-like"],
        "n_init": [Integer(1)],
        "concomitant": [None, Instance(list, tuple, desc="a list of column names")],
    }

    capabilities = Capabilities(secure_aggregation=True, differential_privacy=True,
                                missing_values=True)  # a missing answer drops out (poLCA)

    def _refuse_private(self, fd, federation) -> None:
        """With concomitant variables the logit's Newton statistics have no per-record bound
        yet: refused with the reason."""
        if self.concomitant:
            raise ValueError(f"{type(self).__name__} refuses Federation(privacy="
                             "DifferentialPrivacy(...)): the concomitant logit's Newton "
                             "statistics have no per-record bound implemented yet; fit it with "
                             "privacy=None, or without concomitant variables")
        super()._refuse_private(fd, federation)

    _multi_start = True
    _dp_init_releases = 1  # the random-membership sums

    def __init__(self, n_components: int = 2, *, n_categories=None,
                 max_rounds: int | None = None, tol: float | str = "auto", n_init: int = 1,
                 federation=None, random_state=None, verbose: bool | None = None,
                 concomitant=None):
        store_params(self, locals())

    # ---- fit hooks ---------------------------------------------------------------------------
    def _check_params(self) -> None:
        fed = self._federation()
        if self.n_categories is None and (fed.secure_aggregation or fed.privacy is not None):
            raise ValueError("LatentClassAnalysis(n_categories=None) reads each client's "
                             "largest code, which is not a sum; under secure aggregation or "
                             "differential privacy give n_categories (the categories of each "
                             "variable)")

    def _columns(self, names) -> tuple[list[int], list[int]]:
        """Positions of the variables and of the concomitant columns among ``names``."""
        names = [str(f) for f in names]
        if isinstance(self.concomitant, str):
            raise ValueError(f"concomitant must be a list of column names, got the string "
                             f"{self.concomitant!r}; write concomitant=[{self.concomitant!r}]")
        conc = []
        for c in self.concomitant or ():
            if c not in names:
                raise ValueError(f"concomitant column {c!r} is not a feature of the data; "
                                 f"features: {names[:10]}")
            conc.append(names.index(c))
        return [j for j in range(len(names)) if j not in conc], conc

    def _categories(self, fd) -> list[int]:
        """The categories of each variable: ``n_categories``, or from each client's codes."""
        variables, _ = self._columns(fd.feature_names)
        J = len(variables)
        if self.n_categories is not None:
            cats = [int(r) for r in np.broadcast_to(np.atleast_1d(self.n_categories), (J,))] \
                if np.size(self.n_categories) in (1, J) else None
            if cats is None:
                raise ValueError(f"n_categories has {np.size(self.n_categories)} entries, the "
                                 f"data {J} variables (columns {list(fd.feature_names)})")
            return cats
        if not isinstance(fd, FederatedDataset):
            raise ValueError("a RemoteDataset does not show its codes: give n_categories")
        top = np.zeros(J)
        for _, cd in fd.items():
            if cd.n_samples:  # (a missing answer, NaN, counts as code 0 here)
                X = np.asarray(cd.X, dtype=np.float64)[:, variables]
                top = np.maximum(top, np.where(np.isnan(X), 0.0, X).max(axis=0))
        return [int(t) + 1 for t in top]

    def _validate_data(self, fd) -> None:
        if fd.n_samples < self.n_components:
            raise ValueError(f"the federation has {fd.n_samples} rows in all, fewer than "
                             f"n_components={self.n_components}")
        cats = self._categories(fd)
        variables, conc = self._columns(fd.feature_names)
        if isinstance(fd, FederatedDataset):
            names = [list(fd.feature_names)[j] for j in variables]
            for cid, cd in fd.items():
                reason = code_problem(cd.X[:, variables], cats,
                                      lambda j: f"column {names[j]!r}")
                if not reason and conc and np.isnan(cd.X[:, conc]).any():
                    reason = ("a concomitant column has missing values; drop those rows or "
                              "impute them")
                if reason:
                    raise ValueError(f"client {cid!r}: {reason}")

    def _make_model(self, fd) -> LCAModel:
        if fd is None:  # the fitted model's (standard errors on the clients of the fit)
            return self._make_model_fitted()
        missing = (any(bool(e.get("missing")) for e in fd.extras.values())
                   if getattr(fd, "is_remote", False) else fd.has_missing)
        return LCAModel(self.n_components, self._categories(fd), missing,
                        self._columns(fd.feature_names)[1])

    def _initialize(self, ctx: FitContext) -> Params:
        """The random-membership start (the engine's), then one M-step on its sums: the
        model's :func:`~fedlatent.models.lca.model.lca_start`, which a verifying site runs
        too."""
        return lca_start(ctx.model, ctx)[0]

    def _store(self, result: FitResult, model: LCAModel) -> None:
        self.weights_ = np.asarray(result.params["weights"], dtype=np.float64)
        self.probabilities_ = np.asarray(result.params["probs"], dtype=np.float64)
        self.n_categories_ = np.asarray(model.n_categories, dtype=np.int64)
        self.lower_bound_ = result.history[-1].objective
        self.concomitant_coef_ = self.concomitant_intercept_ = None
        if "gamma" in result.params:
            g = np.vstack([np.zeros((1, model.n_concomitant)), result.params["gamma"]])
            self.concomitant_coef_, self.concomitant_intercept_ = g[:, :-1], g[:, -1]
        self._after_load()

    def _after_load(self) -> None:
        self.n_components_ = int(np.shape(self.weights_)[0])

    def _check_loaded(self) -> None:
        from ...engine.protocol import loadcheck as lc

        K, J = int(self.n_components), len(self._columns(self.feature_names_in_)[0])
        cats = lc.expect_shape(self, "n_categories_", (J,))
        lc.expect_labels(self, "n_categories_", np.iinfo(np.int64).max, low=1)
        lc.expect_shape(self, "weights_", (K,))
        lc.expect_simplex(self, "weights_")
        probs = lc.expect_shape(self, "probabilities_", (K, int(cats.sum())))
        lc.expect_positive(self, "probabilities_", strict=False)
        off = offsets(cats)
        for j in range(J):
            total = probs[:, off[j]:off[j + 1]].sum(axis=1)
            if np.any(np.abs(total - 1.0) > 1e-6):
                raise ValueError(f"field 'probabilities_' of variable {j} does not sum to 1 "
                                 f"(sum {total[0]:.12g}); they are probabilities")

    # ---- the mixture base's hooks -------------------------------------------------------------
    def _check_X(self, X) -> np.ndarray:
        X = check_features(self, X)
        variables, _ = self._columns(self.feature_names_in_)
        names = [str(self.feature_names_in_[j]) for j in variables]
        reason = code_problem(X[:, variables], self.n_categories_,
                              lambda j: f"column {names[j]!r}")
        if reason:
            raise ValueError(f"X: {reason}")
        return X

    def _estimate_weighted_log_prob(self, X) -> np.ndarray:
        """``log pi_k(z) + sum_j log P(x_j | k)`` for every row and class."""
        variables, conc = self._columns(self.feature_names_in_)
        Z = one_hot(X[:, variables], self.n_categories_)
        if not conc:
            return lca_log_prob(Z, self.weights_, self.probabilities_)
        p = self._fitted_params()
        Zt = np.column_stack([X[:, conc], np.ones(X.shape[0])])
        return (Z @ np.log(np.maximum(self.probabilities_, TINY)).T
                + concomitant_log_prior(Zt, p["gamma"]))

    def _n_parameters(self) -> int:
        c = len(self._columns(self.feature_names_in_)[1])
        K = self.n_components_
        return n_free_parameters(K, self.n_categories_) + ((K - 1) * c if c else 0)

    def _fitted_params(self) -> Params:
        out = {"weights": self.weights_, "probs": self.probabilities_}
        if getattr(self, "concomitant_coef_", None) is not None:
            out["gamma"] = np.column_stack([self.concomitant_coef_,
                                            self.concomitant_intercept_])[1:]
        return out

    def summary(self, alpha: float = 0.05):
        """A statsmodels-style table per class: estimate, std err (Louis' observed
        information, one exchange), z, P>|z| and the interval; point estimates alone when a
        probability is at 0 (a boundary estimate has no finite information)."""
        from sklearn.utils.validation import check_is_fitted

        check_is_fitted(self)
        if np.any(np.asarray(self.probabilities_) <= 0):
            self._no_se_reason = ("no SE: a category probability is 0 (a boundary estimate, "
                                  "no finite information)")
            return FederatedMixture.summary(self)
        return InferenceMixin.summary(self, alpha)

    def _inference_layout(self):
        from .inference import lca_layout

        variables, conc = self._columns(self.feature_names_in_)
        names = [str(f) for f in self.feature_names_in_]
        return lca_layout(self._make_model_fitted(), self._fitted_params(),
                          [names[j] for j in variables], [names[j] for j in conc])

    def _make_model_fitted(self) -> LCAModel:
        """The model's math for the fitted columns (the layout's counts)."""
        return LCAModel(self.n_components_, [int(r) for r in self.n_categories_], False,
                        self._columns(self.feature_names_in_)[1])

    def _save_extra(self) -> dict:
        return save_concomitant(self)

    def _load_extra(self, meta: dict) -> None:
        self.concomitant_coef_, self.concomitant_intercept_ = load_concomitant(
            meta, np.shape(self.weights_)[0], len(self._columns(self.feature_names_in_)[1]))

    def _federated_loglik(self, fd, runtime=None):
        """Scoring sends the fitted parameters; the model's codes come from the fit."""
        if not isinstance(fd, FederatedDataset) or self.n_categories is not None:
            return super()._federated_loglik(fd, runtime)
        saved, self.n_categories = self.n_categories, [int(r) for r in self.n_categories_]
        try:
            return super()._federated_loglik(fd, runtime)
        finally:
            self.n_categories = saved
