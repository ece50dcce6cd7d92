"""Declarative validation of constructor parameters (scikit-learn's ``_parameter_constraints``).

An estimator lists, for each constructor parameter, what it may be::

    _parameter_constraints = {
        "n_components": [Integer(1)],
        "covariance_type": [Options("full", "tied", "diag", "spherical")],
        "reg_covar": [Real(0)],
        "weights_init": [None, "array-like"],
    }

and :func:`validate_params` checks them at ``fit`` (never in ``__init__``, and never writing back
into the parameters), raising ``ValueError("reg_covar must be a number >= 0, got -1")``.
Cross-parameter checks ("burn_in < max_rounds") stay in the estimator's ``_check_params`` hook.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from numbers import Integral
from numbers import Real as _Real
from typing import Any, ClassVar

import numpy as np

__all__ = ["ROUND_LOOP", "Constraint", "Instance", "Integer", "Options", "Real",
           "store_params", "validate_params"]


class Constraint:
    """One allowed form of a parameter: ``ok(value)`` and words for the error message."""

    desc: str = ""

    def ok(self, value: Any) -> bool:  # pragma: no cover - overridden
        raise NotImplementedError


def _bound_words(low, high, closed: str, noun: str) -> str:
    lo_in = closed in ("both", "left")
    hi_in = closed in ("both", "right")
    pre = f"{noun} " if noun else ""
    if low is not None and high is not None:
        return f"{pre}in {'[' if lo_in else '('}{low}, {high}{']' if hi_in else ')'}"
    if low is not None:
        return f"{pre}{'>=' if lo_in else '>'} {low}"
    if high is not None:
        return f"{pre}{'<=' if hi_in else '<'} {high}"
    return noun or "a number"


@dataclass(frozen=True)
class _Ranged(Constraint):
    """A number in a range; ``desc`` defaults to words for the range (with ``_noun``)."""

    low: float | None = None
    high: float | None = None
    closed: str = "both"
    desc: str = ""
    _noun: ClassVar[str] = ""

    def __post_init__(self):
        if not self.desc:
            words = _bound_words(self.low, self.high, self.closed, self._noun)
            object.__setattr__(self, "desc", words)


@dataclass(frozen=True)
class Integer(_Ranged):
    """An integer (not a bool) in a range."""

    _noun: ClassVar[str] = "an integer"

    def ok(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, Integral):
            return False
        return _in_range(value, self.low, self.high, self.closed)


@dataclass(frozen=True)
class Real(_Ranged):
    """A finite real number (not a bool) in a range."""

    def ok(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, _Real):
            return False
        if not math.isfinite(float(value)):
            return False
        return _in_range(float(value), self.low, self.high, self.closed)


def _in_range(v, low, high, closed: str) -> bool:
    if low is not None and (v < low or (v == low and closed not in ("both", "left"))):
        return False
    if high is not None and (v > high or (v == high and closed not in ("both", "right"))):
        return False
    return True


class Options(Constraint):
    """One of a few values."""

    def __init__(self, *values: Any, desc: str = ""):
        self.values = values
        if not desc:
            desc = " or ".join(map(repr, values)) if len(values) <= 2 else f"one of {values}"
        self.desc = desc

    def ok(self, value: Any) -> bool:
        return any(value == v and type(value) is type(v) for v in self.values) or (
            isinstance(value, str) and value in self.values
        )


class Instance(Constraint):
    """An instance of one of ``types``."""

    def __init__(self, *types: type, desc: str = ""):
        self.types = types
        self.desc = desc or " or ".join(f"a {t.__name__}" for t in types)

    def ok(self, value: Any) -> bool:
        return isinstance(value, self.types)


class _Special(Constraint):
    def __init__(self, desc: str, test: Callable[[Any], bool]):
        self.desc = desc
        self._test = test

    def ok(self, value: Any) -> bool:
        return self._test(value)


def _array_like(v: Any) -> bool:
    if isinstance(v, str | bytes | Mapping):
        return False
    try:
        a = np.asarray(v, dtype=np.float64)
    except (TypeError, ValueError):
        return False
    return a.ndim >= 1 and bool(np.all(np.isfinite(a)))


_SPECIAL = {
    None: _Special("None", lambda v: v is None),
    "boolean": _Special("True or False", lambda v: isinstance(v, bool | np.bool_)),
    "array-like": _Special("an array of finite numbers", _array_like),
    "random_state": _Special(
        "None, an integer or a numpy Generator",
        lambda v: v is None or isinstance(v, np.random.Generator | np.random.RandomState)
        or (isinstance(v, Integral) and not isinstance(v, bool) and int(v) >= 0),
    ),
    "callable": _Special("a callable", callable),
}


def _as_constraint(c: Any) -> Constraint:
    if isinstance(c, Constraint):
        return c
    if isinstance(c, type):
        return Instance(c)
    if c in _SPECIAL:
        return _SPECIAL[c]
    raise TypeError(f"unknown parameter constraint {c!r}")


def store_params(est: Any, args: Mapping[str, Any]) -> None:
    """Store ``__init__``'s arguments unchanged on ``est`` (scikit-learn's rule: ``__init__``
    only stores them; validation happens in ``fit``).

    Parameters
    ----------
    est : estimator
        The instance being built.
    args : mapping
        ``locals()`` of the ``__init__`` that calls this. Every parameter of that ``__init__``
        (read from its code, so neither ``self`` nor a closure's names) is set from it: a
        parameter added to the signature is stored without another line, and a subclass calling
        ``super().__init__(...)`` stores the base class's parameters too.
    """
    code = inspect.currentframe().f_back.f_code
    for name in code.co_varnames[1:code.co_argcount + code.co_kwonlyargcount]:
        setattr(est, name, args[name])


def validate_params(params: Mapping[str, Any], constraints: Mapping[str, Sequence[Any]]) -> None:
    """Raise ValueError for the first parameter that fits none of its constraints.

    Parameters
    ----------
    params : dict
        Parameter values (``est.get_params(deep=False)``).
    constraints : dict of str to list
        Allowed forms: Constraint objects, types, None, "boolean", "array-like",
        "random_state", "callable".
    """
    for name, allowed in constraints.items():
        if name not in params:
            continue
        value = params[name]
        forms = [_as_constraint(c) for c in allowed]
        if not any(f.ok(value) for f in forms):
            words = " or ".join(f.desc for f in forms)
            raise ValueError(f"{name} must be {words}, got {value!r}")


#: Constraints of the parameters every estimator fitted by the round loop shares; spread into a
#: model's table: ``_parameter_constraints = {**ROUND_LOOP, "n_components": [Integer(1)]}``
#: (an entry of the model's own wins; a name the estimator does not have is skipped).
ROUND_LOOP: dict[str, list[Any]] = {
    "max_rounds": [Integer(1)],
    "tol": [Real(0)],
    "random_state": ["random_state"],
    "verbose": [None, "boolean"],
}
