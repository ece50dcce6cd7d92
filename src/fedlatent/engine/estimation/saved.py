"""Reading a saved model: the checks every load makes, and a saved model read for prediction and
scores alone, without its estimator class.

:func:`load_checked` is :meth:`FederatedEstimator.load
<fedlatent.engine.estimation.estimator.FederatedEstimator.load>`'s path: the .npz's sha256 and
signature (:func:`~fedlatent.engine.fedem.checkpoint.load_arrays_json`), the arrays and fitted
fields (:func:`~fedlatent.engine.protocol.loadcheck.check_saved`), then the class's own
``_from_saved``, ``_check_loaded`` and ``_after_load``. :class:`SavedModel` takes the same path
without scikit-learn: a model's package may define, beside its estimator, a class of the same
name built on it and on the estimator's prediction hooks (for the Gaussian mixture,
``fedlatent.models.gmm.saved``), registered with
:func:`~fedlatent.engine.contract.registry.register_reader`; ``fedlatent predict`` and
``fedlatent score`` read a saved model with it when there is one (``import sklearn`` costs about
a second of CPU, more than the rest of a 200-row prediction). It refuses exactly what the
estimator's ``load`` refuses: the same functions check both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from fedlatent.engine.contract.model import NO_CAPABILITIES, Capabilities
from fedlatent.engine.estimation.prediction import DatasetPrediction

__all__ = ["SavedModel", "apply_saved", "load_checked", "saved_settings"]


def load_checked(cls, path: str | Path, trust=None):
    """The model of class ``cls`` saved at ``path`` (``<path>.npz`` and ``<path>.json``),
    checked (see the module docstring); ValueError naming the file and the field otherwise.

    Parameters
    ----------
    cls : type
        The estimator class, or a :class:`SavedModel` of the same name.
    path : str or Path
        The prefix of the two files.
    trust : Roster or None
        A pinned roster: the pair must be signed by one of its sites.
    """
    from fedlatent.engine.fedem.checkpoint import load_arrays_json
    from fedlatent.engine.protocol.loadcheck import check_saved

    path = Path(path)
    npz, js = path.with_name(path.name + ".npz"), path.with_name(path.name + ".json")
    arrays, meta = load_arrays_json(path, trust=trust)
    if meta.get("class") != cls.__name__:
        raise ValueError(f"{path} holds a {meta.get('class')}, not a {cls.__name__}")
    check_saved(cls, arrays, meta, npz, js)
    try:
        est = cls._from_saved(arrays, meta)
        est._check_loaded()
    except (ValueError, KeyError, TypeError, IndexError) as err:
        raise ValueError(f"{npz} / {js.name}: {err}") from err
    est._after_load()
    return est


def saved_settings(meta: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """The constructor parameters a saved model's JSON records, without the federation, and
    the federation (a :class:`~fedlatent.engine.fedem.federation.Federation`, or None)."""
    from fedlatent.engine.fedem.federation import Federation

    params = dict(meta["params"])
    fed = params.pop("federation", None)
    if fed is not None:
        fed = dict(fed)
        if isinstance(fed.get("step_size"), str):  # a callable was recorded by its repr
            fed["step_size"] = 1.0
        fed = Federation.from_config(fed)
    return params, fed


def apply_saved(est, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    """Set on ``est`` (built from :func:`saved_settings`) what a saved model holds beyond its
    settings: the arrays, the fitted fields, the history, the sites left out, the categorical
    encoding, the privacy spent (checked against its calibration), an ``"auto"`` size's
    choice and the estimator's extra entries (``_load_extra``)."""
    from fedlatent.engine.fedem.history import History

    for k, v in arrays.items():
        setattr(est, k, v)
    fitted = dict(meta["fitted"])
    if "n_rounds_" in fitted:  # files written before n_iter_
        fitted["n_iter_"] = fitted.pop("n_rounds_")
    for k, v in fitted.items():
        setattr(est, k, v)
    est.feature_names_in_ = np.asarray(est.feature_names_in_, dtype=object)
    est.n_features_in_ = len(est.feature_names_in_)
    est.history_ = History.from_records(meta["history"])
    est.excluded_clients_ = _excluded_entry(meta.get("excluded"))
    est.history_.excluded = dict(est.excluded_clients_)
    est.encoding_ = None
    if meta.get("encoding") is not None:
        from fedlatent.data.categorical import CategoricalEncoding

        est.encoding_ = CategoricalEncoding.from_json(meta["encoding"])
    _apply_privacy(est, meta.get("privacy"))
    if "selection" in meta:
        est._load_selection(meta["selection"])
    est._load_extra(meta)


def _apply_privacy(est, priv: dict[str, Any] | None) -> None:
    """``privacy_spent_`` and ``privacy_calibration_`` of a saved private fit (None: none)."""
    est.privacy_spent_ = est.privacy_calibration_ = None
    if priv is None:
        return
    from fedlatent.engine.privacy.dp import Calibration

    est.privacy_calibration_ = Calibration.from_dict(priv["calibration"])
    spent = [float(v) for v in priv["spent"]]
    if len(spent) != 2 or spent[0] > est.privacy_calibration_.epsilon * (1 + 1e-9):
        raise ValueError(f"privacy spent {spent} is not (epsilon, delta) within the "
                         "calibrated budget; the file is damaged")
    est.privacy_spent_ = (spent[0], spent[1])


def _excluded_entry(value) -> dict[str, str]:
    """A saved model's ``excluded`` entry (sites left out of its fit): a JSON object of
    texts, or nothing (files saved before the entry)."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                              for k, v in value.items()):
        raise ValueError(f"entry 'excluded' must map site ids to texts, got {value!r}")
    return dict(value)


class SavedModel(DatasetPrediction):
    """A saved model read for prediction and scores alone, without its estimator class (so
    without scikit-learn). A subclass has the estimator's class name, its ``_save_arrays``
    (and ``_load_text``, ``_load_nonfinite``), its loading hooks (``_check_loaded``,
    ``_after_load``, ``_load_extra``) and its prediction hooks (``_make_model``,
    ``_fitted_params``, ``predict`` or ``_estimate_weighted_log_prob``...), shared with the
    estimator through a mixin so the two cannot differ.

    Attributes
    ----------
    target_needed : bool
        Whether the model is scored against a response column (the registry entry's
        ``target``).
    """

    _save_arrays: ClassVar[tuple[str, ...]] = ()
    _load_nonfinite: ClassVar[tuple[str, ...]] = ()
    _score_name: ClassVar[str] = "score"
    capabilities: ClassVar[Capabilities] = NO_CAPABILITIES
    target_needed: ClassVar[bool] = False

    @classmethod
    def load(cls, path: str | Path, *, trust=None):
        """Read and check what the estimator's ``save`` wrote (:func:`load_checked`)."""
        return load_checked(cls, path, trust)

    @classmethod
    def _from_saved(cls, arrays: dict[str, np.ndarray], meta: dict[str, Any]):
        est = cls.__new__(cls)
        params, est.federation = saved_settings(meta)
        est._saved_params = tuple(params)
        for k, v in params.items():
            setattr(est, k, v)
        apply_saved(est, arrays, meta)
        return est

    def _get_param_names(self) -> list[str]:
        """The settings' names: those the saved JSON records (the estimator's constructor's,
        as its ``get_params`` wrote them); read by the ``"auto"`` size's check."""
        return sorted(self._saved_params)

    def _load_selection(self, doc: dict[str, Any]) -> None:
        from fedlatent.engine.contract.selection import load_selection

        load_selection(self, doc)

    def _check_loaded(self) -> None:
        """The model's invariants on the arrays read (the estimator's own checks)."""

    def _after_load(self) -> None:
        """Derived attributes (the estimator's own hook)."""

    def _load_extra(self, meta: dict[str, Any]) -> None:
        """Extra JSON entries (the estimator's own hook; default: nothing)."""
