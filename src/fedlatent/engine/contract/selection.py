"""Choosing a model's size (``n_components="auto"``, ``n_clusters="auto"``) by a score.

An estimator whose size parameter may be ``"auto"`` returns a :class:`Selection` from its
``_selection()`` hook; the base estimator's ``fit`` then fits one copy per candidate value
(:func:`select`), keeps the best by the criterion, and takes over its fitted attributes, with
``<param>_`` (the chosen value) and ``selection_scores_`` (one row per candidate). The
estimator never overrides ``fit``.

Two ways to score a candidate:

- on the data it was fitted on, e.g. BIC (``split=None``): the Gaussian mixture and the latent
  class regression, ``score=lambda est, fd: {"bic": est.bic(fd), ...}``;
- on held-out data (``split=`` a function ``fd -> (fit_part, held_out)``, e.g. events held out
  per entity, or rows per client): each candidate is fitted on the first part and scored on
  the second, and the chosen value is then fitted again on all of ``fd``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from fedlatent.engine.contract.params import Integer

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["AUTO_SIZE", "Selection", "bic_selection", "check_candidates", "fit_selected",
           "load_selection", "select", "skip_reason"]


class _SizeOrAuto(Integer):
    """An integer >= 1 or ``"auto"``; its message stays the integer's ("n_components must be
    an integer >= 1, got 0"), as before "auto" existed."""

    def ok(self, value: Any) -> bool:
        return (isinstance(value, str) and value == "auto") or super().ok(value)


#: the ``_parameter_constraints`` entry of a size that may be "auto": ``[AUTO_SIZE]``
AUTO_SIZE = _SizeOrAuto(1)


@dataclass(frozen=True)
class Selection:
    """How an ``"auto"`` parameter is chosen.

    Attributes
    ----------
    param : str
        The constructor parameter, e.g. ``"n_components"``.
    candidates : tuple of int
        The values tried, in order (ties go to the first).
    criterion : str
        Name of the score (a column of ``selection_scores_``), e.g. ``"bic"``.
    score : callable
        ``score(fitted_candidate, fd) -> float`` or a dict holding ``criterion`` (its other
        entries become columns too); ``fd`` is the held-out part when ``split`` is given.
    lower_is_better : bool, default True
        BIC: lower is better; a held-out log-likelihood: higher (give False).
    split : callable or None
        ``split(fd) -> (fit_part, held_out)``; None scores on the data of the fit.
    refused : dict of int to str
        Candidates not fitted, and why (sites that the others admit refuse them by a
        disclosure rule or their own policy): reported as candidates that could not be
        fitted.
    """

    param: str
    candidates: tuple[int, ...]
    criterion: str
    score: Callable[[Any, Any], float | Mapping[str, float]]
    lower_is_better: bool = True
    split: Callable[[Any], tuple[Any, Any]] | None = None
    refused: Mapping[int, str] = field(default_factory=dict)


def check_candidates(values: Sequence[int] | None, default: Sequence[int], param: str,
                     name: str) -> tuple[int, ...]:
    """The candidate values as a tuple of distinct integers >= 1, or a ValueError naming
    ``name`` (the constructor parameter holding them) and the fix."""
    if values is None:
        return tuple(int(v) for v in default)
    try:
        vals = [v for v in values]
    except TypeError:
        raise ValueError(f"{name} must be a list of integers >= 1 (the {param} values to try), "
                         f"got {values!r}") from None
    bad = [v for v in vals if isinstance(v, bool) or not isinstance(v, int | np.integer)
           or v < 1]
    if not vals or bad:
        raise ValueError(f"{name} must be a non-empty list of integers >= 1 (the {param} "
                         f"values to try), got {values!r}")
    if len(set(vals)) != len(vals):
        raise ValueError(f"{name} lists a value twice: {values!r}; give each {param} once")
    return tuple(int(v) for v in vals)


def _bic(est, fd) -> dict[str, float]:
    """BIC of a fitted candidate from its federated log-likelihood (sums from the clients)."""
    tot, n = est._federated_loglik(fd)
    k = est._n_parameters()
    return {"bic": -2.0 * tot + k * np.log(n), "loglik": tot, "n_parameters": k}


def bic_selection(est, default: Sequence[int]) -> Selection | None:
    """The ``n_components="auto"`` selection by lowest BIC of a mixture estimator with
    ``n_components_candidates``, ``_federated_loglik`` and ``_n_parameters`` (None when
    ``n_components`` is a number)."""
    if est.n_components != "auto":
        return None
    return Selection("n_components", check_candidates(
        est.n_components_candidates, default, "n_components", "n_components_candidates"),
        "bic", _bic)


def select(est, fd, selection: Selection, fit: Callable[[Any, Any], Any]
           ) -> tuple[Any, pd.DataFrame]:
    """Fit a copy of ``est`` for every candidate and keep the best.

    Parameters
    ----------
    est : FederatedEstimator
        The estimator whose ``selection.param`` is ``"auto"`` (it is not modified).
    fd : FederatedDataset
    selection : Selection
    fit : callable
        ``fit(candidate, data) -> fitted candidate`` (the base estimator's fit with its
        runtime and progress settings).

    Returns
    -------
    best : the fitted candidate (fitted on all of ``fd``)
    table : DataFrame indexed by the candidate values (index name ``selection.param``) with
        the criterion, the other entries of the score, ``n_iter``, ``converged`` and
        ``error`` (why a candidate could not be fitted: its fit's ValueError, with a NaN
        criterion and a warning; when no candidate can be fitted, the first error is raised)
        and ``skipped`` (why a fitted candidate is not eligible, :func:`skip_reason`: not
        converged or a degenerate component; its scores are still reported).
    """
    import pandas as pd
    from sklearn.base import clone

    fit_part, held_out = selection.split(fd) if selection.split is not None else (fd, fd)
    rows, fitted, errors = [], {}, []
    for k in selection.candidates:
        cand = clone(est).set_params(**{selection.param: int(k)})
        try:
            _refused(selection, k)
            fit(cand, fit_part)
        except ValueError as err:  # e.g. more components than rows: this size cannot be fitted
            errors.append(err)
            rows.append({selection.criterion: np.nan, "n_iter": 0, "converged": False,
                         "error": str(err), "skipped": "could not be fitted"})
            continue
        rows.append(_scored(est, cand, selection, fit_part, held_out))
        fitted[int(k)] = cand
    if not fitted:  # the same problem for every size: say it once, as a single fit would
        raise errors[0]
    if errors:
        warnings.warn(f"{type(est).__name__}: {len(errors)} of {len(rows)} candidate "
                      f"{selection.param} values could not be fitted (see selection_scores_"
                      f"['error']); the first: {errors[0]}", UserWarning, stacklevel=4)
    table = pd.DataFrame(rows, index=pd.Index(list(selection.candidates), name=selection.param))
    crit = table[selection.criterion].to_numpy(dtype=np.float64)
    if not np.isfinite(crit).any():
        raise ValueError(f"no candidate {selection.param} has a finite {selection.criterion}: "
                         f"{dict(zip(selection.candidates, crit.tolist(), strict=True))}")
    crit = _eligible(table, crit, selection, type(est).__name__)
    best_k = selection.candidates[int(np.argmin(crit) if selection.lower_is_better
                                      else np.argmax(crit))]
    best = fitted[best_k]
    if selection.split is not None:  # the chosen size, fitted on every row
        best = clone(est).set_params(**{selection.param: int(best_k)})
        fit(best, fd)
    return best, table


def _refused(selection: Selection, k) -> None:
    """ValueError saying why candidate ``k`` is not fitted (:attr:`Selection.refused`)."""
    if int(k) in selection.refused:
        raise ValueError(selection.refused[int(k)])


def _scored(est, cand, selection: Selection, fit_part, held_out) -> dict[str, Any]:
    """The row of the fitted candidate ``cand`` in the selection table."""
    got = selection.score(cand, held_out)
    row = dict(got) if isinstance(got, Mapping) else {selection.criterion: float(got)}
    if selection.criterion not in row:
        raise KeyError(f"the score of {type(est).__name__} gave {sorted(row)}, not "
                       f"{selection.criterion!r}")
    row.update(n_iter=int(getattr(cand, "n_iter_", 0)),
               converged=bool(getattr(cand, "converged_", True)), error="",
               skipped=skip_reason(cand, getattr(fit_part, "n_samples", None)))
    return row


def skip_reason(cand, n_rows: int | None = None) -> str:
    """Why a fitted candidate must not be chosen ("" when it may), for estimators with a
    ``_degenerate_reason(n_rows)`` hook (the EM mixtures scored by BIC; others are never
    skipped): its fit did not converge, or the hook names a degenerate component (``n_rows``:
    the rows it was fitted on, None when unknown)."""
    reason = cand._degenerate_reason(n_rows)
    if reason is None:  # no degeneracy test: never skipped
        return ""
    if not bool(getattr(cand, "converged_", True)):
        return f"did not converge in {int(getattr(cand, 'n_iter_', 0))} rounds"
    return reason


def _eligible(table, crit: np.ndarray, selection: Selection, name: str) -> np.ndarray:
    """The criterion with the candidates that cannot be chosen set to the worst value: those
    with no finite score and those skipped (``table['skipped']``); when every finite one is
    skipped, the least bad of them is chosen with a UserWarning."""
    worst = np.inf if selection.lower_is_better else -np.inf
    finite = np.isfinite(crit)
    ok = finite & (table["skipped"].to_numpy() == "")
    if not ok.any():
        warnings.warn(f"{name}: every candidate {selection.param} was skipped (see "
                      "selection_scores_['skipped']: not converged or a degenerate component); "
                      f"the best {selection.criterion} among them is kept, but raise max_rounds "
                      "or give fewer candidates", UserWarning, stacklevel=5)
        ok = finite
    return np.where(ok, crit, worst)


def fit_selected(est, fd, selection: Selection, *, runtime, progress, callbacks, checkpoint,
                 resume):
    """The base estimator's ``fit`` when ``selection.param`` is ``"auto"``: one fit per
    candidate (:func:`select`); ``est`` takes the best one's fitted attributes, ``<param>_``
    (the chosen value) and ``selection_scores_`` (one row per candidate). Returns ``est``."""
    p = selection.param
    refuse_checkpoint(p, checkpoint, resume)
    if selection.split is not None and runtime is not None:
        raise ValueError(f"{p}='auto' scores on held-out rows, which needs the data in this "
                         f"process: fit without runtime=, or give {p} a number")

    def fit_one(candidate, data):
        return candidate.fit(data, runtime=runtime if data is fd else None,
                             progress=progress, callbacks=callbacks)

    best, table = select(est, fd, selection, fit_one)
    return adopt_candidate(est, best, p, table)


def refuse_checkpoint(param: str, checkpoint, resume) -> None:
    """``<param>='auto'`` runs one fit per candidate: refused with a checkpoint or a resume."""
    if checkpoint is not None or resume:
        raise ValueError(f"{param}='auto' runs one fit per candidate and a checkpoint holds "
                         f"one fit: choose {param} first (selection_scores_), then checkpoint "
                         "the fit with that value")


def adopt_candidate(est, best, param: str, table: pd.DataFrame):
    """``est`` takes the chosen candidate ``best``'s fitted attributes (not its parameters),
    ``<param>_`` (the chosen value) and ``selection_scores_``. Returns ``est``."""
    own = set(est.get_params(deep=False))
    for key, value in vars(best).items():
        if key not in own:
            setattr(est, key, value)
    setattr(est, f"{param}_", int(getattr(best, param)))
    est.selection_scores_ = table
    return est


def load_selection(est, doc: dict[str, Any]) -> None:
    """Set ``<param>_`` and ``selection_scores_`` of ``est`` from a saved model's
    ``selection`` entry; ValueError when it names no size parameter or lacks the chosen
    value's scores."""
    import pandas as pd

    param, value = doc.get("param"), doc.get("value")
    if param not in est._get_param_names() or isinstance(value, bool) or not isinstance(
            value, int):
        raise ValueError(f"entry 'selection' names {param!r} = {value!r}, not a size "
                         f"parameter of {type(est).__name__} and an integer")
    table = pd.DataFrame(doc.get("scores") or [])
    if param not in table.columns or value not in set(table[param]):
        raise ValueError(f"entry 'selection' has no scores for {param} = {value}")
    setattr(est, f"{param}_", value)
    est.selection_scores_ = table.set_index(param)
