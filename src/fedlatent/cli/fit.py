"""``fedlatent fit MODEL``: one command per registered estimator, one fitting and saving path.

The models are those of the registry (:mod:`fedlatent.engine.contract.registry`). A model with a
hand-written command (:mod:`fedlatent.cli.fit_models`: named options such as ``--components``)
uses it; every other registered estimator gets a generic command, built on first use from the
registry entry and the estimator's constructor::

    fedlatent fit NAME --data FILE --client COL [--features a,b] [--target y] [--entity e]
                       --out DIR [--seed S] [--max-rounds N] [--param key=value ...]

Every fit goes through :func:`fit_and_save`, which writes ``model.npz``/``model.json`` (the
estimator's own ``save``, no pickle), ``history.csv`` (one row per round), ``clients/`` for an
estimator whose clients keep their own state in files, and ``roles.json``: the columns the model
was fitted with, which ``fedlatent predict`` and ``score`` read back.
"""

from __future__ import annotations

import enum
import functools
import inspect
import json
import warnings
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperCommand

from .common import (
    CATEGORICAL,
    CATEGORICAL_CHOICES,
    CATEGORICAL_COLUMNS,
    CATEGORICAL_HELP,
    ClientOpt,
    CommandGroup,
    DataOpt,
    EntityOpt,
    FeaturesOpt,
    MaxRoundsOpt,
    OutDirOpt,
    ProgressOpt,
    SeedOpt,
    TargetOpt,
    fail,
    load_dataset,
)
from .vocabulary import SHARED, apply_shared, deprecated, with_shared

__all__ = ["ROLES_FILE", "FitGroup", "build_estimator", "fit_and_save", "fit_app",
           "make_federation", "parse_params"]

ROLES_FILE = "roles.json"

ParamOpt = Annotated[
    list[str] | None,
    typer.Option("--param", help="A constructor parameter, NAME=VALUE (VALUE read as JSON when "
                                 "it is JSON, else as text); repeat for several."),
]


class FitGroup(CommandGroup):
    """The ``fit`` group: the hand-written commands plus a generic command for every other
    registered estimator (built when asked for, so ``fit gmm`` imports only what it needs)."""

    what, listing = "model", "registered"

    def list_commands(self, ctx: typer.Context) -> list[str]:
        from ..engine.contract.registry import estimator_names

        return sorted(set(super().list_commands(ctx)) | set(estimator_names()))

    def get_command(self, ctx: typer.Context, name: str) -> TyperCommand | None:
        cmd = super().get_command(ctx, name)
        if cmd is None:
            from ..engine.contract.registry import estimator_entries

            entry = estimator_entries().get(name)
            if entry is not None:
                cmd = generic_command(entry)
                self.add_command(cmd, name)
        return None if cmd is None else with_shared(with_categorical(cmd))


#: the values of ``--categorical``
Categorical = enum.Enum("Categorical", {c.replace("-", "_"): c for c in CATEGORICAL_CHOICES},
                        type=str)


def _categorical_options(
    categorical: Annotated[
        Categorical | None, typer.Option("--categorical", help=CATEGORICAL_HELP)] = None,
    categorical_columns: Annotated[str | None, typer.Option(
        "--categorical-columns",
        help="Comma-separated feature columns --categorical encodes (numbers as labels too, "
             "e.g. region codes); default: every text, categorical or boolean feature.")] = None,
) -> None:
    """The options :func:`with_categorical` adds (a function only typer reads)."""


def categorical_params() -> list:
    """``--categorical`` and ``--categorical-columns`` as parameters built by typer (so of the
    click typer runs on: the click package or typer's own copy)."""
    sub = typer.Typer(add_completion=False)
    sub.command("options")(_categorical_options)
    return list(typer.main.get_command(sub).params)


def with_categorical(cmd: TyperCommand) -> TyperCommand:
    """``cmd`` with a ``--categorical`` option (once): the value is set in
    :data:`~.common.CATEGORICAL` while the command runs, so its ``load_dataset`` encodes text
    columns and :func:`fit_and_save` records the encoding in ``roles.json``."""
    if any(p.name == "categorical" for p in cmd.params) or cmd.callback is None:
        return cmd
    cmd.params.extend(categorical_params())
    inner = cmd.callback

    @functools.wraps(inner)
    def callback(*args, categorical=None, categorical_columns=None, **kwargs):
        token = CATEGORICAL.set(None if categorical is None else Categorical(categorical).value)
        token_columns = CATEGORICAL_COLUMNS.set(categorical_columns)
        try:
            return inner(*args, **kwargs)
        finally:
            CATEGORICAL_COLUMNS.reset(token_columns)
            CATEGORICAL.reset(token)

    cmd.callback = callback
    return cmd


fit_app = typer.Typer(cls=FitGroup, no_args_is_help=True,
                      help="Fit a model on a CSV/Parquet file (one command per registered model).")


# ---- building the estimator ------------------------------------------------------------------
def constructor_parameters(cls: type) -> dict[str, inspect.Parameter]:
    """The estimator's constructor parameters by name (``self`` and ``*args`` left out)."""
    sig = inspect.signature(cls.__init__)
    return {k: p for k, p in sig.parameters.items()
            if k != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def _takes_any_keyword(cls: type) -> bool:
    return any(p.kind == p.VAR_KEYWORD for p in inspect.signature(cls.__init__).parameters.values())


def parse_params(items: list[str] | None, cls: type, name: str) -> dict[str, Any]:
    """``["n_components=3", "covariance_type=diag"]`` -> constructor keywords (JSON values when
    they parse as JSON, else text; a JSON object for ``federation`` becomes a Federation)."""
    known = constructor_parameters(cls)
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            fail(f"--param expects NAME=VALUE, got {item!r}")
        if key not in known and not _takes_any_keyword(cls):
            fail(f"--param {key}: {name} ({cls.__name__}) has no parameter {key!r}; its "
                 f"parameters: {', '.join(known)}")
        if key in out:
            fail(f"--param {key} is given twice")
        if key in _SHARED_SPELLING:
            deprecated(f"--param {key}=", _SHARED_SPELLING[key])
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        if key == "federation" and isinstance(value, dict):
            from ..engine.fedem.federation import Federation

            value = Federation.from_config(value)
        out[key] = value
    return out


#: constructor parameters that have a shared option (:mod:`.vocabulary`): ``--param`` for them
#: is a deprecated spelling
_SHARED_SPELLING = {"n_components": "--components", "n_clusters": "--components",
                    "n_input_components": "--components", "max_rounds": "--max-rounds",
                    "tol": "--tol"}


def build_estimator(cls: type, params: dict[str, Any], name: str = ""):
    """``cls(**params)`` with the shared options the command did not declare
    (:data:`~.vocabulary.SHARED`); a required parameter that is missing is named."""
    params = apply_shared(cls, params, SHARED.get())
    known = constructor_parameters(cls)
    missing = [k for k, p in known.items() if p.default is p.empty and k not in params]
    if missing:
        fail(f"{name or cls.__name__} needs " + ", ".join(
            f"{_SHARED_SPELLING[k]} VALUE" if k in _SHARED_SPELLING else f"--param {k}=VALUE"
            for k in missing))
    return cls(**params)


def make_federation(participation: float, step_size: float, quant_levels: int | None,
                    control_variates: bool, seed: int | None):
    """The Federation of the command-line options, validated (ValueError names the setting)."""
    from ..engine.fedem.federation import Federation, Quantizer

    fed = Federation(
        participation=participation,
        step_size=step_size,
        quantizer=Quantizer(quant_levels) if quant_levels else None,
        control_variates=control_variates,
        random_state=seed,
    )
    fed.validate()
    return fed


# ---- the one fitting and saving path ---------------------------------------------------------
def fit_and_save(est, fd, out: Path, roles: dict[str, Any], extra=None) -> list[str]:
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
    from .common import staged_dir

    try:
        est.fit(fd)
    except FederatedFitError as err:
        write_refused(err, out)
        raise
    if hasattr(est, "save_client_weights"):  # client ids name no path: checked before writing
        from ..data.files import client_file_names

        client_file_names([str(c) for c in getattr(est, "client_ids_", fd.client_ids)])
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
        roles = {**roles, "features": [str(f) for f in fd.feature_names]}
        if getattr(fd, "encoding", None) is not None:  # predict encodes with the same levels
            roles["categorical"] = fd.encoding.to_json()
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


# ---- the generic command -------------------------------------------------------------------
def _help(entry) -> str:
    params = ", ".join(
        k if p.default is p.empty else f"{k}={p.default!r}"
        for k, p in constructor_parameters(entry.cls).items()
    )
    needs = [opt for opt, flag in (("--target", entry.target), ("--entity", entry.entity)) if flag]
    need = f" Needs {' and '.join(needs)}." if needs else ""
    return (f"{entry.description or entry.cls.__name__}.{need}\n\n"
            f"Parameters of {entry.cls.__name__} (--param NAME=VALUE): {params}.")


def generic_command(entry) -> TyperCommand:
    """``fedlatent fit NAME`` for a registered estimator without a hand-written command."""
    sub = typer.Typer(add_completion=False)

    @sub.command(entry.name, help=_help(entry), short_help=entry.description)
    def fit_generic(
        *,
        data: DataOpt,
        client: ClientOpt,
        features: FeaturesOpt = None,
        target: TargetOpt = None,
        entity: EntityOpt = None,
        out: OutDirOpt,
        seed: SeedOpt = 0,
        max_rounds: MaxRoundsOpt = None,
        param: ParamOpt = None,
        progress: ProgressOpt = None,
    ):
        if entry.target and target is None:
            fail(f"fit {entry.name} needs --target COLUMN (the response)")
        if entry.entity and entity is None:
            fail(f"fit {entry.name} needs --entity COLUMN (the entity of each row)")
        params = parse_params(param, entry.cls, entry.name)
        known = constructor_parameters(entry.cls)
        for key, value in (("random_state", seed), ("max_rounds", max_rounds),
                           ("verbose", progress)):  # --param wins over the option
            if value is None:
                continue
            if key in known:
                params.setdefault(key, value)
            elif key == "max_rounds":
                warnings.warn(f"{entry.cls.__name__} has no rounds; --max-rounds is ignored",
                              stacklevel=1)
        est = build_estimator(entry.cls, params, entry.name)
        _, fd = load_dataset(data, client, features, target=target, entity=entity)
        written = fit_and_save(est, fd, out, roles_of(entry.name, client, target, entity))
        typer.echo(f"{type(est).__name__}: {fd.n_clients} clients, {fd.n_samples} samples, "
                   f"{fd.n_features} features")
        if hasattr(est, "n_iter_"):
            typer.echo(f"rounds: {est.n_iter_}  converged: {getattr(est, 'converged_', '?')}")
        echo_written(out, written)

    return typer.main.get_command(sub)
