"""The estimator base class: owns the federated fit (validate, initialize, run rounds, store).

Like scikit-learn's ``BaseMixture``: one class owns the loop and the single ConvergenceWarning;
each model fills in hooks. ``__init__`` only stores its arguments; validation happens in ``fit``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ..data.dataset import FederatedDataset
from ..engine.checkpoint import load_arrays_json, save_arrays_json
from ..engine.federation import Federation
from ..engine.history import History
from ..engine.inprocess import InProcessRuntime
from ..engine.loop import FitResult, run_federated_em, setup_clients
from ..engine.model import FederatedModel, Params
from ..engine.runtime import Runtime

__all__ = [
    "FederatedEstimator",
    "NotFittedError",
    "check_features",
    "check_is_fitted",
    "resolve_seed",
]


class NotFittedError(ValueError, AttributeError):
    """The estimator is used before ``fit``."""


def check_is_fitted(est, attr: str = "n_rounds_") -> None:
    if not hasattr(est, attr):
        raise NotFittedError(
            f"this {type(est).__name__} is not fitted yet; call fit(fd) before using it"
        )


def check_features(est, X, what: str | None = None) -> np.ndarray:
    """X as a finite float array of shape (n_samples, n_features_in_), or a clear error.

    A 1-D X is one sample. ``what`` names the estimator in the message (default: its class).
    """
    check_is_fitted(est)
    X = np.asarray(X, dtype=np.float64)
    if X.ndim == 1:
        X = X.reshape(1, -1)
    if X.ndim != 2 or X.shape[1] != est.n_features_in_:
        raise ValueError(
            f"X has {X.shape[-1] if X.ndim else 0} features, but this {what or type(est).__name__}"
            f" was fitted with {est.n_features_in_} ({est.feature_names_in_})"
        )
    if not np.all(np.isfinite(X)):
        raise ValueError("X contains NaN or infinite values")
    return X


def resolve_seed(random_state) -> int:
    """One integer seed from an int, a Generator or None (fresh entropy)."""
    if random_state is None:
        return int(np.random.SeedSequence().entropy % (2**63))
    if isinstance(random_state, np.random.Generator):
        return int(random_state.integers(0, 2**63 - 1))
    if isinstance(random_state, np.random.RandomState):
        return int(random_state.randint(0, 2**31 - 1))
    return int(random_state)


class FederatedEstimator:
    """Base of fedlatent estimators fitted by the federated round loop.

    Subclasses implement ``_validate_params``, ``_validate_data``, ``_make_model`` and
    ``_initialize(runtime, model, seed) -> params``, and ``_store(result)``.
    """

    _save_arrays: tuple[str, ...] = ()

    # ---- hooks ---------------------------------------------------------------------------------
    def _validate_params(self) -> None:  # pragma: no cover - overridden
        pass

    def _validate_data(self, fd: FederatedDataset) -> None:  # pragma: no cover - overridden
        pass

    def _make_model(self, fd: FederatedDataset) -> FederatedModel:  # pragma: no cover
        raise NotImplementedError

    def _initialize(self, runtime: Runtime, model: FederatedModel, seed: int) -> Params:
        raise NotImplementedError  # pragma: no cover

    def _store(self, result: FitResult, model: FederatedModel) -> None:  # pragma: no cover
        raise NotImplementedError

    def _describe_local(self, fd: FederatedDataset) -> dict:
        """Run on a node of a deployment, on its one-client ``fd``: the estimator's checks of
        that client's data; returns what the server needs beyond counts (JSON-able)."""
        self._validate_params()
        return {}

    # ---- the loop ------------------------------------------------------------------------------
    def _federation(self) -> Federation:
        fed = getattr(self, "federation", None)
        fed = Federation() if fed is None else fed
        if not isinstance(fed, Federation):
            raise ValueError(f"federation must be a fl.Federation, got {type(fed).__name__}")
        fed.validate()
        return fed

    def fit(
        self,
        fd: FederatedDataset,
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
        runtime : Runtime or None
            Transport to the clients; default: in-process clients built from ``fd``.
        checkpoint : path or None
            Write ``<path>.npz``/``<path>.json`` every ``checkpoint_every`` rounds.
        resume : bool
            Continue from ``checkpoint``; ends with exactly the uninterrupted run's parameters.
        progress : bool or None
            Progress bar; None shows it when stderr is a terminal.
        callbacks : list of callables or None
            ``cb(round, params, S_hat, record)`` after every round.
        """
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
        self._validate_data(fd)
        federation = self._federation()
        seed = resolve_seed(
            federation.random_state
            if federation.random_state is not None
            else getattr(self, "random_state", None)
        )
        model = self._make_model(fd)
        runtime = runtime if runtime is not None else InProcessRuntime(fd)
        n_units = setup_clients(runtime, model)
        params0 = self._initialize(runtime, model, seed)
        result = run_federated_em(
            model,
            runtime,
            federation,
            params0,
            seed=seed,
            max_rounds=int(getattr(self, "max_rounds", 100)),
            tol=float(getattr(self, "tol", 1e-3)),
            progress=progress if progress is not None else getattr(self, "verbose", None),
            checkpoint=checkpoint,
            checkpoint_every=checkpoint_every,
            resume=resume,
            description=type(self).__name__,
            callbacks=callbacks,
            n_units=n_units,
        )
        self.seed_ = seed
        self.history_ = result.history
        self.converged_ = result.converged
        self.n_rounds_ = result.n_rounds
        self.feature_names_in_ = list(fd.feature_names)
        self.n_features_in_ = fd.n_features
        self._store(result, model)
        return self

    # ---- persistence (no pickle) ---------------------------------------------------------------
    def get_params(self) -> dict[str, Any]:
        import inspect

        sig = inspect.signature(type(self).__init__)
        return {k: getattr(self, k) for k in sig.parameters if k != "self"}

    def save(self, path: str | Path) -> None:
        """Write ``<path>.npz`` (arrays) and ``<path>.json`` (settings, history). No pickle."""
        check_is_fitted(self)
        arrays = {name: np.asarray(getattr(self, name)) for name in self._save_arrays}
        params = {}
        for k, v in self.get_params().items():
            if k == "federation":
                params[k] = v.to_config() if v is not None else None
            elif isinstance(v, np.ndarray):
                continue
            else:
                try:
                    json.dumps(v)
                    params[k] = v
                except TypeError:
                    params[k] = repr(v)
        meta = {
            "class": type(self).__name__,
            "params": params,
            "fitted": {
                "n_rounds_": int(self.n_rounds_),
                "converged_": bool(self.converged_),
                "seed_": int(self.seed_),
                "feature_names_in_": list(self.feature_names_in_),
            },
            "history": self.history_.to_frame().to_dict(orient="records"),
        }
        save_arrays_json(path, arrays, meta)

    @classmethod
    def load(cls, path: str | Path):
        """Read what :meth:`save` wrote."""
        arrays, meta = load_arrays_json(path)
        if meta.get("class") != cls.__name__:
            raise ValueError(f"{path} holds a {meta.get('class')}, not a {cls.__name__}")
        params = dict(meta["params"])
        fed = params.pop("federation", None)
        est = cls(**{k: v for k, v in params.items() if k in cls._json_params()})
        if fed is not None:
            fed = dict(fed)
            if isinstance(fed.get("step_size"), str):  # a callable was recorded by its repr
                fed["step_size"] = 1.0
            est.federation = Federation.from_config(fed)
        for k, v in arrays.items():
            setattr(est, k, v)
        for k, v in meta["fitted"].items():
            setattr(est, k, v)
        est.n_features_in_ = len(est.feature_names_in_)
        est.history_ = History.from_records(meta["history"])
        est._after_load()
        return est

    @classmethod
    def _json_params(cls) -> set[str]:
        import inspect

        return {k for k in inspect.signature(cls.__init__).parameters if k != "self"}

    def _after_load(self) -> None:
        pass
