"""The one registry of models: every list of models in fedlatent is derived from it.

A model registers itself where it is defined, twice over:

- its math (a :class:`~fedlatent.engine.contract.model.FederatedModel`) with :func:`register_model`,
  so any node can rebuild it from ``(name, JSON config)``;
- its estimator with :func:`register_estimator`, under a short name (``"gmm"``), with a one-line
  description; the package exports, the command line, the Flower app and error messages list
  what is registered here.

Models are found without a hand-kept list: a name is looked up first in
``fedlatent.models.<name>`` (one import, what a Flower client process needs), an estimator class
name in the one module whose source registers it (:func:`estimator_by_class_name`: a saved
model's class, ``fl.FedGMM``), and otherwise every module of the ``fedlatent.models`` package is
imported once (:func:`discover`). Adding a model is adding a module; no existing module
changes.

A deployment carries an estimator as ``(name, parameters as JSON, federation as JSON)``; the
server rebuilds it to run the fit and every node rebuilds it to validate its own data with the
estimator's own checks. No code and no pickle cross.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import json
import pkgutil
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "Case",
    "EstimatorEntry",
    "Example",
    "describe_message",
    "describer_from_config",
    "discover",
    "estimator_class",
    "estimator_config",
    "estimator_entries",
    "estimator_entry",
    "estimator_from_config",
    "estimator_name",
    "estimator_names",
    "example",
    "model_class",
    "model_from_config",
    "node_describer",
    "params_to_json",
    "reader_by_class_name",
    "register_describer",
    "register_estimator",
    "register_model",
    "register_reader",
]

MODELS_PACKAGE = "fedlatent.models"

_MODELS: dict[str, type] = {}
_ESTIMATORS: dict[str, EstimatorEntry] = {}
_READERS: dict[str, type] = {}
_DESCRIBERS: dict[str, type] = {}
_DISCOVERED = False


@dataclass(frozen=True)
class EstimatorEntry:
    """One registered estimator.

    Attributes
    ----------
    name : str
        Short name (``"gmm"``): the command line's ``fedlatent fit NAME`` and a deployment's
        ``estimator`` setting.
    cls : type
        The estimator class.
    description : str
        One line for listings.
    target : bool
        Whether a fit needs a target column ``y``.
    entity : bool
        Whether a fit needs an entity column (hierarchical data).
    example : str
        The module holding the model's :class:`Example` as ``EXAMPLE`` (default: the module
        ``example`` of the estimator's package); read by :meth:`load_example`.
    """

    name: str
    cls: type
    description: str = ""
    target: bool = False
    entity: bool = False
    example: str = ""

    def load_example(self) -> Example:
        """The model's :class:`Example` (imported on first use: the generic tests', the
        documentation's; a client process never needs it)."""
        module = self.example or self.cls.__module__.rsplit(".", 1)[0] + ".example"
        try:
            ex = importlib.import_module(module).EXAMPLE
        except (ModuleNotFoundError, AttributeError) as err:
            raise LookupError(f"estimator {self.name!r} has no example: define EXAMPLE (a "
                              f"fedlatent.engine.contract.registry.Example) in module {module!r}") \
                from err
        if not isinstance(ex, Example):
            raise TypeError(f"{module}.EXAMPLE is a {type(ex).__name__}, not an Example")
        return ex


@dataclass(frozen=True)
class Case:
    """One small problem: a federated dataset and a fresh estimator for it.

    Attributes
    ----------
    data : callable
        ``data() -> FederatedDataset``, small and synthetic (no download), the same every call.
    make : callable
        ``make() -> estimator``, a fresh unfitted estimator with small settings (few rounds, a
        fixed seed).
    """

    data: Callable[[], Any]
    make: Callable[[], Any]


@dataclass(frozen=True)
class Example:
    """What the generic tests need of a registered model, declared by the model's package.

    The estimator, command-line, save/load, fault and Flower tests are parametrized by the
    registry and read this: a new registered model with an ``EXAMPLE`` is covered without
    editing a test.

    Attributes
    ----------
    cases : mapping of str to Case
        ``"default"`` (required: the estimator, fault and command-line tests), and where the
        default does not suit them ``"flower"`` (a deployment: few messages, few rounds) and
        ``"saved"`` (save/load); :meth:`case` falls back to the default.
    predict : callable or None
        ``predict(est, X, fd) -> array`` for rows ``X`` (a DataFrame or array of ``fd``'s
        features) of ``fd``; None: ``est.predict(X)``.
    fitted : tuple of str
        The fitted arrays that must agree between runtimes (in-process, Flower); empty: the
        estimator's ``_save_arrays``.
    cli_args : tuple of str
        Options of ``fedlatent fit <name>`` beyond the data's (``--data``, ``--client``,
        ``--features``, ``--target``, ``--entity``, ``--out``) for a small fit of the default
        case's data, e.g. ``("-k", "2", "--max-rounds", "4")``.
    personalized : bool
        Whether predictions use per-client fitted state kept beside the saved model (FedGMM's
        client weights): the command line's then differ from a loaded model's
        ``predict_dataset``.
    """

    cases: Mapping[str, Case]
    predict: Callable[..., Any] | None = None
    fitted: tuple[str, ...] = ()
    cli_args: tuple[str, ...] = field(default_factory=tuple)
    personalized: bool = False

    def __post_init__(self):
        if "default" not in self.cases:
            raise ValueError("an Example needs a 'default' case")

    def case(self, kind: str = "default") -> Case:
        """The case of ``kind`` (``"default"``, ``"flower"``, ``"saved"``), or the default."""
        return self.cases.get(kind, self.cases["default"])

    def predict_rows(self, est, X, fd):
        """``est``'s predictions for rows ``X`` of ``fd`` (:attr:`predict`)."""
        return est.predict(X) if self.predict is None else self.predict(est, X, fd)

    def fitted_arrays(self, cls: type) -> tuple[str, ...]:
        """:attr:`fitted`, or the estimator class's saved arrays."""
        return self.fitted or tuple(cls._save_arrays)


def register_model(cls: type) -> type:
    """Class decorator: make a model's math constructible by name on any node."""
    if not getattr(cls, "name", None):
        raise TypeError(f"{cls.__name__} needs a class attribute 'name'")
    if getattr(getattr(cls, "reply_numbers", None), "undeclared", False):
        raise TypeError(
            f"model {cls.name!r} ({cls.__name__}) does not declare reply_numbers(data): the "
            "disclosure rule on saturation counts the free numbers of one round reply, and "
            "would be off for it. Define reply_numbers to return them (fedlatent.engine."
            "privacy.disclosure.free_numbers of the statistic shapes), or to return None "
            "where a round reply carries no per-record sums (say why in its docstring)")
    if getattr(getattr(cls, "evaluated_shapes", None), "undeclared", False):
        raise TypeError(
            f"model {cls.name!r} ({cls.__name__}) does not declare evaluated_shapes(data): a "
            "node refuses a round whose parameters have another shape than the setup "
            "declared, and cannot tell without it. Define evaluated_shapes to return the "
            "shape of every parameter that is not a scalar, for the model's configuration")
    _MODELS[cls.name] = cls
    return cls


def register_estimator(name: str, *, description: str = "", target: bool = False,
                       entity: bool = False, example: str = ""):
    """Class decorator: list an estimator under ``name`` (see :class:`EstimatorEntry`)."""

    def deco(cls: type) -> type:
        old = _ESTIMATORS.get(name)
        if old is not None and old.cls.__qualname__ != cls.__qualname__:
            raise ValueError(f"estimator name {name!r} is taken by {old.cls.__name__}")
        first_line = description or (inspect.getdoc(cls) or "").split("\n")[0]
        _ESTIMATORS[name] = EstimatorEntry(name, cls, first_line, target, entity, example)
        cls._estimator_name = name
        return cls

    return deco


def register_reader(cls: type) -> type:
    """Class decorator: a saved model's reader for prediction and scores alone, without its
    estimator class (:class:`fedlatent.engine.estimation.saved.SavedModel`), under the
    estimator's class name (which it shares)."""
    _READERS[cls.__name__] = cls
    return cls


def reader_by_class_name(class_name: str) -> type | None:
    """The reader registered for the saved estimator class ``class_name``, or None (read the
    model with its estimator). Only the module registering it is imported, found by reading
    the sources of ``fedlatent.models`` (:func:`_defining_module`)."""
    if class_name not in _READERS:
        module = _defining_module(reader=class_name)
        if module is not None:
            importlib.import_module(module)
    return _READERS.get(class_name)


def register_describer(name: str):
    """Class decorator: what a deployed node checks of its data and of the settings of the
    estimator ``name`` when the server asks ``describe``, without the estimator class (whose
    import costs scikit-learn, SciPy and pandas: about a CPU second in every node's first
    message). The class is built from the estimator's JSON parameters (as
    :func:`estimator_from_config` takes them) and has the estimator's ``capabilities`` and
    ``_describe_local(fd)``, refusing what the estimator refuses."""

    def deco(cls: type) -> type:
        _DESCRIBERS[name] = cls
        return cls

    return deco


def node_describer(name: str) -> type | None:
    """The class :func:`register_describer` registered for the estimator ``name``, or None
    (a node describes with the estimator itself). Only the module registering it is
    imported, found by reading the sources of ``fedlatent.models``."""
    if name not in _DESCRIBERS:
        module = _defining_module(describer=name)
        if module is not None:
            importlib.import_module(module)
    return _DESCRIBERS.get(name)


def _import_tree(module_name: str) -> None:
    """Import a module and, if it is a package, every module below it."""
    mod = importlib.import_module(module_name)
    for info in pkgutil.walk_packages(getattr(mod, "__path__", []), module_name + "."):
        importlib.import_module(info.name)


def discover() -> None:
    """Import every module of ``fedlatent.models`` once, so every model is registered."""
    global _DISCOVERED
    if not _DISCOVERED:
        _import_tree(MODELS_PACKAGE)
        _DISCOVERED = True


def _find(name: str, table: dict) -> None:
    """Make ``name`` present in ``table`` if a model defines it: first the module (or package)
    ``fedlatent.models.<name>`` alone, then the whole tree below it, then every model."""
    if name in table:
        return
    if isinstance(name, str) and name.isidentifier():
        module = f"{MODELS_PACKAGE}.{name}"
        try:
            importlib.import_module(module)
            if name not in table and table is _ESTIMATORS:  # the one module registering it
                where = _defining_module(estimator=name, package=module)
                if where is not None:
                    importlib.import_module(where)
            if name not in table:
                _import_tree(module)
        except ModuleNotFoundError as err:
            if err.name != module:
                raise
    if name not in table:
        discover()


# ---- engine models ----------------------------------------------------------------------------
def model_class(name: str) -> type:
    _find(name, _MODELS)
    if name not in _MODELS:
        raise KeyError(f"unknown model {name!r}; known: {sorted(_MODELS)}")
    return _MODELS[name]


def model_from_config(name: str, config: dict[str, Any]):
    """Rebuild a registered model from its name and JSON config, checked first by the model's
    :attr:`~fedlatent.engine.contract.model.FederatedModel.config_constraints` (ValueError
    naming the setting: a node builds only what the estimator would have accepted)."""
    from fedlatent.engine.contract.params import validate_params

    cls = model_class(name)
    validate_params(config, cls.config_constraints)
    return cls(**config)


# ---- estimators ---------------------------------------------------------------------------------
def estimator_entries(discover_all: bool = True) -> dict[str, EstimatorEntry]:
    """Every registered estimator, by short name (sorted); ``discover_all=False``: only those
    imported so far (nothing more is imported: ``estimator_class(name)`` finds one model)."""
    if discover_all:
        discover()
    return dict(sorted(_ESTIMATORS.items()))


def estimator_names() -> list[str]:
    """Every registered estimator's short name (sorted)."""
    return list(estimator_entries())


def example(name: str) -> Example:
    """The :class:`Example` of the registered estimator ``name``."""
    estimator_class(name)
    return _ESTIMATORS[name].load_example()


def estimator_entry(name: str) -> EstimatorEntry:
    """The :class:`EstimatorEntry` registered as ``name``, its module imported alone."""
    estimator_class(name)
    return _ESTIMATORS[name]


def estimator_class(name: str) -> type:
    _find(name, _ESTIMATORS)
    if name not in _ESTIMATORS:
        raise ValueError(f"unknown model {name!r}; known: {estimator_names()}")
    return _ESTIMATORS[name].cls


def estimator_by_class_name(class_name: str) -> type | None:
    """The registered estimator class called ``class_name`` (``"FedGMM"``), or None.

    Only the module defining it is imported (:func:`_defining_module`: a saved model, a
    command-line call, ``fl.FedGMM``: one model's import, not every model's); every model
    when no module of ``fedlatent.models`` defines it by that name."""
    for _ in range(2):
        for entry in list(_ESTIMATORS.values()):
            if entry.cls.__name__ == class_name:
                return entry.cls
        module = _defining_module(class_name)
        if module is None:
            break
        importlib.import_module(module)
    for entry in estimator_entries().values():
        if entry.cls.__name__ == class_name:
            return entry.cls
    return None


def _defining_module(class_name: str | None = None, *, estimator: str | None = None,
                     reader: str | None = None, describer: str | None = None,
                     package: str = MODELS_PACKAGE) -> str | None:
    """The module of ``package`` whose source registers an estimator class ``class_name`` (a
    ``class`` statement decorated with ``register_estimator``), an estimator under the short
    name ``estimator`` (``register_estimator("name", ...)``), a saved model's reader of the
    class ``reader`` (``@register_reader`` on ``class <reader>(``) or a node's describer of
    the estimator ``describer`` (``@register_describer("name")``), found by reading the
    sources, importing nothing; None when there is none (or the package is not on disk)."""
    name = class_name or estimator or reader or describer
    if not (isinstance(name, str) and name.isidentifier()):
        return None
    spec = importlib.util.find_spec(package)
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    if estimator is not None:
        wanted = re.compile(r"register_estimator\(\s*[\"']" + re.escape(name) + r"[\"']")
    elif reader is not None:
        wanted = re.compile(r"^@register_reader\s*\nclass " + re.escape(name) + r"\(", re.M)
    elif describer is not None:
        wanted = re.compile(r"^@register_describer\(\s*[\"']" + re.escape(name) + r"[\"']\)",
                            re.M)
    for root in map(Path, roots):
        for path in sorted(root.rglob("*.py")):
            try:
                text = path.read_text(encoding="utf-8")
            except OSError:
                continue
            if class_name is None:
                if wanted.search(text) is None:
                    continue
            elif "register_estimator" not in text or f"class {name}(" not in text or \
                    not _registers_class(text, name):
                continue
            parts = path.relative_to(root).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            return ".".join((package, *parts))
    return None


def _registers_class(text: str, class_name: str) -> bool:
    """Whether the source ``text`` defines ``class_name`` under ``register_estimator``."""
    return any(isinstance(node, ast.ClassDef) and node.name == class_name and any(
        "register_estimator" in ast.unparse(dec) for dec in node.decorator_list)
        for node in ast.parse(text).body)


def estimator_name(est) -> str:
    """The registered short name of an estimator (instance or class)."""
    cls = est if isinstance(est, type) else type(est)
    name = getattr(cls, "_estimator_name", None)
    if name is None or _ESTIMATORS.get(name, None) is None:
        known = [e.cls.__name__ for e in estimator_entries().values()]
        raise ValueError(f"{cls.__name__} is not a registered estimator; known: {known}")
    return name


def _init_params(est) -> dict[str, Any]:
    sig = inspect.signature(type(est).__init__)
    return {k: getattr(est, k) for k in sig.parameters if k not in ("self",)}


def params_to_json(params: dict[str, Any], strict: bool = True, owner: str = "") -> dict[str, Any]:
    """Constructor parameters as JSON values: the one way settings are written (saved models,
    deployments). Arrays become lists, the federation its config.

    A value that JSON cannot hold raises ValueError naming it (``strict``), or is written as
    its ``repr`` (not ``strict``: a saved model records what it was fitted with).
    """
    out: dict[str, Any] = {}
    for k, v in params.items():
        if k == "federation":
            out[k] = v.to_config() if v is not None else None
            continue
        if hasattr(v, "tolist") and not isinstance(v, str):
            v = v.tolist()
        try:
            json.dumps(v)
        except TypeError:
            if strict:
                raise ValueError(
                    f"{owner}({k}=...) is a {type(v).__name__}, which cannot be written as "
                    "JSON; a deployment rebuilds the estimator from JSON parameters: give it "
                    "by name or as numbers"
                ) from None
            v = repr(v)
        out[k] = v
    return out


def estimator_config(est) -> tuple[str, dict[str, Any]]:
    """``(name, params)`` with JSON-able params; the federation goes under ``"federation"``.

    Raises ValueError naming a parameter that cannot be written as JSON (a Python object such as
    a scikit-learn regressor): a deployment rebuilds the estimator from its parameters.
    """
    name = estimator_name(est)
    params = _init_params(est)
    fed = params.get("federation")
    if fed is not None and callable(fed.step_size):
        raise ValueError(
            "Federation(step_size=callable) cannot travel to a deployment; give a number"
        )
    return name, params_to_json(params, strict=True, owner=type(est).__name__)


def estimator_from_config(name: str, params: dict[str, Any]):
    """The estimator of :func:`estimator_config`'s output."""
    return estimator_class(name)(**_federation_built(params))


def describer_from_config(name: str, params: dict[str, Any]):
    """What a node's ``describe`` checks with, from :func:`estimator_config`'s output: the
    describer registered for ``name`` (:func:`register_describer`: no scikit-learn), else
    the estimator (:func:`estimator_from_config`)."""
    cls = node_describer(name)
    return estimator_from_config(name, params) if cls is None else cls(
        **_federation_built(params))


def _federation_built(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` with the federation's config (JSON) built into a ``Federation``."""
    from fedlatent.engine.fedem.federation import Federation

    params = dict(params)
    if "federation" in params:
        fed = params.pop("federation")
        params["federation"] = Federation.from_config(fed) if fed is not None else None
    return params


def describe_message(estimator) -> dict[str, Any]:
    """The ``describe`` message for ``estimator``: its registry name and JSON parameters."""
    name, params = estimator_config(estimator)
    return {"estimator": name, "estimator_params": json.dumps(params)}
