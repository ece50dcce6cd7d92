"""The learners' side of SEC: :class:`SECModel`, rebuilt by name on every client, answers the
``select`` and ``exchange`` queries; :func:`check_learner` is the check of one learner's data.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from ...data.dataset import ClientData, DataValidationError
from ...engine.contract.model import ClientStep, FederatedModel, Params, register_model
from ...engine.stats import Stats, units_number
from .candidates import _check_regressor, select_model, standardize_xy
from .disclosure import enforce_candidate, refuse_small_leaves
from .serialize import check_extra_types, dumps_model, loads_model, predict_many
from .signed import (
    charge_quota,
    charge_site_quota,
    check_site_policy,
    model_signature,
    verify_models,
)

__all__ = ["MIN_SAMPLES", "SECModel", "check_learner"]

MIN_SAMPLES = 4


def _payload_models(payload: Mapping[str, Any], prefix: str) -> list[np.ndarray]:
    keys = sorted((k for k in payload if k.startswith(prefix + "/")),
                  key=lambda k: int(k[len(prefix) + 1 :]))
    return [np.asarray(payload[k], dtype=np.uint8) for k in keys]


def check_learner(client: str, X: np.ndarray, y: np.ndarray | None, target: str = "y") -> None:
    """Raise DataValidationError if a learner cannot take part (no y, < 4 samples, constant y)."""
    if y is None:
        raise DataValidationError(
            f"client {client!r} has no target; SEC clusters regressions and needs y "
            "(build the dataset with target=...)"
        )
    n = X.shape[0]
    if n < MIN_SAMPLES:
        raise DataValidationError(
            f"client {client!r} has {n} samples; SEC needs at least {MIN_SAMPLES} per learner "
            "(half to fit and half to validate each candidate); merge it with another or drop it"
        )
    y = np.asarray(y, dtype=np.float64)
    if np.ptp(y) == 0:
        raise DataValidationError(
            f"client {client!r}: target {target!r} is constant (every value is {y[0]:g}); SEC "
            "compares regression fits and needs a varying response; drop this learner"
        )


def fold_se(d: np.ndarray, weight: np.ndarray, folds: np.ndarray) -> float:
    """The standard error of a cross-validated difference of errors from its folds (the
    one-standard-error rule of cross-validation: Hastie, Tibshirani and Friedman, The Elements
    of Statistical Learning, 2nd ed., section 7.10): each fold's weighted mean of ``d``, and
    their standard deviation over the folds divided by the square root of their number. The
    folds' means, not the rows', carry what the refits without each fold vary in.

    Parameters
    ----------
    d : ndarray of shape (m,)
        Each (row, fold) pair's difference of squared errors.
    weight : ndarray of shape (m,)
        The pair's weight (1 without frequency weights).
    folds : ndarray of int, shape (m,)
        The pair's fold.

    Returns
    -------
    float
    """
    tot = np.bincount(folds, weight)
    keep = tot > 0
    means = np.bincount(folds, weight * d)[keep] / tot[keep]
    if means.size < 2:
        return 0.0
    return float(means.std(ddof=1) / np.sqrt(means.size))


@register_model
class SECModel(FederatedModel):
    """The client half of SEC. Not an EM model: it answers two queries and nothing else.

    ``client_query("select", payload)``: the candidates arrive as skops bytes
    (``payload["candidate/<k>"]``) with their names (``payload["candidate_names"]``, JSON) and
    the kind of half split (``payload["split"]``, :func:`select_model`; "random" if absent);
    the learner runs :func:`select_model` on its (standardized) data, keeps the fitted model in
    its private state and replies ``model`` (skops bytes, uint8), ``e`` (in-sample MSE), ``n``,
    ``selected`` (index), ``cv_mse`` (validation MSE per candidate) and, when standardizing, its
    scaling constants ``x_mean``, ``x_scale`` (p-vectors), ``y_mean``, ``y_scale`` (so the
    server can express the model on the raw scale for prediction); without standardizing,
    ``y_scale`` alone (the target's standard deviation, for the server's scale warning).

    ``client_query("exchange", payload)``: other learners' fitted models arrive as
    ``payload["model/<k>"]``; the learner replies ``loss`` (one MSE per model on its own
    data). Only models and scalar losses cross; samples never do.

    Authenticated models (:mod:`.signed`): a learner whose site has a signing key signs the
    model it selects for the run (``payload["run"]``), replying ``signature``; a learner whose
    site pins a roster evaluates only models signed by rostered sites for the run
    (``payload["signer/<k>"]``, ``payload["signature/<k>"]``) and at most its quota of distinct
    models per run; anything else is refused before a model is built.

    SEC does not use the federated EM loop: ``client_stats`` returns empty statistics,
    ``stat_shapes`` is empty and ``server_step`` returns its parameters unchanged.

    Parameters
    ----------
    standardize : bool
        Standardize X and y within each learner before fitting and evaluating (Section 5).
    extra_trusted_types : list of str
        Estimator classes this learner loads besides :data:`~.serialize.TRUSTED_TYPES`
        (:func:`~.serialize.check_extra_types`); every received model is checked before it is
        built, and one naming any other type is refused.
    """

    name = "sec"

    def __init__(self, standardize: bool = True, extra_trusted_types: Any = ()):
        extra = list(check_extra_types(extra_trusted_types))
        super().__init__(standardize=bool(standardize), extra_trusted_types=extra)
        self.standardize = bool(standardize)
        self.extra_trusted_types = tuple(extra)

    def _xy(self, data: ClientData):
        X = np.asarray(data.X, dtype=np.float64)
        if data.y is None:
            raise ValueError("SEC needs a target y on every learner")
        y = np.asarray(data.y, dtype=np.float64).reshape(-1)
        if self.standardize:
            return standardize_xy(X, y, data.weight)
        return X, y, None, None, None, None

    # ---- EM hooks: unused ------------------------------------------------------------------
    def client_stats(self, params, data, state, rng, rows=None) -> ClientStep:
        """SEC has no sufficient statistics: an empty step (SEC does not run the EM loop)."""
        return ClientStep(Stats({}), int(data.n_samples), 0.0, dict(state))

    def stat_shapes(self, params: Params) -> dict[str, tuple[int, ...]]:
        return {}

    def evaluated_shapes(self, data: ClientData) -> dict[str, tuple[int, ...]]:
        """None: SEC runs no rounds, so a round's parameters are arrays it never evaluates."""
        return {}

    def reply_numbers(self, data: ClientData) -> int:
        """0: SEC runs no rounds (its step sends no statistic); what its queries send, fitted
        models and losses, is bounded by its own rules (the learners' disclosure checks)."""
        return 0

    def server_step(self, S: Stats, params: Params, n_total: float) -> Params:
        return dict(params)

    # ---- the protocol ----------------------------------------------------------------------
    def client_query(self, name, payload, data, state, rng):
        if name == "select":
            return self._select(payload, data, state, rng)
        if name == "exchange":
            return self._exchange(payload, data, state)
        if name == "validate":
            return self._validate(payload, data, state, rng)
        return super().client_query(name, payload, data, state, rng)

    def _select(self, payload, data, state, rng):
        check_learner("this learner", np.asarray(data.X), data.y)
        X, y, xm, xs, ym, ys = self._xy(data)
        names = json.loads(str(payload["candidate_names"]))
        blobs = _payload_models(payload, "candidate")
        check_site_policy(self.site, self.identity, blobs, exchange=False)
        if len(names) != len(blobs) or not blobs:
            raise ValueError(f"select: {len(blobs)} candidates for {len(names)} names")
        cands = []
        for nm, b in zip(names, blobs):
            est = loads_model(b, source=f"candidate {nm!r} sent by the server",
                              extra_types=self.extra_trusted_types)
            _check_regressor(nm, est)
            cands.append((nm, enforce_candidate(self.disclosure, nm, est)))
        best, model, e, cv = select_model(X, y, cands, rng,
                                          split=str(payload.get("split", "random")),
                                          sample_weight=data.weight)
        refuse_small_leaves(self.disclosure, names[best], model)
        blob = dumps_model(model)
        reply: dict[str, Any] = {
            "model": blob,
            "e": float(e),
            "n": units_number(data.mass()),  # rows, or their weights' sum
            "selected": int(best),
            "cv_mse": np.asarray(cv, dtype=np.float64),
        }
        sig = model_signature(self.identity, blob, str(payload.get("run", "")))
        if sig is not None:  # the site's signature: peers with a roster evaluate only these
            reply["signature"] = sig
        if self.standardize:
            reply.update(x_mean=xm, x_scale=xs, y_mean=float(ym), y_scale=float(ys))
        else:  # the server warns when the learners' scales are orders of magnitude apart
            reply.update(y_scale=float(np.std(y)))
        new_state = dict(state)
        new_state["model"] = blob
        new_state["e"] = np.array(e)
        return reply, new_state

    def _received(self, payload, state):
        """The models of a message, checked (site policy, signatures, quota) and loaded, and
        the learner's state after the quota's count."""
        off = int(payload.get("offset", 0))
        blobs = _payload_models(payload, "model")
        # a site with a roster evaluates only rostered sites' models, within its quota (and,
        # under a site policy, only of trusted types, counted on the site's ledger)
        check_site_policy(self.site, self.identity, blobs, exchange=True)
        verify_models(self.identity, payload, blobs, off, site=self.site)
        if self.site is not None:  # counted on the site's ledger, for the run it set up
            charge_site_quota(self.site, self.identity, payload, blobs)
        else:
            state = charge_quota(self.identity, state, blobs, str(payload.get("run", "")))
        models = [loads_model(b, source=f"model {off + k} of the exchange (sent by the server)",
                              extra_types=self.extra_trusted_types)
                  for k, b in enumerate(blobs)]
        return models, state

    def _exchange(self, payload, data, state):
        X, y, *_ = self._xy(data)
        models, state = self._received(payload, state)
        P = predict_many(models, X)
        r2 = (y[None, :] - P) ** 2
        loss = r2.mean(axis=1) if data.weight is None else r2 @ data.weight / data.weight.sum()
        return {"loss": loss}, state

    def _validate(self, payload, data, state, rng):
        """Step 4 (collaborate only where it helps): on its own rows, out of fold, the learner
        compares its own selected model (refitted without each fold) with its cluster's
        prediction (eq. 4: the other members' models, ``model/<k>``, which never saw its
        rows, and that refit, weighted by ``weights``, the members' sizes then its own).
        Replies both mean squared errors and the standard error of their difference over the
        folds (:func:`fold_se`)."""
        from .candidates import out_of_fold

        X, y, *_ = self._xy(data)
        models, state = self._received(payload, state)
        own = loads_model(np.asarray(state["model"], dtype=np.uint8), source="the own model",
                          extra_types=self.extra_trusted_types)
        rows, pred_own, tw, folds = out_of_fold(own, X, y, str(payload.get("split", "random")),
                                                rng, data.weight)
        w = np.asarray(payload["weights"], dtype=np.float64)
        if w.size != len(models) + 1 or np.any(w < 0) or w.sum() <= 0:
            raise ValueError(f"validate: {w.size} weights for {len(models)} models and the own")
        P = (np.vstack([predict_many(models, X)[:, rows], pred_own[None]]) if models
             else pred_own[None])
        pred_cluster = (w / w.sum()) @ P
        y = y[rows]  # (row, fold) pairs: each row once without frequency weights
        r_own, r_cluster = (y - pred_own) ** 2, (y - pred_cluster) ** 2
        return {"mse_alone": float(r_own @ tw / tw.sum()),
                "mse_cluster": float(r_cluster @ tw / tw.sum()),
                "se_difference": fold_se(r_cluster - r_own, tw, folds),
                "n_validation": float(X.shape[0])}, state
