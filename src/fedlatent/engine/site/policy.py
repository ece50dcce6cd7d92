"""A site's own policy: the floors its operator sets, whatever the server asks.

The operator writes a TOML file (``docs/site-operators.md`` documents every key;
``examples/site-policy.toml`` is a commented example) and gives it to the node:
``ClientNode(..., policy=SitePolicy.load(path))`` in-process, the node config key
``policy-path`` of a Flower SuperNode, or one file per partition in a simulation.
``fedlatent site check FILE`` validates a file.

Tables and keys (hyphens and underscores are the same):

``[site]``            ``name``, ``simulation`` (bool: only then is a server's ``noise_seed``
                      honoured), ``directory`` (where the ledger lives), ``roster`` and
                      ``signing-key`` (paths, for authenticated peers)
``[disclosure]``      the :class:`~fedlatent.engine.privacy.disclosure.DisclosurePolicy` floor
``[secure-aggregation]`` ``required`` (bool)
``[privacy]``         ``required`` (bool), ``max-epsilon``, ``max-delta`` (per fit),
                      ``lifetime-epsilon``, ``lifetime-delta`` (per data set, across fits)
``[answer]``          ``models`` and ``exchanges`` the site answers (absent: all)
``[datasets]``        name = local file (the server names a data set, never a path)
``[sec]``             ``evaluate-others`` (bool; not set: only with a pinned roster),
                      ``trusted-types`` (list), ``quota``
                      (distinct models evaluated per run; default: one per rostered site)
``[limits]``          ``max-message-bytes``, ``max-rounds``, ``max-releases``, ``max-points``
                      (extra points a round of accelerated EM may ask: 0 refuses them)

Relative paths are relative to the policy file's directory. No file: no policy (the node
behaves as it always did, so nothing gets looser).
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from fedlatent.engine.privacy.disclosure import DisclosurePolicy

__all__ = ["PolicyError", "SitePolicy"]

_TABLES = {
    "site": {"name", "simulation", "directory", "roster", "signing_key"},
    "disclosure": {f.name for f in fields(DisclosurePolicy)},
    "secure_aggregation": {"required"},
    "privacy": {"required", "max_epsilon", "max_delta", "lifetime_epsilon", "lifetime_delta"},
    "answer": {"models", "exchanges"},
    "datasets": None,  # any name
    "sec": {"evaluate_others", "trusted_types", "quota"},
    "limits": {"max_message_bytes", "max_rounds", "max_releases", "max_points"},
}
#: (attribute, key in the file) of what ``describe`` lists after the disclosure floor
_DESCRIBED = tuple((a, f"{t}.{k.replace('_', '-')}") for a, t, k in (
    ("max_epsilon", "privacy", "max_epsilon"), ("max_delta", "privacy", "max_delta"),
    ("lifetime_epsilon", "privacy", "lifetime_epsilon"),
    ("lifetime_delta", "privacy", "lifetime_delta"), ("models", "answer", "models"),
    ("exchanges", "answer", "exchanges"), ("sec_evaluate_others", "sec", "evaluate_others"),
    ("sec_trusted_types", "sec", "trusted_types"), ("sec_quota", "sec", "quota"),
    ("max_message_bytes", "limits", "max_message_bytes"),
    ("max_rounds", "limits", "max_rounds"), ("max_releases", "limits", "max_releases"),
    ("max_points", "limits", "max_points"),
    ("roster", "site", "roster"), ("signing_key", "site", "signing_key")))
#: exchanges every site answers (the protocol itself: no data cross in them)
PROTOCOL_EXCHANGES = ("setup", "describe", "secagg")


class PolicyError(ValueError):
    """A policy file that cannot be used; the message names the file and the key."""


def _norm(d: dict[str, Any]) -> dict[str, Any]:
    return {str(k).replace("-", "_"): v for k, v in d.items()}


@dataclass(frozen=True)
class SitePolicy:
    """The floors of one site (see the module docstring for the file's keys).

    Attributes
    ----------
    name : str
        The site's name in refusals and its ledger ("" : the client id).
    simulation : bool
        Only a simulation site honours a server's ``noise_seed``.
    directory : Path or None
        The site directory holding the ledger (None: an in-memory ledger).
    disclosure : DisclosurePolicy
        The disclosure floor (a server's policy may be stricter, never looser).
    secure_aggregation_required, privacy_required : bool
    max_epsilon, max_delta : float or None
        Ceilings of one fit's budget.
    lifetime_epsilon, lifetime_delta : float or None
        The budget of every fit on one data set, composed.
    models, exchanges : tuple of str or None
        What the site answers (None: everything).
    datasets : dict of str to Path
        Data sets by name.
    sec_evaluate_others : bool or None
        Whether the site evaluates other parties' SEC models: None (not set) only with a
        pinned roster (a model must then be signed by a rostered site); True also without one
        (the operator accepts models the server may have made); False never.
    sec_trusted_types : tuple of str or None
        The estimator types a SEC model may contain: built-in candidate names (``"linear"``:
        what a fitted one contains), full type names as skops writes them, or module prefixes
        (``"sklearn.linear_model"``). None: SEC's own allow-list.
    sec_quota : int or None
        Most distinct SEC models evaluated per run (None: one per rostered site).
    max_message_bytes, max_rounds, max_releases : int or None
    max_points : int or None
        Most extra points a round may ask (a multi-point round of accelerated EM: each
        point is one more statistic in the reply); 0 refuses them; None: no cap beyond the
        saturation rule, which counts every point.
    roster, signing_key : Path or None
        For authenticated peers (read by :mod:`fedlatent.engine.site.keys`).
    source : Path or None
        The file the policy was read from.
    """

    name: str = ""
    simulation: bool = False
    directory: Path | None = None
    disclosure: DisclosurePolicy = field(default_factory=DisclosurePolicy)
    secure_aggregation_required: bool = False
    privacy_required: bool = False
    max_epsilon: float | None = None
    max_delta: float | None = None
    lifetime_epsilon: float | None = None
    lifetime_delta: float | None = None
    models: tuple[str, ...] | None = None
    exchanges: tuple[str, ...] | None = None
    datasets: dict[str, Path] = field(default_factory=dict)
    sec_evaluate_others: bool | None = None
    sec_trusted_types: tuple[str, ...] | None = None
    sec_quota: int | None = None
    max_message_bytes: int | None = None
    max_rounds: int | None = None
    max_releases: int | None = None
    max_points: int | None = None
    roster: Path | None = None
    signing_key: Path | None = None
    source: Path | None = None

    # ---- reading -------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | Path) -> SitePolicy:
        """Read and check a policy file; :class:`PolicyError` names the file and the key."""
        path = Path(path)
        try:
            doc = tomllib.loads(path.read_text(encoding="utf-8"))
        except OSError as err:
            raise PolicyError(f"site policy {path}: cannot read it ({err})") from err
        except tomllib.TOMLDecodeError as err:
            raise PolicyError(f"site policy {path}: not valid TOML ({err})") from err
        return cls.from_dict(doc, base=path.parent, source=path)

    @classmethod
    def from_dict(cls, doc: dict[str, Any], *, base: Path | None = None,
                  source: Path | None = None) -> SitePolicy:
        """The policy of a parsed TOML document (relative paths resolved against ``base``)."""
        where = f"site policy {source}" if source is not None else "site policy"
        tables = _check_tables(doc, where)
        base = Path(".") if base is None else base
        kw: dict[str, Any] = {"source": source}
        kw.update(_site_table(tables["site"], base, where))
        kw["disclosure"] = _disclosure_table(tables["disclosure"], where)
        kw["secure_aggregation_required"] = _bool(tables["secure_aggregation"], "required",
                                                  False, where, "secure-aggregation")
        kw.update(_privacy_table(tables["privacy"], where))
        kw.update(_answer_table(tables["answer"], where))
        kw["datasets"] = _datasets_table(tables["datasets"], base, where)
        sec = tables["sec"]
        kw["sec_evaluate_others"] = (None if "evaluate_others" not in sec
                                     else _bool(sec, "evaluate_others", True, where, "sec"))
        kw["sec_trusted_types"] = _names(sec, "trusted_types", where, "sec")
        kw["sec_quota"] = _count(sec, "quota", where, "sec")
        for key in sorted(_TABLES["limits"]):
            kw[key] = _count(tables["limits"], key, where, "limits",
                             low=0 if key == "max_points" else 1)
        return cls(**kw)

    # ---- use -----------------------------------------------------------------------------
    def site_name(self, client_id: str) -> str:
        """The name refusals and the ledger give this site."""
        return self.name or str(client_id)

    def dataset_path(self, name: str) -> Path:
        """The local file of data set ``name``; :class:`PolicyError` for a path or an unknown
        name (the server names a data set, never a file)."""
        name = str(name)
        if not name or "/" in name or "\\" in name or ".." in name or Path(name).is_absolute():
            raise PolicyError(
                f"data set {name!r} refused: the server names a data set, never a path; "
                f"known data sets: {sorted(self.datasets)}")
        if self.datasets and name not in self.datasets:
            raise PolicyError(f"data set {name!r} is not one this site holds; known: "
                              f"{sorted(self.datasets)} (the site's policy [datasets])")
        return self.datasets.get(name, Path(name))

    def describe(self) -> list[tuple[str, str]]:
        """``(key, value)`` rows of the policy in force (for ``fedlatent site check``)."""
        rows = [("site.name", self.name or "(the client id)"),
                ("site.simulation", str(self.simulation)),
                ("site.directory", str(self.directory) if self.directory else "(in memory)")]
        rows += [(f"disclosure.{f.name}", str(getattr(self.disclosure, f.name)))
                 for f in fields(DisclosurePolicy)]
        rows += [("secure-aggregation.required", str(self.secure_aggregation_required)),
                 ("privacy.required", str(self.privacy_required))]
        for key, name in _DESCRIBED:
            value = getattr(self, key)
            if isinstance(value, tuple):
                value = ", ".join(value)
            rows.append((name, "(not set)" if value is None else str(value)))
        rows += [(f"datasets.{k}", str(v)) for k, v in sorted(self.datasets.items())]
        return rows


# ---- the tables ---------------------------------------------------------------------------
def _check_tables(doc: dict[str, Any], where: str) -> dict[str, dict[str, Any]]:
    unknown = sorted(k for k in doc if str(k).replace("-", "_") not in _TABLES)
    if unknown:
        known = sorted(t.replace("_", "-") for t in _TABLES)
        raise PolicyError(f"{where}: unknown table(s) {unknown}; known: {known}")
    doc = _norm(doc)
    out = {}
    for table, keys in _TABLES.items():
        value = doc.get(table, {})
        if not isinstance(value, dict):
            raise PolicyError(f"{where}: [{table}] must be a table, got {value!r}")
        if keys is not None:
            bad = sorted(k for k in value if str(k).replace("-", "_") not in keys)
            if bad:
                known = sorted(k if table == "disclosure" else k.replace("_", "-") for k in keys)
                raise PolicyError(f"{where}: unknown key(s) {[f'{table}.{k}' for k in bad]}; "
                                  f"known in [{table}]: {known}")
        value = _norm(value) if table != "datasets" else dict(value)
        out[table] = value
    return out


def _bool(t: dict, key: str, default: bool, where: str, table: str) -> bool:
    value = t.get(key, default)
    if not isinstance(value, bool):
        raise PolicyError(f"{where}: {table}.{key} must be true or false, got {value!r}")
    return value


def _count(t: dict, key: str, where: str, table: str, low: int = 1) -> int | None:
    value = t.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise PolicyError(f"{where}: {table}.{key.replace('_', '-')} must be an integer >= "
                          f"{low}, got {value!r}")
    return int(value)


def _positive(t: dict, key: str, where: str, below_one: bool = False) -> float | None:
    value = t.get(key)
    if value is None:
        return None
    ok = (not isinstance(value, bool) and isinstance(value, int | float)
          and math.isfinite(value) and value > 0 and (not below_one or value < 1))
    if not ok:
        rng = "in (0, 1)" if below_one else "a positive number"
        raise PolicyError(f"{where}: privacy.{key.replace('_', '-')} must be {rng}, "
                          f"got {value!r}")
    return float(value)


def _names(t: dict, key: str, where: str, table: str) -> tuple[str, ...] | None:
    value = t.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise PolicyError(f"{where}: {table}.{key.replace('_', '-')} must be a list of names, "
                          f"got {value!r}")
    return tuple(value)


def _path(value: Any, base: Path, where: str, key: str) -> Path | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise PolicyError(f"{where}: {key} must be a path (a string), got {value!r}")
    p = Path(value).expanduser()
    return p if p.is_absolute() else base / p


def _site_table(t: dict, base: Path, where: str) -> dict[str, Any]:
    name = t.get("name", "")
    if not isinstance(name, str):
        raise PolicyError(f"{where}: site.name must be a string, got {name!r}")
    return {"name": name, "simulation": _bool(t, "simulation", False, where, "site"),
            "directory": _path(t.get("directory"), base, where, "site.directory"),
            "roster": _path(t.get("roster"), base, where, "site.roster"),
            "signing_key": _path(t.get("signing_key"), base, where, "site.signing-key")}


def _disclosure_table(t: dict, where: str) -> DisclosurePolicy:
    try:
        return DisclosurePolicy(**{k: (math.inf if v == "inf" else v) for k, v in t.items()})
    except (TypeError, ValueError) as err:
        raise PolicyError(f"{where}: [disclosure]: {err}") from err


def _privacy_table(t: dict, where: str) -> dict[str, Any]:
    return {"privacy_required": _bool(t, "required", False, where, "privacy"),
            "max_epsilon": _positive(t, "max_epsilon", where),
            "max_delta": _positive(t, "max_delta", where, below_one=True),
            "lifetime_epsilon": _positive(t, "lifetime_epsilon", where),
            "lifetime_delta": _positive(t, "lifetime_delta", where, below_one=True)}


def _answer_table(t: dict, where: str) -> dict[str, Any]:
    return {"models": _names(t, "models", where, "answer"),
            "exchanges": _names(t, "exchanges", where, "answer")}


def _datasets_table(t: dict, base: Path, where: str) -> dict[str, Path]:
    out = {}
    for name, value in t.items():
        if "/" in name or "\\" in name or ".." in name:
            raise PolicyError(f"{where}: datasets.{name}: a data set's name is a plain name")
        out[str(name)] = _path(value, base, where, f"datasets.{name}")
    return out
