"""One option table per model: the command line's name, type, default and help for every
parameter of a registered estimator, built from the estimator itself.

:func:`model_table` reads, once per model:

- the constructor's parameters (``inspect.signature``): each is an option named after it
  (``covariance_type`` -> ``--covariance-type``), except the few of :data:`RENAMED`
  (``--components/-k`` for the count, ``--seed``, ``--progress/--no-progress``,
  ``--intercept/--no-intercept``, FedGMM's ``--learners``);
- their forms (the estimator's ``_parameter_constraints``, else the default's type): a choice,
  a number, ``N|auto``, a flag, or a JSON value / comma-separated list;
- their help: the first sentence of the parameter's description in the class's numpydoc
  docstring, and the estimator's default;
- the ``federation`` parameter as one option per setting of
  :class:`~fedlatent.engine.fedem.federation.Federation` the model can use (the round settings
  where it has rounds, secure aggregation and differential privacy where its capabilities say
  so, acceleration where its model has no ``acceleration_refusal``), with
  ``--disclosure``/``--min-records`` for the disclosure policy;
- the keywords of ``fit`` (``--checkpoint``, ``--checkpoint-every``, ``--resume``), which only
  ``fedlatent fit`` offers (a deployment's server checkpoints every round by itself).

``fedlatent fit``, ``flower local`` and ``flower app`` build their commands from this table
(:func:`build_command`), and :mod:`.vocabulary` turns the values back into the estimator's
parameters; a setting the table leaves out says why in :func:`not_offered`.
"""

from __future__ import annotations

import enum
import functools
import inspect
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import typer

__all__ = ["CATEGORICAL_CHOICES", "CATEGORICAL_HELP", "COUNT_PARAMETERS", "HELP", "RENAMED",
           "Row", "auto_value", "build_command", "constructor_parameters", "data_rows",
           "federation_rows", "fit_rows", "flag_of", "model_table", "needed_columns",
           "not_offered", "param_row", "parameter_help"]

#: the estimator parameters ``--components/-k`` sets, the first the constructor has
COUNT_PARAMETERS = ("n_components", "n_clusters", "n_input_components")
#: parameters whose option is not their hyphenated name
RENAMED = {"random_state": "--seed", "verbose": "--progress", "n_learners": "--learners",
           "fit_intercept": "--intercept"}
#: hidden spellings of earlier releases (they still work, with a FutureWarning)
OLD_SPELLINGS = {"n_clusters": "--clusters", "n_input_components": "--input-components",
                 "max_rounds": "--max-iter"}
#: Federation settings under other names (HLCR's ``alpha`` is its own prior)
_FEDERATION_FLAGS = {"quantizer": "--quantize", "alpha": "--control-variate-step"}
#: Federation settings that take effect only where the estimator runs rounds
_ROUND_SETTINGS = ("participation", "step_size", "client_weighting", "quantizer",
                   "control_variates", "alpha", "variance_reduction", "batch_size", "track_h",
                   "on_invalid", "acceleration")
_SECURE_SETTINGS = ("secure_aggregation", "secagg_threshold", "secagg_bound")


#: the help of the data options, the same on every command (:func:`data_rows`)
HELP = {
    "data": "CSV or Parquet file, one row per sample (per event for HLCR).",
    "client": "Column with the client (site, agent, learner) id of each row.",
    "features": "Comma-separated feature columns (default: all the others).",
    "target": "Response (label) column.",
    "entity": "Entity column of hierarchical data (the entity of each row).",
    "weight": "Column of frequency weights (a row of weight 2 counts as the row twice; "
              "disclosure control still counts rows).",
    "categorical_columns": "Comma-separated feature columns --categorical encodes (numbers as "
                           "labels too, e.g. region codes); default: every text, categorical "
                           "or boolean feature.",
    "out": "Output directory (model.npz/json, history.csv, roles.json...).",
    "formula": "The design from a formula, e.g. 'y ~ x1 + C(sex) + x1:x2' (after '|': "
               "concomitant variables); the target is its response, --features columns kept "
               "beside it (an offset, trials).",
    "seed": "Seed of every random draw of the run.",
    "progress": "Progress bars [default: on a terminal].",
}
CATEGORICAL_CHOICES = ("onehot", "onehot-all")
CATEGORICAL_HELP = ("Encode text, categorical and boolean feature columns as indicator columns "
                    "'col=level': 'onehot' drops each column's first level (the reference, "
                    "collinear with an intercept otherwise), 'onehot-all' keeps every level. The "
                    "levels are agreed from each client's distinct labels (they cross: merge rare "
                    "labels first); 'fedlatent predict' encodes with the same levels.")


@dataclass(frozen=True)
class Row:
    """One option of a command.

    Attributes
    ----------
    key : str
        The Python name of its value (a constructor parameter, ``federation_<setting>``, a
        ``fit`` keyword, or a command's own).
    flags : tuple of str
        ``("--components", "-k")``; a flag's ``("--progress/--no-progress",)``.
    help : str
        One or two sentences, the default included.
    kind : str
        ``"flag"``, ``"int"``, ``"float"``, ``"str"``, ``"choice"``, ``"count"`` (a number or
        ``auto``), ``"number-or-auto"``, ``"bool-or-auto"``, ``"value"`` (JSON or a
        comma-separated list), ``"pairs"`` (KEY=VALUE,...), ``"path"``, ``"list"`` (repeated).
    goes : str
        ``"param"`` (the constructor), ``"federation"``, ``"fit"`` (a keyword of ``fit``),
        ``"data"`` or ``"command"`` (the command's own).
    name : str
        The constructor parameter, Federation setting or ``fit`` keyword it sets.
    choices : tuple of str
        The values of a ``"choice"``.
    hidden : bool
        An old spelling, not listed in the help.
    required : bool
        The command cannot run without it.
    """

    key: str
    flags: tuple[str, ...]
    help: str
    kind: str = "str"
    goes: str = "command"
    name: str = ""
    choices: tuple[str, ...] = ()
    hidden: bool = False
    required: bool = False
    metavar: str | None = field(default=None, compare=False)

    @property
    def flag(self) -> str:
        """The long flag (``--progress`` of ``--progress/--no-progress``)."""
        return self.flags[0].split("/")[0]


# ---- help text from the docstring -----------------------------------------------------------
_ROLE = re.compile(r":[\w:]+:`~?(?:[^`<]*<)?([^`>]+)>?`")


def _plain(text: str) -> str:
    """Docstring markup as plain text: Sphinx roles and ``code`` become the name."""
    text = _ROLE.sub(lambda m: m.group(1).rsplit(".", 1)[-1] if "~" in m.group(0)
                     else m.group(1), text)
    return " ".join(text.replace("``", "'").split())


@functools.cache
def _docstring_parameters(cls: type) -> dict[str, tuple[str, str]]:
    """``{name: (type line, description)}`` of the numpydoc Parameters sections of ``cls``
    and its bases (a subclass's own entry wins)."""
    out: dict[str, tuple[str, str]] = {}
    for klass in reversed(cls.__mro__):
        out.update(_parameters_section(klass.__dict__.get("__doc__")))
    return out


def _parameters_section(doc: str | None) -> dict[str, tuple[str, str]]:
    lines = inspect.cleandoc(doc or "").splitlines()
    out: dict[str, tuple[str, str]] = {}
    try:
        i = lines.index("Parameters") + 2
    except ValueError:
        return out
    names: list[str] = []
    while i < len(lines) and not (i + 1 < len(lines) and set(lines[i + 1]) == {"-"}):
        line = lines[i]
        if line and not line.startswith(" "):
            head, _, kind = line.partition(" : ")
            names = [n.strip() for n in head.split(",")]
            for n in names:
                out[n] = (kind.strip(), "")
        elif line.strip() and names:
            for n in names:
                out[n] = (out[n][0], (out[n][1] + " " + line.strip()).strip())
        i += 1
    return out


def _first_sentence(text: str) -> str:
    """Up to the first '.' or ';' outside brackets that ends a sentence."""
    depth = 0
    for i, ch in enumerate(text):
        depth += (ch in "([{") - (ch in ")]}")
        end = i + 1 == len(text) or (text[i + 1] == " " and (ch == ";" or text[i + 2:i + 3]
                                                               .isupper()))
        if depth <= 0 and ch in ".;" and end:
            return text[:i] + "."
    return text.rstrip(".") + "."


#: the help of the parameters every model shares, the same on every command
SHARED_HELP = {
    "random_state": "Seed of every random draw of the run.",
    "verbose": "Progress bars [default: on a terminal].",
    "max_rounds": "Rounds (iterations, sweeps) at most.",
    "tol": "Convergence tolerance on the change of the objective.",
}


def parameter_help(cls: type, name: str) -> str:
    """The first sentence of ``name``'s description in ``cls``'s docstring as plain text,
    after the parameter's name in words where the sentence explains a value (``"auto": ...``)
    or where there is none; :data:`SHARED_HELP` for the shared ones."""
    if name in SHARED_HELP:
        return SHARED_HELP[name]
    _, desc = _docstring_parameters(cls).get(name, ("", ""))
    text = _first_sentence(_plain(desc)) if desc else ""
    words = (f"Number of {name[2:]}" if name.startswith("n_") else name).replace("_", " ")
    words = words[0].upper() + words[1:]
    if not text:
        return words + "."
    counted = text.lower().startswith(("number", "the number"))
    if (not text[0].isalpha() or text[0].islower() or text.startswith("None")
            or (name in COUNT_PARAMETERS and not counted)):
        return f"{words}: {text}"
    return text


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, list | tuple):
        return ",".join(map(str, value))
    return str(value)


def _with_default(text: str, default: Any) -> str:
    return text if default is None else f"{text} [default: {_shown(default)}]"


# ---- the estimator's parameters -------------------------------------------------------------
def flag_of(name: str, count: str | None = None) -> str:
    """The long option of constructor parameter ``name`` (``count``: the model's count)."""
    if name == count:
        return "--components"
    return RENAMED.get(name, "--" + name.replace("_", "-"))


def _forms(cls: type, name: str) -> list:
    return list(getattr(cls, "_parameter_constraints", {}).get(name, []))


def _kind(cls: type, name: str, default: Any) -> tuple[str, tuple[str, ...]]:
    """``(kind, choices)`` of the parameter from its constraints, else its default."""
    from ..engine.contract.params import Integer, Options, Real

    forms = _forms(cls, name)
    options = [f for f in forms if isinstance(f, Options)]
    numbers = [f for f in forms if isinstance(f, Integer | Real)]
    if options and not numbers and "boolean" not in forms:
        values = tuple(str(v) for o in options for v in o.values)
        return ("choice", values) if "auto" not in values or len(values) > 1 else ("str", ())
    if "boolean" in forms:
        return ("bool-or-auto", ()) if options else ("flag", ())
    if "array-like" in forms or any(f in (list, tuple, dict) for f in forms):
        return "value", ()
    if numbers:
        if options:
            return "number-or-auto", ()
        return ("int" if all(isinstance(f, Integer) for f in numbers) else "float"), ()
    if forms:
        return "value", ()
    for kind, types in (("flag", bool), ("int", int), ("float", float), ("str", str)):
        if isinstance(default, types):
            return kind, ()
    return "value", ()


def auto_value(cls: type, name: str) -> Any:
    """What ``auto`` means for a size parameter: ``"auto"`` where the estimator chooses it
    (``AUTO_SIZE``), None where its default None does (SEC's ``n_clusters``), ``...`` where
    the estimator does not choose it."""
    from ..engine.contract.params import Options
    from ..engine.contract.selection import AUTO_SIZE

    forms = _forms(cls, name)
    if any(f is AUTO_SIZE or (isinstance(f, Options) and "auto" in f.values) for f in forms):
        return "auto"
    default = constructor_parameters(cls)[name].default
    if default == "auto":
        return "auto"
    if None in forms and default is None:
        return None
    return ...


def _count_kind(cls: type, name: str) -> str:
    from ..engine.contract.selection import AUTO_SIZE

    sized = name in COUNT_PARAMETERS or any(f is AUTO_SIZE for f in _forms(cls, name))
    return "count" if sized else ""


_METAVARS = {"count": "N|auto", "number-or-auto": "NUMBER|auto", "bool-or-auto": "yes|no|auto",
             "value": "VALUE", "pairs": "KEY=VALUE,...", "int": "N", "float": "NUMBER",
             "path": "PATH"}


def _param_row(cls: type, name: str, default: Any, count: str | None) -> Row:
    kind, choices = _kind(cls, name, default)
    kind = _count_kind(cls, name) or kind
    flag = flag_of(name, count)
    flags = ((f"{flag}/--no-{flag[2:]}",) if kind == "flag"
             else (flag, "-k") if name == count else (flag,))
    shown = None if default is inspect.Parameter.empty else default
    if name == "random_state":
        kind, shown = "int", 0  # the command line is reproducible by default
    help_ = parameter_help(cls, name)
    if name == "max_rounds" and shown is None:
        help_ += " [default: 100, or under --privacy the model's short private plan]"
    if kind == "count" and auto_value(cls, name) is not ... and '"auto"' not in help_ \
            and "'auto'" not in help_:
        help_ += " 'auto': the model chooses it."
    return Row(key=name, flags=flags, help=_with_default(help_, shown), kind=kind, goes="param",
               name=name, choices=choices, required=default is inspect.Parameter.empty,
               metavar=_METAVARS.get(kind))


def _old_rows(params: dict, count: str | None) -> list[Row]:
    rows = []
    for name, flag in OLD_SPELLINGS.items():
        if name in params:
            rows.append(Row(key=f"old_{name}", flags=(flag,), kind="count" if name == count
                            else "int", goes="param", name=name, hidden=True,
                            help=f"Deprecated: {flag_of(name, count)}."))
    return rows


def constructor_parameters(cls: type) -> dict[str, inspect.Parameter]:
    """The estimator's constructor parameters by name (``self`` and ``*args`` left out)."""
    sig = inspect.signature(cls.__init__)
    return {k: p for k, p in sig.parameters.items()
            if k != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


# ---- Federation ----------------------------------------------------------------------------
def _federation_settings() -> dict[str, Any]:
    from ..engine.fedem.federation import Federation

    return {f.name: f.default for f in fields(Federation) if not f.name.startswith("_")}


def _model_refusal(entry) -> str:
    """The registered model's ``acceleration_refusal`` (its round is not an EM map)."""
    from ..engine.contract.registry import model_class

    try:
        return getattr(model_class(entry.name), "acceleration_refusal", "") or ""
    except (LookupError, ValueError, ImportError):
        return ""


@functools.cache
def not_offered(entry) -> dict[str, str]:
    """Federation settings (and ``fit`` keywords) the model's commands leave out, each with why."""
    params = constructor_parameters(entry.cls)
    why: dict[str, str] = {"random_state": "--seed seeds the federation's draws too"}
    if "federation" not in params:
        why.update({k: f"{entry.cls.__name__} takes no federation settings"
                    for k in _federation_settings()})
        return why
    caps = entry.cls().capabilities
    if "max_rounds" not in params:
        why.update({k: f"{entry.name} runs no rounds (a one-shot protocol)"
                    for k in (*_ROUND_SETTINGS, "checkpoint", "checkpoint_every", "resume")})
    if not caps.secure_aggregation:
        why.update({k: caps.secure_refusal for k in _SECURE_SETTINGS})
    if not caps.differential_privacy:
        why["privacy"] = caps.privacy_refusal
    refusal = _model_refusal(entry)
    if refusal:
        why.setdefault("acceleration", refusal)
    return why


def federation_rows(entry) -> list[Row]:
    """One row per Federation setting the model uses (with ``--min-records``)."""
    from ..engine.fedem.federation import Federation

    skip = not_offered(entry)
    rows = []
    for name, default in _federation_settings().items():
        if name in skip:
            continue
        rows.append(_federation_row(Federation, name, default))
        if name == "disclosure":
            rows.append(Row(key="federation_min_records", flags=("--min-records",),
                            kind="int", goes="federation", name="min_records", metavar="N",
                            help="The disclosure policy's min_records: a reply must be a sum "
                                 "over at least this many records. [default: 3]"))
    return rows


_FEDERATION_KINDS = {
    "quantizer": ("int", "Quantizer levels (unbiased compression of what clients send); "
                         "none by default."),
    "variance_reduction": ("pairs", "SPIDER variance reduction (VR-FedEM), e.g. "
                                    "'inner_rounds=10,batch_size=32'; none by default."),
    "disclosure": ("pairs", "The disclosure policy: 'off' (every rule off) or rules as "
                            "KEY=VALUE pairs, e.g. 'min_records=5,max_parameters_per_record=0.2'"
                            " (see --min-records)."),
    "privacy": ("pairs", "Record-level differential privacy, KEY=VALUE pairs of "
                         "DifferentialPrivacy, e.g. 'epsilon=1,delta=1e-5,clip=3'; none by "
                         "default."),
    "acceleration": ("choice", ""),
    "step_size": ("float", ""),
    "alpha": ("float", ""),
    "batch_size": ("int", ""),
    "secagg_threshold": ("int", ""),
}


def _federation_row(cls: type, name: str, default: Any) -> Row:
    kind, text = _FEDERATION_KINDS.get(name, ("", ""))
    choices: tuple[str, ...] = ()
    if name == "acceleration":
        choices = ("none", "squarem", "newton")
    elif not kind:
        kind, choices = _kind(cls, name, default)
        kind = "choice" if kind == "str" and name in ("client_weighting", "on_invalid") else kind
        choices = choices or ({"client_weighting": ("samples", "uniform"),
                               "on_invalid": ("exclude", "raise")}.get(name, ()))
    text = text or parameter_help(cls, name)
    shown = None if text.endswith("by default.") or name == "disclosure" else default
    if name == "acceleration":
        shown = "none"
    flag = _FEDERATION_FLAGS.get(name, "--" + name.replace("_", "-"))
    flags = (f"{flag}/--no-{flag[2:]}",) if kind == "flag" else (flag,)
    return Row(key=f"federation_{name}", flags=flags, help=_with_default(text, shown),
               kind=kind, goes="federation", name=name, choices=choices,
               metavar=_METAVARS.get(kind))


# ---- fit's keywords and the table -----------------------------------------------------------
def fit_rows(entry) -> list[Row]:
    """``--checkpoint``, ``--checkpoint-every``, ``--resume`` (the keywords of ``fit``), and
    ``--progress`` where the estimator has no ``verbose``."""
    sig = inspect.signature(entry.cls.fit).parameters
    progress = [] if "verbose" in constructor_parameters(entry.cls) or "progress" not in sig \
        else [Row(key="progress", flags=("--progress/--no-progress",), kind="flag", goes="fit",
                  name="progress", help=SHARED_HELP["verbose"])]
    if "checkpoint" in not_offered(entry):
        return progress
    every = sig["checkpoint_every"].default if "checkpoint_every" in sig else None
    return [
        Row(key="checkpoint", flags=("--checkpoint",), kind="path", goes="fit",
            name="checkpoint", metavar="PATH",
            help="Write PATH.npz (replaced atomically) every --checkpoint-every rounds, at the "
                 "end and when a fault stops the run."),
        Row(key="checkpoint_every", flags=("--checkpoint-every",), kind="int", goes="fit",
            name="checkpoint_every", metavar="N",
            help=_with_default("Rounds between two checkpoints.", every)),
        Row(key="resume", flags=("--resume/--no-resume",), kind="flag", goes="fit",
            name="resume", help="Continue from --checkpoint (the same data and parameters): "
                                "ends as the uninterrupted fit would. [default: off]"),
        *progress,
    ]


@functools.cache
def model_table(entry) -> tuple[Row, ...]:
    """The options of the model's estimator: its constructor parameters (``federation``
    spread into its settings) and their old spellings; ``fit``'s keywords are
    :func:`fit_rows`."""
    params = constructor_parameters(entry.cls)
    count = next((c for c in COUNT_PARAMETERS if c in params), None)
    rows = [_param_row(entry.cls, name, p.default, count)
            for name, p in params.items() if name != "federation"]
    rows.extend(federation_rows(entry))
    rows.extend(_old_rows(params, count))
    return tuple(rows)


# ---- the data and the command's own rows -----------------------------------------------------
def data_rows(entry, *, data_help: str | None = None, columns_required: bool = True,
              categorical: bool = True) -> list[Row]:
    """``--data`` and the columns of the model's data: ``--client``, ``--features``,
    ``--target`` (models with a response), ``--entity`` (hierarchical models), ``--weight``,
    ``--formula`` and the categorical encoding."""
    rows = [Row("data", ("--data",), data_help or HELP["data"], kind="path", goes="data",
                required=True, metavar="FILE"),
            Row("client", ("--client",), HELP["client"], goes="data", required=columns_required),
            Row("features", ("--features",), HELP["features"], goes="data")]
    if entry.target:  # needed: checked by the command (:func:`needed_columns`)
        rows.append(Row("target", ("--target",), HELP["target"] + " Needed.", goes="data"))
    if entry.entity:
        rows.append(Row("entity", ("--entity",), HELP["entity"] + " Needed.", goes="data"))
    rows.append(Row("weight", ("--weight",), HELP["weight"], goes="data"))
    rows.append(Row("formula", ("--formula",), HELP["formula"], goes="data"))
    if categorical:
        rows += [Row("categorical", ("--categorical",), CATEGORICAL_HELP, kind="choice",
                     goes="data", choices=CATEGORICAL_CHOICES),
                 Row("categorical_columns", ("--categorical-columns",),
                     HELP["categorical_columns"], goes="data")]
    return rows


def needed_columns(entry, values: dict[str, Any], command: str) -> None:
    """ValueError (one ``error:`` line) when the model needs ``--target`` or ``--entity`` and
    it is missing."""
    if entry.target and values.get("target") is None and not values.get("formula"):
        raise ValueError(f"{command} {entry.name} needs --target COLUMN (the response)")
    if entry.entity and values.get("entity") is None:
        raise ValueError(f"{command} {entry.name} needs --entity COLUMN (the entity of each row)")


def param_row() -> Row:
    """``--param NAME=VALUE`` (repeatable): any constructor parameter by its own name."""
    return Row("param", ("--param",), "A constructor parameter by its Python name, "
               "NAME=VALUE (VALUE read as JSON when it is JSON, else as text); repeat for "
               "several.", kind="list", metavar="NAME=VALUE")


# ---- commands -------------------------------------------------------------------------------
_ANNOTATIONS = {"flag": bool, "int": int, "float": float, "path": Path, "list": list[str]}


def _choice_enum(row: Row) -> type[enum.Enum]:
    return enum.Enum(f"{row.key}_choices", {c.replace("-", "_") or "empty": c
                                             for c in row.choices}, type=str)


def _annotation(row: Row):
    if row.kind == "choice":
        return _choice_enum(row) | None
    kind = _ANNOTATIONS.get(row.kind, str)
    return kind if row.required and row.kind != "flag" else kind | None


def _option(row: Row):
    default = ... if row.required else None
    kw: dict[str, Any] = {"help": row.help, "hidden": row.hidden, "show_default": False}
    if row.metavar and row.kind not in ("flag", "choice"):
        kw["metavar"] = row.metavar
    return typer.Option(default, *row.flags, **kw)


def build_command(name: str, rows: list[Row], callback, *, help: str,
                  short_help: str | None = None, arguments=()):
    """A typer command ``name`` whose options are ``rows`` (in order); ``callback(values)``
    gets ``{row.key: value}`` (None where an option was not given; a choice as its text).
    ``arguments``: ``(key, annotation, typer.Argument)`` before the options."""
    seen = [f for r in rows for f in r.flags]
    keys = [r.key for r in rows] + [a[0] for a in arguments]
    if len(seen) != len(set(seen)) or len(keys) != len(set(keys)):
        raise RuntimeError(f"{name}: an option appears twice in {seen} ({keys})")
    parameters, annotations = [], {}
    for key, ann, default in arguments:
        parameters.append(inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY,
                                            default=default, annotation=ann))
        annotations[key] = ann
    for row in rows:
        ann = _annotation(row)
        parameters.append(inspect.Parameter(row.key, inspect.Parameter.KEYWORD_ONLY,
                                            default=_option(row), annotation=ann))
        annotations[row.key] = ann

    def command(**values):
        return callback({k: v.value if isinstance(v, enum.Enum) else v
                         for k, v in values.items()})

    command.__signature__ = inspect.Signature(parameters)
    command.__annotations__ = annotations
    command.__name__ = name.replace("-", "_")
    sub = typer.Typer(add_completion=False)
    sub.command(name, help=help, short_help=short_help)(command)
    return typer.main.get_command(sub)
