"""``fedlatent fit MODEL``: one command per registered estimator, one fitting and saving path.

The models are those of the registry (:mod:`fedlatent.engine.contract.registry`); each
``fit NAME`` command is built on first use from the model's option table
(:func:`fedlatent.cli.options.model_table`: every constructor parameter, the Federation
settings the model uses, ``fit``'s checkpoint keywords), after the data's options::

    fedlatent fit NAME --data FILE --client COL [--features a,b] [--target y] [--entity e]
                       --out DIR [-k 3] [--seed S] [--max-rounds N] [--OPTION VALUE ...]
                       [--param NAME=VALUE ...]

Every fit goes through :func:`fit_and_save`, which writes ``model.npz``/``model.json`` (the
estimator's own ``save``, no pickle), ``history.csv`` (one row per round), ``clients/`` for an
estimator whose clients keep their own state in files, and ``roles.json``: the columns the model
was fitted with, which ``fedlatent predict`` and ``score`` read back. The summary a fit prints
and the extra files a model writes (SEC's similarity matrix) are :mod:`fedlatent.cli.fit_models`'.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from typer.core import TyperCommand

from .common import HELP, CommandGroup, load_dataset

__all__ = ["ROLES_FILE", "FitGroup", "ModelGroup", "fit_and_save", "fit_app", "fit_command",
           "roles_of", "save_result"]

ROLES_FILE = "roles.json"


class ModelGroup(CommandGroup):
    """A group with one command per registered estimator, built by :meth:`make` when asked for
    (so ``fit gmm`` imports only what it needs)."""

    what, listing = "model", "registered"

    @staticmethod
    def make(entry) -> TyperCommand:  # pragma: no cover - every group defines it
        raise NotImplementedError

    def list_commands(self, ctx: typer.Context) -> list[str]:
        from ..engine.contract.registry import estimator_names

        return sorted(set(super().list_commands(ctx)) | set(estimator_names()))

    def get_command(self, ctx: typer.Context, name: str) -> TyperCommand | None:
        cmd = super().get_command(ctx, name)
        if cmd is None:
            from ..engine.contract.registry import estimator_class, estimator_entries

            try:  # imports only the model asked for (fedlatent.models.<name> first)
                estimator_class(name)
            except ValueError:
                return None
            entry = estimator_entries(discover_all=False).get(name)
            if entry is not None:
                self.add_command(self.make(entry), name)
                cmd = super().get_command(ctx, name)
        return cmd


class FitGroup(ModelGroup):
    """The ``fit`` group: ``fit NAME`` for every registered estimator (:func:`fit_command`)."""

    @staticmethod
    def make(entry) -> TyperCommand:
        return fit_command(entry)


fit_app = typer.Typer(cls=FitGroup, no_args_is_help=True,
                      help="Fit a model on a CSV/Parquet file (one command per registered model).")


def _help(entry) -> str:
    needs = [opt for opt, flag in (("--target", entry.target), ("--entity", entry.entity)) if flag]
    need = f" Needs {' and '.join(needs)}." if needs else ""
    return (f"{entry.description or entry.cls.__name__}.{need}\n\n"
            f"Fits fedlatent's {entry.cls.__name__} (every constructor parameter is an option "
            "below) and writes the model, history.csv and roles.json to --out.")


def fit_command(entry) -> TyperCommand:
    """``fedlatent fit NAME`` for a registered estimator, from its option table."""
    from .options import Row, build_command, data_rows, fit_rows, model_table, param_row

    rows = [*data_rows(entry), *model_table(entry), *fit_rows(entry),
            Row("out", ("--out",), HELP["out"], kind="path", required=True, metavar="DIR"),
            param_row()]
    return build_command(entry.name, rows, lambda values: _fit(entry, values),
                         help=_help(entry), short_help=entry.description)


def _fit(entry, values: dict[str, Any]) -> None:
    from .fit_models import extra_files, summary
    from .options import needed_columns
    from .vocabulary import build_estimator, fit_keywords

    needed_columns(entry, values, "fit")
    est = build_estimator(entry, values, values.get("param"))
    fit_kw = fit_keywords(values)
    _, fd = load_dataset(values["data"], values["client"], values["features"],
                         target=values.get("target"), entity=values.get("entity"),
                         categorical=values.get("categorical"),
                         categorical_columns=values.get("categorical_columns"),
                         weight=values.get("weight"), formula=values.get("formula"))
    out = values["out"]
    roles = roles_of(entry.name, values["client"], values.get("target") or fd.target_name,
                     values.get("entity"))
    written = fit_and_save(est, fd, out, roles, extra=extra_files(entry.name, est),
                           fit_kw=fit_kw)
    for line in summary(entry.name, est, fd.n_clients, fd.n_samples, fd.n_features):
        typer.echo(line)
    echo_written(out, written)


# ---- the one fitting and saving path ---------------------------------------------------------
def fit_and_save(est, fd, out: Path, roles: dict[str, Any], extra=None,
                 fit_kw: dict[str, Any] | None = None) -> list[str]:
    """Fit ``est`` on ``fd`` and write it to ``out``, all or nothing.

    Returns the names written: ``model.npz``, ``model.json``, ``history.csv`` (when the estimator
    keeps a history), ``clients/`` (when its clients keep their own state: ``save_client_weights``)
    and ``roles.json`` (the columns of the fit: client, features, target, entity, and the
    categorical encoding when there is one), ``excluded_clients.csv`` (the sites left out of
    the fit because they refused its setup by a rule, and why), then the
    names ``extra(directory)`` returns (a command's own files, e.g. SEC's similarity matrix).
    Everything is written into a temporary sibling directory that becomes ``out`` only when
    every file was written (:func:`~.common.staged_dir`): a failed fit, or a failure while
    writing, leaves no ``out`` and no half-written directory.
    """
    from ..engine.rounds.loop import FederatedFitError

    try:
        est.fit(fd, **(fit_kw or {}))
    except FederatedFitError as err:
        write_refused(err, out)
        raise
    if hasattr(est, "save_client_weights"):  # client ids name no path: checked before writing
        from ..data.files import client_file_names

        client_file_names([str(c) for c in getattr(est, "client_ids_", fd.client_ids)])
    return save_result(est, out, {**roles, "features": [str(f) for f in fd.feature_names]},
                       getattr(fd, "encoding", None), extra)


def save_result(est, out: Path, roles: dict[str, Any], encoding=None, extra=None) -> list[str]:
    """Write the fitted ``est`` to ``out``, all or nothing (:func:`fit_and_save`'s files)."""
    from .common import staged_dir

    with staged_dir(out) as tmp:
        est.save(tmp / "model")
        written = ["model.npz", "model.json"]
        history = getattr(est, "history_", None)
        if history is not None:
            frame = history.to_frame() if hasattr(history, "to_frame") else history
            frame.to_csv(tmp / "history.csv", index=False)
            written.append("history.csv")
        if hasattr(est, "save_client_weights"):
            est.save_client_weights(tmp / "clients")
            written.append("clients/")
        if encoding is not None:  # predict encodes with the same levels
            roles = {**roles, "categorical": encoding.to_json()}
        (tmp / ROLES_FILE).write_text(json.dumps(roles, indent=1) + "\n")
        written.append(ROLES_FILE)
        if getattr(est, "excluded_clients_", None):  # sites left out of the fit, and why
            write_clients(tmp / EXCLUDED_FILE, est.excluded_clients_)
            written.append(EXCLUDED_FILE)
        if extra is not None:
            written.extend(extra(tmp))
    return written


#: the file a failed fit writes when it names more clients than its message shows
REFUSED_FILE = "refused_clients.csv"
#: the file of a fit that left sites out (they refused its setup by a rule), with why
EXCLUDED_FILE = "excluded_clients.csv"


def write_clients(path: Path, reasons: dict[str, str]) -> None:
    """``client,reason`` rows, one per client of ``reasons``."""
    import csv

    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["client", "reason"])
        w.writerows(reasons.items())


def write_refused(err, out: Path) -> None:
    """A fit that stopped naming more clients than its one-line message shows writes them
    all, with their reasons, to ``OUT/refused_clients.csv`` (the only file written) and says
    so at the end of its message."""
    from ..data.validation import NAMES_SHOWN

    faults = getattr(err, "faults", {})
    if len(faults) <= NAMES_SHOWN or (out.exists() and not out.is_dir()):
        return
    out.mkdir(parents=True, exist_ok=True)
    write_clients(out / REFUSED_FILE, faults)
    err.args = (f"{err} (all {len(faults)} clients and their reasons: {out / REFUSED_FILE})",
                *err.args[1:])


def roles_of(entry_name: str, client: str, target: str | None, entity: str | None) -> dict:
    return {"estimator": entry_name, "client": client, "target": target, "entity": entity}


def echo_written(out: Path, written: list[str]) -> None:
    typer.echo("wrote " + ", ".join(str(out / w) for w in written))
