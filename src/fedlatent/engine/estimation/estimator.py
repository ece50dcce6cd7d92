"""The estimator base class: it owns ``fit`` (validate, set up, initialize, run, store) and
save/load; models supply hooks and never override ``fit``.

Like scikit-learn's ``BaseMixture``: one class owns the loop and the single ConvergenceWarning;
each model fills in hooks. ``__init__`` only stores its arguments; validation happens in ``fit``
from one declarative table (``_parameter_constraints``, :mod:`fedlatent.engine.contract.params`).

The contract (every hook, declared below with its docstring; the table in
``docs/architecture.md``). Declared data: ``_parameter_constraints``, ``_save_arrays``,
``_load_nonfinite``, ``_score_name``, ``capabilities`` (secure aggregation, differential
privacy), ``_dp_init_releases``, ``_multi_start``, ``_default_n_init``.

Hooks, in the order ``fit`` calls them (the first three and ``_store`` are abstract)::

    _check_params()                   cross-parameter checks (the table covers the rest)
    _validate_data(fd)                data-dependent checks, before any message is sent
    _make_model(fd) -> FederatedModel the model's math (rebuilt by name on every client)
    _initialize(ctx) -> params        initial parameters, asking the clients through ctx.ask
    _run(ctx, params0, options)       the fit itself; default: the FedEM round loop
    _store(result, model)             fitted attributes from the result

and ``_selection() -> Selection | None`` when a size parameter may be ``"auto"``: ``fit`` then
fits one copy per candidate and keeps the best (:mod:`fedlatent.engine.contract.selection`).

and for prediction on federated data ``_predict_client(client, data)`` (default:
``predict(data.X)``; :meth:`FederatedEstimator.predict_dataset` puts the clients' parts in the
user's order, a Series indexed by ``fd.row_index``) and ``score_dataset(fd)``.
"""

from __future__ import annotations

import logging
from abc import ABCMeta, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from sklearn.base import BaseEstimator

from fedlatent.data.dataset import DataValidationError, FederatedDataset
from fedlatent.engine.contract.model import NO_CAPABILITIES, Capabilities, FederatedModel, Params
from fedlatent.engine.contract.params import validate_params
from fedlatent.engine.contract.registry import params_to_json
from fedlatent.engine.contract.selection import Selection, fit_selected, load_selection
from fedlatent.engine.errors import NotFittedError
from fedlatent.engine.estimation.checks import check_features, check_is_fitted, refuse_missing
from fedlatent.engine.estimation.fitcontext import FitContext
from fedlatent.engine.estimation.prediction import DatasetPrediction
from fedlatent.engine.estimation.saved import apply_saved, load_checked, saved_settings
from fedlatent.engine.estimation.verified_info import keep_channel
from fedlatent.engine.fedem.checkpoint import save_arrays_json
from fedlatent.engine.fedem.federation import Federation
from fedlatent.engine.fedem.seeds import resolve_seed
from fedlatent.engine.protocol.runtime import Runtime
from fedlatent.engine.rounds.fitsetup import setup_fit
from fedlatent.engine.rounds.loop import (
    PRIVATE_MAX_ROUNDS,
    FitResult,
    LoopOptions,
    resolve_max_rounds,
    run_rounds,
)
from fedlatent.engine.rounds.stopping import loop_tol
from fedlatent.engine.transport.inprocess import InProcessRuntime

logger = logging.getLogger(__name__)

__all__ = [
    "FederatedEstimator",
    "FitContext",
    "NotFittedError",
    "check_features",
    "check_is_fitted",
    "resolve_seed",
]


class FederatedEstimator(DatasetPrediction, BaseEstimator, metaclass=ABCMeta):
    """Base of fedlatent estimators: a scikit-learn estimator fitted over a federation.

    Subclasses define ``__init__`` (storing their arguments), ``_parameter_constraints`` and
    the hooks listed in the module docstring. Prediction and scores on federated data come from
    :class:`~fedlatent.engine.estimation.prediction.DatasetPrediction` (no scikit-learn there).
    """

    # ---- declared data (class attributes) ------------------------------------------------------
    #: the constructor parameters' constraints (:mod:`fedlatent.engine.contract.params`)
    _parameter_constraints: ClassVar[dict[str, list]] = {}
    #: the fitted array attributes :meth:`save` writes and :meth:`load` requires, exactly
    _save_arrays: ClassVar[tuple[str, ...]] = ()
    #: saved arrays that may hold NaN (e.g. a history with unknown entries)
    _load_nonfinite: ClassVar[tuple[str, ...]] = ()
    #: what :meth:`score_dataset` returns, named (the command line prints ``<name>: value``)
    _score_name: ClassVar[str] = "score"
    #: what the estimator supports (secure aggregation, differential privacy), with the reason
    #: of each refusal; an estimator whose support depends on its settings makes this a property
    capabilities: ClassVar[Capabilities] = NO_CAPABILITIES
    #: Gaussian releases its initialization makes under differential privacy (queries); a
    #: property where it depends on the settings
    _dp_init_releases: ClassVar[int] = 0
    #: rounds a private fit plans when ``max_rounds`` is None: the rounds its private start
    #: needs to reach the non-private optimum (each one is a release paid from the budget)
    _private_max_rounds: ClassVar[int] = PRIVATE_MAX_ROUNDS
    #: whether ``n_init`` means "starts" (the whole fit once per start, :mod:`.starts`)
    _multi_start: ClassVar[bool] = False
    #: the number of starts ``n_init=None`` means, where ``_multi_start``
    _default_n_init: ClassVar[int] = 1

    # ---- hooks ---------------------------------------------------------------------------------
    def _check_params(self) -> None:
        """Cross-parameter checks (the declarative table covers single parameters)."""

    def _validate_data(self, fd: FederatedDataset) -> None:
        """Data-dependent checks, before any message is sent."""

    @abstractmethod
    def _make_model(self, fd: FederatedDataset) -> FederatedModel:
        """The model's math for a fit on ``fd`` (rebuilt by name on every client).

        Parameters
        ----------
        fd : FederatedDataset or RemoteDataset
            The data (or their description): its sizes and feature count, never its rows.

        Returns
        -------
        FederatedModel
        """

    @abstractmethod
    def _initialize(self, ctx: FitContext) -> Params:
        """The initial parameters, asking the clients through ``ctx.ask`` (or ``ctx.ask_sum``
        when ``ctx.summed_only``: under secure aggregation or differential privacy).

        Parameters
        ----------
        ctx : FitContext

        Returns
        -------
        dict of str to ndarray
            The parameters of the first round's broadcast.
        """

    def _explicit_init(self) -> bool:
        """Whether the start is given by the user (``*_init`` arrays): then ``n_init`` starts
        would be identical and one is run (:mod:`.starts`). Default False."""
        return False

    def _run(self, ctx: FitContext, params0: Params, options: LoopOptions) -> FitResult:
        """The fit proper; default: the FedEM round loop of the engine."""
        return run_rounds(ctx.model, ctx.runtime, ctx.federation, params0, options,
                          n_units=ctx.n_units, secure=ctx.secure, privacy=ctx.privacy)

    @abstractmethod
    def _store(self, result: FitResult, model: FederatedModel) -> None:
        """Set the fitted attributes (``weights_``...) from the fit's result.

        Parameters
        ----------
        result : FitResult
            The final parameters, statistics ``S_hat`` and history.
        model : FederatedModel
            The model of the fit (its ``privacy`` says whether the fit was private).
        """

    def _after_load(self) -> None:
        """Derived attributes, after ``_store`` or :meth:`load`."""

    def _n_parameters(self) -> int:
        """The number of free parameters of the fitted model (BIC, AIC, the size selection)."""
        raise NotImplementedError(f"{type(self).__name__} does not count its parameters")

    def _degenerate_reason(self, n_rows: int | None) -> str | None:
        """Why the fitted model is degenerate ("" when it is not), for the size selection
        (:func:`~.selection.skip_reason`: a degenerate or unconverged candidate is skipped).
        ``n_rows``: the rows it was fitted on (None when unknown). Default None: no test, the
        candidate is never skipped."""
        return None

    def _selection(self) -> Selection | None:
        """How an ``"auto"`` size parameter is chosen (:class:`~.selection.Selection`); None
        when there is nothing to choose (the default)."""
        return None

    def _check_loaded(self) -> None:
        """The model's invariants on the arrays :meth:`load` read (shapes for the saved
        settings, weights on the simplex, covariances positive definite...), with the checks of
        :mod:`fedlatent.engine.protocol.loadcheck`; raises ValueError naming the field."""

    def _describe_local(self, fd: FederatedDataset) -> dict:
        """Run on a node of a deployment, on its one-client ``fd``: the estimator's checks of
        that client's data; returns what the server needs beyond counts (JSON-able)."""
        self._validate_params()
        return {}

    # ---- validation ----------------------------------------------------------------------------
    def _validate_params(self) -> None:
        """Check the constructor parameters (declarative table, then ``_check_params``)."""
        validate_params(self.get_params(deep=False), self._parameter_constraints)
        fed = getattr(self, "federation", None)
        if fed is not None and not isinstance(fed, Federation):
            raise ValueError(f"federation must be a fl.Federation, got {type(fed).__name__}")
        self._check_params()

    def __sklearn_is_fitted__(self) -> bool:
        return hasattr(self, "n_iter_")

    def _max_rounds(self) -> int:
        """``max_rounds`` resolved: None (not given) is 100 rounds (1,000 with ``tol="auto"``:
        :data:`~fedlatent.engine.rounds.stopping.AUTO_MAX_ROUNDS`), or under
        ``Federation(privacy=...)`` the short private plan
        (the estimator's ``_private_max_rounds``, by default
        :data:`~fedlatent.engine.rounds.loop.PRIVATE_MAX_ROUNDS`)."""
        return resolve_max_rounds(getattr(self, "max_rounds", None),
                                  self._federation().privacy is not None,
                                  self._private_max_rounds, getattr(self, "tol", None))

    @property
    def n_rounds_(self) -> int:
        """Alias of ``n_iter_``: the number of rounds the fit ran."""
        check_is_fitted(self)
        return self.n_iter_

    # ---- the fit -------------------------------------------------------------------------------
    def _start(self, fd, runtime: Runtime | None, seed: int | None = None) -> FitContext:
        """Validate, build the model, set the clients up: the context the hooks share
        (``seed``: this start's, :mod:`.starts`; None: from ``random_state``)."""
        ctx = self._bare_context(fd, runtime, seed)
        federation, private = ctx.federation, ctx.federation.privacy is not None
        if private:
            self._refuse_private(ctx.data if ctx.data is not None else fd, federation)
        setup = setup_fit(ctx.runtime, ctx.model, federation, self._max_rounds(),
                          init_releases=int(self._dp_init_releases) if private else 0,
                          run=self._run_label(ctx.seed))
        ctx.n_units, ctx.secure, ctx.privacy = setup.n_units, setup.secure, setup.privacy
        ctx.runtime, ctx.excluded, ctx.adopted = setup.runtime, setup.excluded, setup.adopted
        if setup.excluded and ctx.data is not None:  # (the pooled references read it)
            ctx.data = ctx.data.subset(list(setup.n_units))
        return ctx

    def _bare_context(self, fd, runtime: Runtime | None, seed: int | None = None) -> FitContext:
        """Validate the settings and the data, build the model and the runtime: the context
        of a fit before any message is sent (:meth:`_start` then sets the clients up)."""
        self._validate_params()
        remote = getattr(fd, "is_remote", False)
        if not isinstance(fd, FederatedDataset) and not remote:
            raise TypeError(
                f"fit expects a fl.FederatedDataset, got {type(fd).__name__}; build one with "
                "FederatedDataset.from_pandas or from_arrays"
            )
        if remote and runtime is None:
            raise ValueError(
                "a RemoteDataset has no rows: fit it with the runtime its description came from"
            )
        federation = self._federation()
        if federation.secure_aggregation:
            from fedlatent.engine.secagg.secure import refuse_unsupported

            refuse_unsupported(self)
        if not getattr(self.capabilities, "missing_values", False):
            refuse_missing(fd, remote)  # NaN: today's error, for models that cannot take them
        fd, dropped = self._rows_with_target(fd, remote)
        self._validate_data(fd)
        from fedlatent.engine.protocol.bounds import (
            check_memory,  # refused before any message: the size and the fix
        )

        check_memory(self, int(fd.n_features))
        seed = seed if seed is not None else resolve_seed(
            federation.random_state
            if federation.random_state is not None
            else getattr(self, "random_state", None)
        )
        model = self._make_model(fd)
        if dropped:  # the clients leave those rows out (fit_data): one client at a time
            model.batched_step = False
        model.privacy = federation.privacy  # the server's copy: its M-step knows the noise
        given = runtime is not None
        runtime = runtime if given else InProcessRuntime(fd)
        return FitContext(runtime, model, federation, seed, n_features=int(fd.n_features),
                          data=None if remote else fd, runtime_given=given)

    def _rows_with_target(self, fd, remote: bool):
        """``(fd, rows left out)``: rows with a NaN target are refused (today's error) unless
        the estimator declares ``capabilities.missing_target``; then they are left out of the
        fit, counted in ``n_missing_target_`` and logged."""
        if remote:
            per = {c: int(e.get("missing_target", 0)) for c, e in fd.extras.items()}
            n = sum(per.values())
            if n and not getattr(self.capabilities, "missing_target", False):
                c = next(c for c, k in per.items() if k)
                raise DataValidationError(f"client {c!r}: target has {per[c]} NaN values; drop "
                                          "those rows before fitting")
        else:
            n = sum(fd.missing_target_counts().values())
            if n and not getattr(self.capabilities, "missing_target", False):
                fd.refuse_missing_target()
            fd = fd.with_target() if n else fd
        self.n_missing_target_ = int(n)
        if n:
            logger.info("%s: %d rows with a missing target are left out of the fit",
                        type(self).__name__, n)
        return fd, int(n)

    def _run_label(self, seed: int) -> str:
        """The fit's label for the sites' ledgers: the estimator, its settings and the seed (a
        resumed fit has the same one, so a site continues its plan, never a new one)."""
        import hashlib
        import json

        text = json.dumps([type(self).__name__, int(seed),
                           params_to_json(self.get_params(deep=False), strict=False)],
                          sort_keys=True, default=str)
        return f"{type(self).__name__}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"

    def _refuse_private(self, fd, federation) -> None:
        """ValueError unless this estimator can be fitted under ``federation.privacy``."""
        name = type(self).__name__
        caps = self.capabilities
        if not caps.differential_privacy:
            raise ValueError(f"{name} refuses Federation(privacy=DifferentialPrivacy(...)): "
                             f"{caps.privacy_refusal}; fit it with privacy=None")
        if self._selection() is not None:
            self._refuse_private_selection()
        federation.privacy.center_for(fd.n_features)  # one centre per feature

    def _refuse_private_selection(self) -> None:
        raise ValueError(f"{type(self).__name__}: a size 'auto' is chosen by held-out scores "
                         "outside the privacy budget; give the size under differential privacy")

    def initial_parameters(self, fd, *, runtime: Runtime | None = None) -> Params:
        """The parameters a fit on ``fd`` would start from (its initialization exchanges run,
        no round does); for studies that compare with a centralized fit from the same start."""
        return self._initialize(self._start(fd, runtime))

    def fit(
        self,
        fd: FederatedDataset,
        y=None,
        *,
        runtime: Runtime | None = None,
        checkpoint: str | Path | None = None,
        checkpoint_every: int = 10,
        resume: bool = False,
        progress: bool | None = None,
        callbacks: list | None = None,
    ):
        """Fit on a federated dataset; raw samples stay in the client objects.

        Parameters
        ----------
        fd : FederatedDataset or RemoteDataset
            The data, or (in a deployment) the clients' description of theirs.
        y : None
            Ignored (the target, if any, is a column of ``fd``); scikit-learn's signature.
        runtime : Runtime or None
            Transport to the clients; default: in-process clients built from ``fd``.
        checkpoint : path or None
            Write one file, ``<path>.npz`` (replaced atomically), every ``checkpoint_every``
            rounds, at the end and when a fault stops the run.
        resume : bool
            Continue from ``checkpoint``; ends with exactly the uninterrupted run's parameters.
            A checkpoint of another run (model, settings, seed, federation, clients, their
            units, data or states) is refused with a ValueError saying what differs.
        progress : bool or None
            Progress bar; None: the estimator's ``verbose``, else shown when stderr is a terminal.
        callbacks : list of callables or None
            ``cb(round, params, S_hat, record)`` after every round.
        """
        self._validate_params()
        selection = self._selection()
        if selection is not None and self._federation().privacy is not None:
            self._refuse_private_selection()
        if selection is not None and self._federation().secure_aggregation:
            from fedlatent.engine.secagg.secure import refuse_unsupported

            refuse_unsupported(self)  # before any exchange: 'auto' scores cross in the clear
        if selection is not None:
            return self._fit_auto(fd, selection, runtime=runtime, progress=progress,
                                  callbacks=callbacks, checkpoint=checkpoint, resume=resume)
        run = dict(progress=progress if progress is not None else getattr(self, "verbose", None),
                   checkpoint=checkpoint, checkpoint_every=checkpoint_every, resume=resume,
                   callbacks=callbacks)
        from fedlatent.engine.contract.starts import fit_starts, n_starts

        if n_starts(self, run) > 1:
            ctx, result = fit_starts(self, fd, runtime, run)
        else:
            ctx, result = self._fit_one_start(fd, runtime, None, run)
            for stale in ("init_scores_", "best_start_"):  # of an earlier multi-start fit
                self.__dict__.pop(stale, None)
        self._store_fit(fd, ctx, result)
        return self

    def _store_fit(self, fd, ctx: FitContext, result: FitResult) -> None:
        """The fitted attributes every estimator shares, then the model's own (``_store``)."""
        self.seed_ = ctx.seed
        self.history_ = result.history
        self.converged_ = result.converged
        self.n_iter_ = result.n_rounds
        self.client_faults_ = list(ctx.faults)
        #: the sites left out of the fit at its setup (they refused it by a disclosure rule
        #: or their own policy, ``Federation(on_refusal="exclude")``), with the refusal
        self.excluded_clients_ = dict(ctx.excluded)
        result.history.excluded = dict(ctx.excluded)
        result.history.adopted = dict(ctx.adopted)
        #: ``(epsilon, delta)`` spent by the fit under differential privacy (initialization
        #: included; never above the budget), None without it
        self.privacy_spent_ = None if ctx.privacy is None else tuple(ctx.privacy.spent)
        #: the noise fixed before the first release (Calibration: noise_multiplier, releases
        #: planned, accountant), None without differential privacy
        self.privacy_calibration_ = None if ctx.privacy is None else ctx.privacy.calibration
        self.feature_names_in_ = np.asarray(list(fd.feature_names), dtype=object)
        self.n_features_in_ = fd.n_features
        #: the categorical encoding of the features (FederatedDataset.from_pandas(...,
        #: categorical=est.encoding_) encodes new data the same way), None without one
        self.encoding_ = getattr(fd, "encoding", None)
        self._runtime = ctx.runtime
        keep_channel(self, ctx)  # a verified fit's: its information pass verified too
        self._store(result, ctx.model)

    def _fit_one_start(self, fd, runtime, seed: int | None,
                       run: dict) -> tuple[FitContext, FitResult]:
        """One start: set up (``seed``; None: from ``random_state``), initialize, run the rounds
        (``run``: the LoopOptions of ``fit``'s arguments)."""
        ctx = self._start(fd, runtime, seed)
        params0 = self._private_resume_start(ctx, run)
        if params0 is None:
            params0 = self._initialize(ctx)
        options = LoopOptions(seed=ctx.seed, max_rounds=self._max_rounds(),
                              tol=loop_tol(getattr(self, "tol", 1e-3)),
                              description=type(self).__name__, **run)
        return ctx, self._run(ctx, params0, options)

    def _private_resume_start(self, ctx: FitContext, run: dict) -> Params | None:
        """A resumed private fit starts from its checkpoint's initial parameters: its private
        initialization is not run again (it would spend the budget twice, and its fresh noise
        would not give the checkpoint's start). None when not resuming a private fit."""
        path = run.get("checkpoint")
        if not run.get("resume") or ctx.privacy is None or path is None:
            return None
        from fedlatent.engine.fedem.checkpoint import _read_checkpoint_file

        npz = Path(path).with_name(Path(path).name + ".npz")
        if not npz.exists():
            return None  # the loop says there is nothing to resume from
        arrays, _ = _read_checkpoint_file(npz)
        params0 = {k[len("params0/"):]: v for k, v in arrays.items() if k.startswith("params0/")}
        if not params0:
            return None
        ctx.privacy.spend(int(self._dp_init_releases))  # spent by the interrupted fit
        import logging

        logging.getLogger(__name__).info(
            "%s: resumed from %s without re-running the private initialization",
            type(self).__name__, npz)
        return params0

    def _fit_auto(self, fd, selection: Selection, *, runtime, **fit_kwargs):
        """``fit`` with an ``"auto"`` parameter: the candidates compared on the same sites,
        the choice fitted on every site that admits it (:mod:`.sites`), through
        :meth:`_fit_selected`."""
        from fedlatent.engine.estimation.sites import finish_selection, selection_sites

        data, rt, selection, sites = selection_sites(self, fd, runtime, selection)
        self._fit_selected(data, selection, runtime=rt, **fit_kwargs)
        return finish_selection(self, fd, runtime, sites, selection.param,
                                {k: fit_kwargs[k] for k in ("progress", "callbacks")})

    def _fit_selected(self, fd, selection: Selection, **fit_kwargs):
        """``fit`` with an ``"auto"`` parameter (:func:`.selection.fit_selected`)."""
        return fit_selected(self, fd, selection, **fit_kwargs)

    # ---- prediction on federated data ----------------------------------------------------------
    def _fitted_params(self) -> Params:
        """The fitted parameters in the model's own form (what a client's queries take, as
        ``params/<name>``). Required for :meth:`_federated_loglik`, ``score`` on federated
        data, multi-start comparison and the size selection; the default refuses.

        Returns
        -------
        dict of str to ndarray
        """
        raise NotImplementedError(f"{type(self).__name__} does not send its fitted parameters")

    def score_dataset(self, fd: FederatedDataset) -> float:
        """The estimator's score on federated data (``_score_name`` names it)."""
        raise NotImplementedError(f"{type(self).__name__} has no score on federated data")

    def fit_predict(self, fd: FederatedDataset, y=None, **fit_params):
        """``fit(fd)`` then :meth:`predict_dataset` on the same data (a Series indexed by
        ``fd.row_index``)."""
        return self.fit(fd, **fit_params).predict_dataset(fd)

    # ---- persistence (no pickle) ---------------------------------------------------------------
    def save(self, path: str | Path, *, signer=None) -> None:
        """Write ``<path>.npz`` (arrays), then ``<path>.json`` (settings, history, the .npz's
        sha256), each atomically: an interrupted save leaves a pair that :meth:`load` refuses,
        never one it reads wrongly. No pickle. With ``signer`` (a
        :class:`~fedlatent.engine.site.keys.SiteIdentity` with a signing key and a site id),
        the JSON also records that site's Ed25519 signature of the pair, which
        ``load(path, trust=roster)`` verifies."""
        check_is_fitted(self)
        arrays = {name: np.asarray(getattr(self, name)) for name in self._save_arrays}
        meta = {
            "class": type(self).__name__,
            "params": params_to_json(self.get_params(deep=False), strict=False),
            "fitted": {
                "n_iter_": int(self.n_iter_),
                "converged_": bool(self.converged_),
                "seed_": int(self.seed_),
                "feature_names_in_": [str(f) for f in self.feature_names_in_],
            },
            "history": self.history_.to_frame().to_dict(orient="records"),
        }
        if getattr(self, "excluded_clients_", None):
            meta["excluded"] = {str(k): str(v) for k, v in self.excluded_clients_.items()}
        if getattr(self, "encoding_", None) is not None:
            meta["encoding"] = self.encoding_.to_json()
        if getattr(self, "privacy_calibration_", None) is not None:
            meta["privacy"] = {"spent": [float(v) for v in self.privacy_spent_],
                               "calibration": self.privacy_calibration_.to_dict()}
        table = getattr(self, "selection_scores_", None)
        if table is not None:  # an "auto" size: the choice and every candidate's scores
            param = str(table.index.name)
            meta["selection"] = {"param": param, "value": int(getattr(self, f"{param}_")),
                                 "scores": table.reset_index().to_dict(orient="records")}
        meta.update(self._save_extra())
        save_arrays_json(path, arrays, meta, signer=signer)

    def _save_extra(self) -> dict[str, Any]:
        """More JSON for :meth:`save` (read back by ``_load_extra``)."""
        return {}

    def _load_extra(self, meta: dict[str, Any]) -> None:
        """Read back what ``_save_extra`` wrote into the saved JSON ``meta`` (default:
        nothing)."""

    @classmethod
    def _from_saved(cls, arrays: dict[str, np.ndarray], meta: dict[str, Any]):
        """The estimator of a saved model's (checked) arrays and JSON, before its hook."""
        params, fed = saved_settings(meta)
        names = cls._get_param_names()
        est = cls(**{k: v for k, v in params.items() if k in names})
        if fed is not None:
            est.federation = fed
        apply_saved(est, arrays, meta)
        return est

    def _load_selection(self, doc: dict[str, Any]) -> None:
        """``<param>_`` and ``selection_scores_`` of a saved ``"auto"`` fit (checked)."""
        load_selection(self, doc)

    @classmethod
    def load(cls, path: str | Path, *, trust=None):
        """Read what :meth:`save` wrote, refusing (ValueError naming the file and the field) a
        pair whose .npz does not match the sha256 its .json records, arrays other than the
        saved ones, non-finite values and anything breaking the model's invariants
        (``_check_loaded``). No pickle. With ``trust`` (a pinned
        :class:`~fedlatent.engine.site.keys.Roster`), an unsigned pair, or one not signed by
        a rostered site, or edited since it was signed, is refused; without it the signature
        is not checked (files saved before signatures load as before)."""
        return load_checked(cls, path, trust)
