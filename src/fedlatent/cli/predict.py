"""``fedlatent predict`` and ``fedlatent score``: a saved model of any registered estimator on a
data file.

The model is read from what ``fedlatent fit`` wrote (``model.json`` names the estimator class;
``roles.json`` the columns of the fit, which ``--client``/``--target``/``--entity`` override).
Predictions come from ``est.predict_dataset(fd)`` and the score from ``est.score_dataset(fd)``;
predictions come back in the file's row order, indexed by its row numbers (the ``row`` column of
the CSV).

An estimator whose clients keep their own state in files (FedGMM: ``clients/``, each client's
mixture weights ``pi_c``, found through ``clients/manifest.json``: a client id is looked up there,
never turned into a path) gets each client's file attached first, so its predictions
are the personalized ones (eq. (3) of Wu et al., ICML 2023) and the CSV has the class
probabilities too; ``--global`` uses the shared weights instead.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import typer

from .common import DataOpt, fail, file_order, read_frame, write_atomic
from .fit import ROLES_FILE

__all__ = ["load_model", "predict", "score"]

_MODEL = typer.Option(..., "--model",
                      help="Directory written by 'fedlatent fit' (or its model.json).")
_CLIENT = typer.Option(None, "--client", help="Client column (default: the fit's).")
_TARGET = typer.Option(None, "--target", help="Response column (default: the fit's, if present).")
_ENTITY = typer.Option(None, "--entity", help="Entity column (default: the fit's).")
_UNKNOWN = typer.Option("error", "--handle-unknown",
                        help="A categorical level the fit did not see: 'error' (default), or "
                             "'ignore' (all its indicator columns 0).")
_GLOBAL = typer.Option(False, "--global",
                       help="Models with per-client files (FedGMM): use the shared weights "
                            "instead of each client's.")


def load_model(path: Path) -> tuple[Any, Path]:
    """The estimator saved at ``path`` (a directory, ``<prefix>.json`` or the prefix) and its
    prefix; exits with one line when ``path`` holds no fedlatent model."""
    from ..engine.contract.registry import estimator_by_class_name, estimator_names

    path = Path(path)
    if path.is_dir():
        prefix = path / "model"
    elif path.suffix in (".json", ".npz"):
        prefix = path.with_suffix("")
    else:
        prefix = path
    meta_path = Path(f"{prefix}.json")
    if not meta_path.exists():
        if not path.exists():
            fail(f"model {path} does not exist")
        fail(f"{path} is not a fedlatent model: there is no {meta_path}; write one with "
             "'fedlatent fit MODEL --out DIR'")
    try:
        meta = json.loads(meta_path.read_text())
    except (ValueError, OSError) as err:
        fail(f"{meta_path} is not a fedlatent model: it is not readable JSON ({err})")
    name = meta.get("class") if isinstance(meta, dict) else None
    if not isinstance(name, str):
        fail(f"{meta_path} is not a fedlatent model: it names no estimator class")
    cls = estimator_by_class_name(name)
    if cls is None:
        fail(f"{meta_path} holds a {name!r}, not a registered fedlatent estimator "
             f"(registered: {', '.join(estimator_names())})")
    try:
        return cls.load(prefix), prefix
    except (ValueError, KeyError, TypeError, OSError, zipfile.BadZipFile) as err:
        fail(f"cannot load the {name} model {prefix}.npz/.json: {err}")


def _roles(prefix: Path, **given: str | None) -> dict[str, Any]:
    """The columns of the fit (``roles.json`` next to the model), overridden by ``given``."""
    path = prefix.parent / ROLES_FILE
    saved: dict[str, Any] = {}
    if path.exists():
        try:
            saved = json.loads(path.read_text())
        except ValueError as err:
            fail(f"{path} is not readable JSON ({err})")
    roles = {**saved, **{k: v for k, v in given.items() if v is not None}}
    if roles.get("client") is None:
        fail(f"give --client COLUMN: {path} (written by 'fedlatent fit') does not exist")
    return roles


def _entry(est):
    from ..engine.contract.registry import estimator_entries, estimator_name

    return estimator_entries()[estimator_name(est)]


def _dataset(est, df, roles: dict[str, Any], target: str | None,
             handle_unknown: str = "error"):
    """The dataset of the file's table with the fit's roles; with the fit's categorical
    encoding (``roles.json``), the table's text columns are encoded with the fit's levels."""
    from ..data.categorical import CategoricalEncoding
    from ..data.dataset import FederatedDataset

    formula = getattr(est, "formula_", None)
    if formula is not None:  # the fit's formula, with the levels agreed at fit
        fd = FederatedDataset.from_pandas(
            df, client=roles["client"], features=list(formula.extra) or None, target=target,
            entity=roles.get("entity"), formula=formula)
        fd.refuse_missing("drop or impute them before predicting")
        return fd
    features = [str(f) for f in est.feature_names_in_]
    encoding = None
    if roles.get("categorical") is not None:
        try:
            encoding = CategoricalEncoding.from_json(roles["categorical"])
        except ValueError as err:
            fail(f"roles.json: {err}; fit the model again")
        features = list(encoding.features) or None
    fd = FederatedDataset.from_pandas(
        df, client=roles["client"], features=features, target=target,
        entity=roles.get("entity"), categorical=encoding, handle_unknown=handle_unknown)
    if not getattr(est.capabilities, "missing_values", False):  # NaN: today's error
        fd.refuse_missing("drop or impute them before predicting")
    return fd


def _client_predictors(est, fd, prefix: Path, use_global: bool) -> dict[str, Any] | None:
    """For an estimator whose clients keep their own state in files (``load_client_weights``):
    attach each client's file (so ``predict_dataset`` and ``score_dataset`` use it) and return
    each client's predictor; with ``use_global``, attach nothing. None for other estimators."""
    if not hasattr(est, "load_client_weights"):
        return None
    if use_global:
        return {cid: est for cid in fd.client_ids}
    from ..data.files import client_files

    where = prefix.parent / "clients"
    try:
        files = client_files(where)
    except ValueError as err:
        fail(str(err))
    predictors = {}
    for cid in fd.client_ids:
        path = files.get(cid)
        if path is None or not path.is_file():
            fail(f"client {cid!r} has no weights file in {where}; it did not take part in the "
                 f"fit: use --global, or adapt it in Python with {type(est).__name__}.adapt")
        predictors[cid] = est.load_client_weights(cid, path)
    return predictors


def _to_file_order(values, order: np.ndarray, n_rows: int, what: str) -> np.ndarray:
    values = np.asarray(values)
    if values.shape[0] != n_rows:
        fail(f"the model gave {values.shape[0]} {what} for the {n_rows} rows of the data file")
    out = np.empty_like(values)
    out[order] = values
    return out


def _unknown(value: str) -> str:
    if value not in ("error", "ignore"):
        fail(f"--handle-unknown must be 'error' or 'ignore', got {value!r}")
    return value


def _in_file_order(values, n_rows: int) -> np.ndarray:
    """A Series of ``predict_dataset`` (indexed by the file's row numbers) as a column."""
    if len(values) != n_rows:
        fail(f"the model gave {len(values)} predictions for the {n_rows} rows of the data file")
    return np.asarray(values.to_numpy())


def predict(
    *,
    model: Path = _MODEL,
    data: DataOpt,
    out: Path = typer.Option(..., "--out", help="CSV of predictions, one row per input row."),
    client: str | None = _CLIENT,
    entity: str | None = _ENTITY,
    use_global: bool = _GLOBAL,
    site_state: Path | None = typer.Option(
        None, "--site-state", help="A site's state directory after a deployed (Flower) fit: "
        "predict the site's rows with its own state (FedGMM's pi_c)."),
    with_proba: bool = typer.Option(
        False, "--proba", help="Also write the probabilities: one column proba_<class> per "
        "class (classifiers) or proba_<k> per component (mixtures)."),
):
    """Predict every row of a data file with a saved model (any registered estimator)."""
    import pandas as pd

    est, prefix = load_model(model)
    if site_state is not None:
        from .flower import predict_at_site

        return predict_at_site(est, data, site_state, out)
    df = read_frame(data)
    roles = _roles(prefix, client=client, entity=entity)
    fd = _dataset(est, df, roles, None)
    order = file_order(df, roles["client"])
    predictors = _client_predictors(est, fd, prefix, use_global)
    if not hasattr(est, "predict_dataset"):
        fail(f"{type(est).__name__} cannot predict the rows of a data file "
             "(it has no predict_dataset)")
    values = est.predict_dataset(fd)
    proba = None
    if predictors is not None and hasattr(est, "classes_"):
        proba = np.vstack([predictors[c].predict_proba(cd.X) for c, cd in fd.items()])
    elif with_proba:
        proba = _probabilities(est, fd)
    res = pd.DataFrame({roles["client"]: df[roles["client"]].to_numpy()})
    if hasattr(values, "index"):  # a Series in the file's order, indexed by its rows
        res["prediction"] = _in_file_order(values, len(df))
    else:  # an array in the dataset's (client) order
        res["prediction"] = _to_file_order(values, order, len(df), "predictions")
    if proba is not None:
        proba = _to_file_order(proba, order, len(df), "probability rows")
        names = (np.asarray(est.classes_).tolist() if hasattr(est, "classes_")
                 else range(proba.shape[1]))
        for j, c in enumerate(names):
            res[f"proba_{c}"] = proba[:, j]
    write_atomic(out, lambda tmp: res.to_csv(tmp, index_label="row"))  # no file on failure
    typer.echo(f"wrote {len(res)} predictions to {out}")


def _probabilities(est, fd) -> np.ndarray:
    """``est.predict_proba`` of every client's rows, in the dataset's order; exits with one line
    when the estimator has no probabilities of the features alone."""
    import inspect

    method = getattr(est, "predict_proba", None)
    needed = [] if method is None else [
        p for p in list(inspect.signature(method).parameters.values())[1:]
        if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if method is None or needed:
        fail(f"--proba: {type(est).__name__} has no probabilities of the features alone "
             "(predict_proba(X)); leave out --proba")
    return np.vstack([method(cd.X) for _, cd in fd.items()])


def _row_scores(est, supervised: bool, fd, predictors):
    """Per-row ``score_samples`` (of each client's predictor, if any) in the dataset's order."""
    import pandas as pd

    parts = []
    for cid, cd in fd.items():
        obj = est if predictors is None else predictors[cid]
        if not hasattr(obj, "score_samples"):
            fail(f"{type(est).__name__} has no per-row scores (score_samples); leave out --out "
                 "to print its score on the data")
        s = obj.score_samples(cd.X, cd.y) if supervised and cd.y is not None else (
            obj.score_samples(cd.X))
        parts.append(s if isinstance(s, pd.DataFrame) else pd.DataFrame({"score": s}))
    return pd.concat(parts, ignore_index=True)


def score(
    *,
    model: Path = _MODEL,
    data: DataOpt,
    out: Path | None = typer.Option(
        None, "--out", help="Also write per-row scores (score_samples; FedGMM: log p(x), "
                            "log p(y|x), log p(x, y), low = novel) to this CSV."),
    client: str | None = _CLIENT,
    target: str | None = _TARGET,
    entity: str | None = _ENTITY,
    use_global: bool = _GLOBAL,
    handle_unknown: str = _UNKNOWN,
):
    """Score a saved model on a data file with the model's own metric.

    The metric is the estimator's (mean log-likelihood, accuracy, mean squared error...);
    --out also writes per-row scores.
    """
    est, prefix = load_model(model)
    entry = _entry(est)
    df = read_frame(data)
    roles = _roles(prefix, client=client, entity=entity)
    if target is None and roles.get("target") in df.columns:
        target = roles["target"]
    fd = _dataset(est, df, roles, target, _unknown(handle_unknown))
    predictors = _client_predictors(est, fd, prefix, use_global)
    # everything is computed before anything is written: a failure leaves no --out file
    res = None
    if out is not None:
        res = _row_scores(est, entry.target, fd, predictors)
        res.index = file_order(df, roles["client"])
        res = res.sort_index()
        res.insert(0, roles["client"], df[roles["client"]].to_numpy())
    value = None
    if entry.target and target is None:
        if out is None:
            fail(f"{type(est).__name__} is scored against the response: give --target COLUMN "
                 f"(the fit's, {roles.get('target')!r}, is not in {data})")
    else:
        try:
            value = est.score_dataset(fd) if hasattr(est, "score_dataset") else None
        except NotImplementedError:
            value = None
        if value is None and out is None:
            fail(f"{type(est).__name__} has no score on a data file (no score_dataset)")
        if value is not None:
            value = float(value)
    if res is not None:
        write_atomic(out, lambda tmp: res.to_csv(tmp, index_label="row"))
        typer.echo(f"wrote {len(res)} per-row scores to {out}")
    if value is not None:
        typer.echo(f"{getattr(est, '_score_name', 'score')}: {value!r}")
