"""The values of a model's options (:mod:`.options`) as its estimator: one path for ``fit``,
``flower local`` and ``flower app``.

:func:`build_estimator` takes the command's values by row key (None: not given) and
``--param NAME=VALUE`` items, and returns the estimator: each parameter option converted by its
kind (``-k auto``, ``--delta 0.5``, ``--means-init '[[0, 0], [3, 3]]'``, ``--candidates
lasso_cv,rf``), the Federation settings gathered into one validated
:class:`~fedlatent.engine.fedem.federation.Federation` (``--privacy epsilon=1,delta=1e-5,clip=3``,
``--disclosure off``, ``--min-records 5``, ``--acceleration squarem``), ``--seed`` 0 unless
given. A parameter given twice (its option and ``--param``, or ``--params`` JSON) with two
values is an error; an old spelling works with a ``FutureWarning``.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import fields, replace
from typing import Any

from .common import fail
from .options import Row, auto_value, constructor_parameters, flag_of, model_table

__all__ = ["build_estimator", "deprecated", "federation_with", "fit_keywords",
           "number_or_auto", "parse_params", "split_top"]

#: spellings of ``--param`` whose option the table has under another name (warned once)
_OFF = ("off", "none", "no", "false")


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
        noun = "a whole number" if kind is int else "a number"
        raise ValueError(f"{option} must be {noun} or 'auto', got {value!r}") from None


def split_top(text: str) -> list[str]:
    """``"a=1,b=[1,2]"`` -> ``["a=1", "b=[1,2]"]``: commas inside brackets stay."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += (ch in "([{") - (ch in ")]}")
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _json_or_text(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw.strip()


def _value(raw: str) -> Any:
    """JSON when it parses, else a comma-separated list (each item JSON or text), else text."""
    try:
        return json.loads(raw)
    except ValueError:
        items = split_top(raw)
        return [_json_or_text(i) for i in items] if len(items) > 1 else raw.strip()


def _bool_or_auto(raw: str, flag: str) -> Any:
    low = raw.strip().lower()
    table = {"yes": True, "true": True, "on": True, "1": True, "no": False, "false": False,
             "off": False, "0": False, "auto": "auto"}
    if low not in table:
        raise ValueError(f"{flag} must be yes, no or auto, got {raw!r}")
    return table[low]


def convert(entry, row: Row, raw: Any) -> Any:
    """The value of ``row``'s option as its parameter (ValueError names the option)."""
    flag = row.flag
    if row.kind == "count":
        if str(raw).strip() == "auto":
            meaning = auto_value(entry.cls, row.name)
            if meaning is ...:
                raise ValueError(f"{flag} auto: {entry.cls.__name__} does not choose it; give "
                                 "a whole number")
            return meaning
        return number_or_auto(raw, flag, int)
    if row.kind == "number-or-auto":
        return number_or_auto(raw, flag)
    if row.kind == "bool-or-auto":
        return _bool_or_auto(raw, flag)
    if row.kind == "value":
        return _value(raw)
    return raw


# ---- --param and the deprecated JSON -------------------------------------------------------
def _takes_any_keyword(cls: type) -> bool:
    import inspect

    return any(p.kind == p.VAR_KEYWORD
               for p in inspect.signature(cls.__init__).parameters.values())


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
        out[key] = _federation_object(_json_or_text(raw)) if key == "federation" \
            else _json_or_text(raw)
    return out


#: constructor parameters whose ``--param`` spelling is deprecated (their option is shared)
_SHARED_SPELLING = {"n_components": "--components", "n_clusters": "--components",
                    "n_input_components": "--components", "max_rounds": "--max-rounds",
                    "tol": "--tol"}


def _federation_object(value):
    from ..engine.fedem.federation import Federation

    if isinstance(value, dict):
        return Federation.from_config(value)
    return value


# ---- Federation -----------------------------------------------------------------------------
def _pairs(text: str, cls: type, flag: str, example: str) -> dict[str, Any]:
    """``"a=1,b=x"`` -> keywords of ``cls`` (a dataclass), naming an unknown or missing key."""
    import inspect

    known = [f.name for f in fields(cls) if not f.name.startswith("_")]
    kw: dict[str, Any] = {}
    for item in split_top(text):
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{flag} expects KEY=VALUE pairs like {example!r}, got {item!r}")
        if key.strip() not in known:
            raise ValueError(f"{flag}: unknown key {key.strip()!r}; its keys: "
                             f"{', '.join(known)}")
        kw[key.strip()] = _json_or_text(raw)
    required = [k for k, p in inspect.signature(cls).parameters.items()
                if p.default is p.empty and k not in kw]
    if required:
        raise ValueError(f"{flag} needs {' and '.join(required)} too, e.g. {example!r}")
    return kw


def _disclosure(config: dict, raw: str) -> dict:
    from ..engine.privacy.disclosure import DisclosurePolicy
    from ..engine.privacy.enforce import policy_from_config, policy_to_json

    if raw.strip().lower() in _OFF:
        policy = DisclosurePolicy.off()
    else:
        base = policy_from_config(config.get("disclosure"))
        fixed = {k: (float("inf") if v == "inf" else v)
                 for k, v in _pairs(raw, DisclosurePolicy, "--disclosure",
                                    "min_records=5").items()}
        policy = replace(base, **fixed)
    return json.loads(policy_to_json(policy))


def _setting(config: dict, name: str, raw: Any) -> None:
    """Set Federation setting ``name`` of ``config`` from its option's value."""
    from ..engine.fedem.federation import Spider
    from ..engine.privacy.dp import DifferentialPrivacy

    if name == "quantizer":
        config["quantizer"] = {"levels": int(raw)} if raw else None
    elif name == "variance_reduction":
        config[name] = None if str(raw).lower() in _OFF else \
            _pairs(raw, Spider, "--variance-reduction", "inner_rounds=10,batch_size=32")
    elif name == "privacy":
        config[name] = None if str(raw).lower() in _OFF else DifferentialPrivacy(**_pairs(
            raw, DifferentialPrivacy, "--privacy", "epsilon=1,delta=1e-5,clip=3")).to_config()
    elif name == "disclosure":
        config[name] = _disclosure(config, raw)
    elif name == "min_records":
        config["disclosure"] = _disclosure(config, f"min_records={int(raw)}")
    elif name == "acceleration":
        config[name] = None if raw == "none" else raw
    else:
        config[name] = raw


def federation_with(fed, given: dict[str, Any]):
    """``fed`` (a Federation or None) with the settings ``given`` (by name; the disclosure
    policy before ``min_records``), validated."""
    from ..engine.fedem.federation import Federation

    config = (Federation() if fed is None else fed).to_config()
    for name in sorted(given, key=lambda n: n == "min_records"):
        _setting(config, name, given[name])
    out = Federation.from_config(config)
    out.validate()
    return out


# ---- the estimator --------------------------------------------------------------------------
def _put(params: dict, name: str, value: Any, flag: str, source: str) -> None:
    if name in params and params[name] != value:
        raise ValueError(f"{flag} {value!r} and {name}={params[name]!r} of {source} disagree; "
                         "give it once")
    params[name] = value


def build_estimator(entry, values: dict[str, Any], param: list[str] | None = None,
                    base: dict[str, Any] | None = None):
    """The estimator of ``entry`` from a command's ``values`` (by row key), ``--param`` items
    and ``base`` (the deprecated ``--params`` JSON); ValueError names the option at fault."""
    params = dict(base or {})
    if isinstance(params.get("federation"), dict):
        params["federation"] = _federation_object(params["federation"])
    source = "--params" if base else "--param"
    for key, value in parse_params(param, entry.cls, entry.name).items():
        _put(params, key, value, f"--param {key}=", "--params")
    given_fed: dict[str, Any] = {}
    for row in model_table(entry):
        raw = values.get(row.key)
        if raw is None:
            continue
        if row.hidden:
            deprecated(row.flags[0], flag_of(row.name) if row.name != "n_clusters"
                       and row.name != "n_input_components" else "--components/-k")
        if row.goes == "federation":
            given_fed[row.name] = raw
        else:
            _put(params, row.name, convert(entry, row, raw), row.flag, source)
    if "random_state" in constructor_parameters(entry.cls):
        params.setdefault("random_state", 0)  # the command line is reproducible by default
    if given_fed:
        params["federation"] = federation_with(params.get("federation"), given_fed)
    return _construct(entry, params)


def _construct(entry, params: dict[str, Any]):
    known = constructor_parameters(entry.cls)
    missing = [k for k, p in known.items() if p.default is p.empty and k not in params]
    if missing:
        count = "--components" if missing[0] in _SHARED_SPELLING else flag_of(missing[0])
        fail(f"fit {entry.name} needs {count} VALUE")
    return entry.cls(**params)


def fit_keywords(values: dict[str, Any]) -> dict[str, Any]:
    """The keywords of ``est.fit`` the command's values give (``--checkpoint``...)."""
    out = {k: values[k] for k in ("checkpoint", "checkpoint_every", "resume", "progress")
           if values.get(k) is not None}
    if out.get("resume") and "checkpoint" not in out:
        raise ValueError("--resume needs --checkpoint PATH (the checkpoint to continue from)")
    if "checkpoint" in out:
        out["checkpoint"] = str(out["checkpoint"])
    return out
