"""Estimators by name, rebuilt from JSON: how a deployment's server and nodes agree on a model.

A Flower app carries the estimator as ``(name, parameters as JSON, federation as JSON)``; the
server rebuilds it to run the fit and every node rebuilds it to validate its own data with the
estimator's own checks. No code and no pickle cross.
"""

from __future__ import annotations

import inspect
import json
from typing import Any

__all__ = ["ESTIMATORS", "estimator_class", "estimator_config", "estimator_from_config"]

#: short name -> (module, class)
ESTIMATORS: dict[str, tuple[str, str]] = {
    "gmm": ("fedlatent.models.gmm", "FederatedGaussianMixture"),
    "fedgmm": ("fedlatent.models.fedgmm", "FedGMM"),
    "hlcr": ("fedlatent.models.hlcr", "HLCR"),
    "sec": ("fedlatent.models.sec", "SEC"),
}


def estimator_class(name: str):
    import importlib

    if name not in ESTIMATORS:
        raise ValueError(f"unknown estimator {name!r}; known: {sorted(ESTIMATORS)}")
    mod, cls = ESTIMATORS[name]
    return getattr(importlib.import_module(mod), cls)


def _init_params(est) -> dict[str, Any]:
    sig = inspect.signature(type(est).__init__)
    return {k: getattr(est, k) for k in sig.parameters if k not in ("self",)}


def estimator_config(est) -> tuple[str, dict[str, Any]]:
    """``(name, params)`` with JSON-able params; the federation goes under ``"federation"``.

    Raises ValueError naming a parameter that cannot be written as JSON (a Python object such as
    a scikit-learn regressor): a deployment rebuilds the estimator from its parameters.
    """
    name = next((n for n, (_, c) in ESTIMATORS.items() if type(est).__name__ == c), None)
    if name is None:
        raise ValueError(f"{type(est).__name__} cannot run in a deployment; known: "
                         f"{[c for _, c in ESTIMATORS.values()]}")
    params: dict[str, Any] = {}
    for k, v in _init_params(est).items():
        if k == "federation":
            params[k] = v.to_config() if v is not None else None
            if v is not None and callable(v.step_size):
                raise ValueError(
                    "Federation(step_size=callable) cannot travel to a deployment; give a number"
                )
            continue
        if hasattr(v, "tolist") and not isinstance(v, str):
            v = v.tolist()
        try:
            json.dumps(v)
        except TypeError:
            raise ValueError(
                f"{type(est).__name__}({k}=...) is a {type(v).__name__}, which cannot be "
                "written as JSON; a deployment rebuilds the estimator from JSON parameters: "
                "give it by name or as numbers"
            ) from None
        params[k] = v
    return name, params


def estimator_from_config(name: str, params: dict[str, Any]):
    """The estimator of :func:`estimator_config`'s output."""
    from ..engine.federation import Federation

    cls = estimator_class(name)
    params = dict(params)
    if "federation" in params:
        fed = params.pop("federation")
        params["federation"] = Federation.from_config(fed) if fed is not None else None
    return cls(**params)
