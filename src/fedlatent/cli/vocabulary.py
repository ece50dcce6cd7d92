"""One command-line vocabulary: the options every ``fit`` command and ``flower local``/``app``
share, under the same names, mapped onto the estimator's own constructor parameters.

============================  =====================================================
option                        estimator parameter
============================  =====================================================
``--components/-k``           the count: ``n_components``, ``n_clusters`` (HLCR, SEC),
                              ``n_input_components`` (FedGMM); a number or ``auto``
``--participation``           ``Federation(participation=...)``
``--step-size``               ``Federation(step_size=...)``
``--quantize LEVELS``         ``Federation(quantizer=Quantizer(LEVELS))``
``--control-variates/--no-``  ``Federation(control_variates=...)``
``--secure-aggregation/--no-``  ``Federation(secure_aggregation=...)``
``--privacy K=V,...``         ``Federation(privacy=DifferentialPrivacy(K=V, ...))``
``--seed``                    ``random_state``
``--max-rounds``              ``max_rounds``
``--tol``                     ``tol``
``--progress/--no-progress``  ``verbose``
``--weight COLUMN``           not a parameter: the data's frequency-weight column
                              (``FederatedDataset.from_pandas(..., weight=COLUMN)``)
``--formula "y ~ x | z"``     not a parameter: the data's design from a formula
                              (``FederatedDataset.from_pandas(..., formula=...)``)
============================  =====================================================

A command that declares one of these options itself uses it directly; :func:`with_shared` adds
the others (so every command has them all) and hands their values to :func:`apply_shared`
through :data:`SHARED` while the command runs. An option the estimator has no parameter for is
ignored with a ``warning:`` line.
"""

from __future__ import annotations

import contextvars
import functools
import json
import warnings
from typing import Annotated, Any

import typer

__all__ = ["COUNT_PARAMETERS", "SHARED", "SHARED_FLAGS", "apply_shared", "deprecated",
           "number_or_auto", "shared_params", "with_shared"]

#: the estimator parameters ``--components`` sets, the first the constructor has
COUNT_PARAMETERS = ("n_components", "n_clusters", "n_input_components")
#: the values of the shared options the running command did not declare itself
SHARED: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("shared",
                                                                              default=None)
_FEDERATION_KEYS = ("participation", "step_size", "quantize", "control_variates",
                    "secure_aggregation", "privacy")
_DIRECT = {"seed": "random_state", "max_rounds": "max_rounds", "tol": "tol",
           "progress": "verbose"}


def _shared_options(
    components: Annotated[str | None, typer.Option(
        "--components", "-k", help="Number of components (clusters), or 'auto' where the "
                                   "model chooses it.")] = None,
    participation: Annotated[float | None, typer.Option(
        "--participation", help="Probability that a client takes part in a round.")] = None,
    step_size: Annotated[float | None, typer.Option(
        "--step-size", help="Stochastic-approximation step (FedHLCR's gamma).")] = None,
    quantize: Annotated[int | None, typer.Option(
        "--quantize", help="Quantizer levels (compression); none by default.")] = None,
    control_variates: Annotated[bool | None, typer.Option(
        "--control-variates/--no-control-variates",
        help="Per-client control variates (FedEM); off: naive FedEM.")] = None,
    secure_aggregation: Annotated[bool | None, typer.Option(
        "--secure-aggregation/--no-secure-aggregation",
        help="The server learns only sums of the clients' replies.")] = None,
    privacy: Annotated[str | None, typer.Option(
        "--privacy", help="Differential privacy, KEY=VALUE pairs of DifferentialPrivacy, e.g. "
                          "'epsilon=1,delta=1e-5,clip=3'.")] = None,
    seed: Annotated[int | None, typer.Option(
        "--seed", help="Seed of every random draw of the run.")] = None,
    max_rounds: Annotated[int | None, typer.Option(
        "--max-rounds", help="Rounds (iterations, sweeps) at most.")] = None,
    tol: Annotated[float | None, typer.Option(
        "--tol", help="Convergence tolerance of the objective.")] = None,
    progress: Annotated[bool | None, typer.Option(
        "--progress/--no-progress", help="Progress bars (default: on a terminal).")] = None,
    weight: Annotated[str | None, typer.Option(
        "--weight", help="Column of frequency weights (a row of weight 2 counts as the row "
                         "twice; disclosure control still counts rows).")] = None,
    formula: Annotated[str | None, typer.Option(
        "--formula", help="The design from a formula, e.g. 'y ~ x1 + C(sex) + x1:x2' (after "
                          "'|': concomitant variables); the target is its response, --features "
                          "columns kept beside it (an offset, trials).")] = None,
) -> None:
    """The shared options (a function only typer reads)."""


@functools.cache
def _params() -> tuple:
    sub = typer.Typer(add_completion=False)
    sub.command("options")(_shared_options)
    return tuple(typer.main.get_command(sub).params)


def shared_params() -> list:
    """The shared options as parameters built by typer (of the click typer runs on)."""
    return list(_params())


#: the long flag of every shared option, by parameter name
SHARED_FLAGS: dict[str, str] = {}


def _flags() -> dict[str, str]:
    if not SHARED_FLAGS:
        SHARED_FLAGS.update({p.name: p.opts[0] for p in shared_params()})
    return SHARED_FLAGS


def with_shared(cmd):
    """``cmd`` with every shared option it does not declare (once); their values are in
    :data:`SHARED` while it runs."""
    if cmd.callback is None or getattr(cmd, "_fedlatent_shared", False):
        return cmd
    have = {o for p in cmd.params for o in p.opts}
    added = [p for p in shared_params() if not have.intersection(p.opts)]
    cmd.params.extend(added)
    names = {p.name for p in added}
    inner = cmd.callback

    @functools.wraps(inner)
    def callback(*args, **kwargs):
        given = {k: kwargs.pop(k) for k in names}
        token = SHARED.set({k: v for k, v in given.items() if v is not None})
        try:
            return inner(*args, **kwargs)
        finally:
            SHARED.reset(token)

    cmd.callback = callback
    cmd._fedlatent_shared = True
    return cmd


def deprecated(old: str, new: str) -> None:
    """A ``warning:`` line: ``old`` still works for one release; ``new`` is the spelling."""
    warnings.warn(f"{old} is deprecated and will be removed in the next release; use {new}",
                  FutureWarning, stacklevel=2)


def number_or_auto(value, option: str, kind=float):
    """``value`` as a number of ``kind``, or the string 'auto' (the estimator chooses)."""
    if value is None or value == "auto" or isinstance(value, int | float):
        return value
    try:
        return kind(value)
    except ValueError:
        raise ValueError(f"{option} must be a number or 'auto', got {value!r}") from None


def _privacy(text: str, as_config: bool):
    from ..engine.privacy import DifferentialPrivacy

    kw: dict[str, Any] = {}
    for item in text.split(","):
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--privacy expects KEY=VALUE pairs like 'epsilon=1,delta=1e-5,"
                             f"clip=3', got {item!r}")
        try:
            kw[key.strip()] = json.loads(raw)
        except ValueError:
            kw[key.strip()] = raw.strip()
    try:
        dp = DifferentialPrivacy(**kw)
    except TypeError as err:
        raise ValueError(f"--privacy: {err}") from None
    return dp.to_config() if as_config else dp


def _federation(fed, given: dict[str, Any], as_config: bool):
    """``fed`` (a Federation, its config dict, or None) with the given shared settings."""
    from ..engine.fedem.federation import Federation

    config = dict(fed) if isinstance(fed, dict) else (
        Federation().to_config() if fed is None else fed.to_config())
    for key in _FEDERATION_KEYS:
        if key not in given:
            continue
        if key == "quantize":
            config["quantizer"] = {"levels": int(given[key])} if given[key] else None
        elif key == "privacy":
            config["privacy"] = _privacy(given[key], as_config=True)
        else:
            config[key] = given[key]
    if as_config:
        return config
    out = Federation.from_config(config)
    out.validate()
    return out


def apply_shared(cls: type, params: dict[str, Any], given: dict[str, Any], *,
                 as_config: bool = False) -> dict[str, Any]:
    """``params`` (constructor keywords of ``cls``) with the shared options ``given`` (by
    parameter name; None: not given) set; ``as_config``: the federation stays a JSON dict."""
    import inspect

    known = inspect.signature(cls.__init__).parameters
    given = {k: v for k, v in (given or {}).items() if v is not None}
    out = dict(params)
    targets = {**_DIRECT}
    count = next((c for c in COUNT_PARAMETERS if c in known), None)
    if count is not None:
        targets["components"] = count
    for opt, key in targets.items():
        if opt not in given:
            continue
        if key not in known:
            warnings.warn(f"{cls.__name__} has no {key}; {_flags()[opt]} is ignored",
                          stacklevel=2)
            continue
        if key in out and out[key] != given[opt]:
            raise ValueError(f"{_flags()[opt]} and the parameter {key}={out[key]!r} disagree; "
                             "give it once")
        value = given[opt]
        out[key] = number_or_auto(value, "--components", int) if opt == "components" else value
    if "components" in given and count is None:
        warnings.warn(f"{cls.__name__} has no number of components; --components is ignored",
                      stacklevel=2)
    fed_given = {k: given[k] for k in _FEDERATION_KEYS if k in given}
    if fed_given:
        if "federation" not in known:
            raise ValueError(f"{cls.__name__} takes no federation settings: leave out "
                             + ", ".join(_flags()[k] for k in fed_given))
        out["federation"] = _federation(out.get("federation"), fed_given, as_config)
    return out
