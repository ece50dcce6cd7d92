"""A site's own policy: the floors its operator sets, whatever the server asks.

The operator writes a TOML file (``docs/site-operators.md`` documents every key;
``examples/site-policy.toml`` is a commented example) and gives it to the node:
``ClientNode(..., policy=SitePolicy.load(path))`` in-process, the node config key
``policy-path`` of a Flower SuperNode, or one file per partition in a simulation.
``fedlatent site check FILE`` validates a file.

Tables and keys (hyphens and underscores are the same):

``[site]``            ``name``, ``simulation`` (bool: only then is a server's ``noise_seed``
                      honoured), ``directory`` (where the ledger lives), ``witness`` (a
                      directory outside it keeping a copy of the ledger's anchor), ``roster``
                      and ``signing-key`` (paths, for authenticated peers)
``[disclosure]``      the :class:`~fedlatent.engine.privacy.disclosure.DisclosurePolicy` floor
``[secure-aggregation]`` ``required`` (bool)
``[privacy]``         ``required`` (``true``: differential privacy; ``"dp-or-verified"``:
                      DP, or secure aggregation whose rounds the site verifies), ``max-epsilon``,
                      ``max-delta`` (per fit),
                      ``lifetime-epsilon``, ``lifetime-delta`` (per data set, across fits)
``[answer]``          ``models`` and ``exchanges`` the site answers (absent: all)
``[datasets]``        name = local file (the server names a data set, never a path)
``[sec]``             ``evaluate-others`` (bool; not set: only with a pinned roster),
                      ``trusted-types`` (list), ``quota``
                      (distinct models evaluated per run; default: one per rostered site)
``[limits]``          ``max-message-bytes``, ``max-rounds``, ``max-releases``, ``max-points``
                      (extra points a round of accelerated EM may ask: 0 refuses them)
``[verification]``    ``public-starts`` (bool, default false: a site that verifies rounds
                      refuses a start it cannot replay from the seed and the verified sums,
                      e.g. an analyst's ``means_init``; :mod:`fedlatent.engine.node.replay_start`)

Relative paths are relative to the policy file's directory.

No file: the library's default site policy, ``SitePolicy()`` (every default of the table
above: the library's disclosure floors; one plan per run and one answer per question; no
server ``noise_seed``; no release beyond a run's plan, counted on a ledger a restore cannot
roll back), in every runtime. Only a runtime that holds every site itself (the in-process
runtime, the Flower simulation: the server and the sites are one party) relaxes it, and
explicitly: :meth:`SitePolicy.for_simulation`, which no file can say.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from fedlatent.engine.privacy.disclosure import DisclosurePolicy
from fedlatent.engine.privacy.enforce import looser

__all__ = ["PolicyError", "SitePolicy", "looser"]

_TABLES = {
    "site": {"name", "simulation", "directory", "witness", "roster", "signing_key"},
    "disclosure": {f.name for f in fields(DisclosurePolicy)},
    "secure_aggregation": {"required"},
    "privacy": {"required", "max_epsilon", "max_delta", "lifetime_epsilon", "lifetime_delta"},
    "answer": {"models", "exchanges"},
    "datasets": None,  # any name
    "sec": {"evaluate_others", "trusted_types", "quota"},
    "limits": {"max_message_bytes", "max_rounds", "max_releases", "max_points"},
    "verification": {"public_starts"},
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
    ("max_points", "limits", "max_points"), ("public_starts", "verification", "public_starts"),
    ("roster", "site", "roster"), ("signing_key", "site", "signing_key"),
    ("witness", "site", "witness")))
#: ``[privacy] required``'s value: differential privacy, or verified secure aggregation
DP_OR_VERIFIED = "dp-or-verified"
#: exchanges every site answers (the protocol itself: no data cross in them)
PROTOCOL_EXCHANGES = ("setup", "describe", "secagg", "settings")


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
    witness : Path or None
        A directory outside the site directory keeping a copy of the ledger's anchor, so
        that a site directory restored from a backup is refused (None: no witness).
    disclosure : DisclosurePolicy
        The disclosure floor (a server's policy may be stricter, never looser).
    secure_aggregation_required, privacy_required : bool
    verified_suffices : bool
        With ``privacy_required``: secure aggregation whose rounds the site verifies
        satisfies it too (``[privacy] required = "dp-or-verified"``; the hook is
        :func:`fedlatent.engine.site.guard.verified_rounds`).
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
        ``max_rounds``: the rounds ``1..max_rounds`` only (their E-steps and evaluation
        passes; a round numbered 0 or below is refused too).
    max_points : int or None
        Most extra points a round may ask (a multi-point round of accelerated EM: each
        point is one more statistic in the reply); 0 refuses them; None: no cap beyond the
        saturation rule, which counts every point.
    public_starts : bool
        Whether a site that verifies rounds answers a start it cannot replay (one the
        analyst gives: ``means_init=...``); False refuses it.
    roster, signing_key : Path or None
        For authenticated peers (read by :mod:`fedlatent.engine.site.keys`).
    source : Path or None
        The file the policy was read from.
    relaxed : bool
        The policy of a site a simulation holds (:meth:`for_simulation`): no guard, no floor
        of its own, a server's ``noise_seed`` honoured. Never read from a file.
    """

    name: str = ""
    simulation: bool = False
    directory: Path | None = None
    witness: Path | None = None
    disclosure: DisclosurePolicy = field(default_factory=DisclosurePolicy)
    secure_aggregation_required: bool = False
    privacy_required: bool = False
    verified_suffices: bool = False
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
    public_starts: bool = False
    roster: Path | None = None
    signing_key: Path | None = None
    source: Path | None = None
    relaxed: bool = False

    def __post_init__(self):
        why = _pair_problem(self.lifetime_epsilon, self.lifetime_delta)
        if why:
            raise PolicyError(f"site policy: {why}")

    @classmethod
    def for_simulation(cls) -> SitePolicy:
        """The relaxed policy of a site that a runtime holding every site itself gives its
        nodes (the in-process runtime, the Flower simulation): the server's settings are the
        site's (no floor, no ledger, a ``noise_seed`` honoured for reproducible runs). A
        deployed node never takes it: without a file it holds ``SitePolicy()``."""
        return cls(name="", simulation=True, relaxed=True)

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
        kw["public_starts"] = _bool(tables["verification"], "public_starts", False, where,
                                    "verification")
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

    def problems(self, known_models=None) -> tuple[list[str], list[str]]:
        """``(errors, warnings)`` an operator should see before a node runs this policy
        (``fedlatent site check``): files it names that do not exist, models it answers that
        are not among ``known_models`` (the registry's names; None: not checked), lifetime
        budgets below the per-fit ceilings, floors below the library's defaults; a lifetime
        budget kept in memory, a ledger without a witness (a restored backup of the site
        directory would reset its budget unseen)."""
        errors = [f"{key} = {path}: no such file" for key, path in self._files()
                  if not path.exists()]
        if known_models is not None:
            known = sorted(known_models)
            errors += [f"answer.models: unknown model {m!r}; known: {known}"
                       for m in self.models or () if m not in known]
        for what, life, fit in (("epsilon", self.lifetime_epsilon, self.max_epsilon),
                                ("delta", self.lifetime_delta, self.max_delta)):
            if life is not None and fit is not None and life < fit:
                errors.append(f"privacy.lifetime-{what} = {life:g} is below the per-fit "
                              f"privacy.max-{what} = {fit:g}: a fit at the ceiling could never "
                              f"run; raise lifetime-{what} or lower max-{what}")
        if self.witness is not None and self.directory is not None and \
                self.witness.resolve().is_relative_to(self.directory.resolve()):
            errors.append(f"site.witness = {self.witness} is inside site.directory: a backup "
                          "of the site directory would restore it too; put it outside (on "
                          "another volume)")
        loose = looser(DisclosurePolicy(), self.disclosure)
        if loose:
            errors.append(f"[disclosure] is below the library's default floor: "
                          f"{', '.join(loose)}; a site protects less than a node without a "
                          "policy file (remove the key, or raise it)")
        warnings = []
        if self.public_starts:
            warnings.append("verification.public-starts = true: a start the site cannot replay "
                            "(an analyst's means_init=... and the like) is answered, so the "
                            "server chooses the first round's parameters; remove the key unless "
                            "you trust the analyst's starts")
        if self.privacy_required and self.max_epsilon is None:
            warnings.append("privacy.required without privacy.max-epsilon: a differentially "
                            "private fit at any epsilon meets it (a server declaring epsilon = "
                            "1e9 is answered, and a DP fit's start and saturation rule are not "
                            "checked: DP is to bound them); set max-epsilon, e.g. 1")
        if self.witness is None:
            warnings.append("no site.witness: restoring a backup of the site directory resets "
                            "its ledger, and with it the budgets and answers it keeps, unseen; "
                            "set witness to a directory outside the site directory")
        if self.lifetime_epsilon is not None and self.directory is None:
            warnings.append("privacy.lifetime-epsilon without site.directory: a deployed node "
                            "keeps its ledger in its site-dir; a node in a process of yours "
                            "keeps it in memory, and forgets it when the process ends")
        return errors, warnings

    def _files(self) -> list[tuple[str, Path]]:
        out = [(f"site.{k.replace('_', '-')}", getattr(self, k))
               for k in ("roster", "signing_key") if getattr(self, k) is not None]
        return out + [(f"datasets.{k}", v) for k, v in sorted(self.datasets.items())]

    def describe(self) -> list[tuple[str, str]]:
        """``(key, value)`` rows of the policy in force (for ``fedlatent site check``)."""
        if self.relaxed:
            return [("site", "relaxed: a simulation holds this site (no floors of its own)")]
        rows = [("site.name", self.name or "(the client id)"),
                ("site.simulation", str(self.simulation)),
                ("site.directory", str(self.directory) if self.directory else "(in memory)")]
        rows += [(f"disclosure.{f.name}", str(getattr(self.disclosure, f.name)))
                 for f in fields(DisclosurePolicy)]
        rows += [("secure-aggregation.required", str(self.secure_aggregation_required)),
                 ("privacy.required", (DP_OR_VERIFIED if self.verified_suffices
                                       else str(self.privacy_required)))]
        for key, name in _DESCRIBED:
            value = getattr(self, key)
            if isinstance(value, tuple):
                value = ", ".join(value)
            rows.append((name, "(not set)" if value is None else str(value)))
        rows += [(f"datasets.{k}", str(v)) for k, v in sorted(self.datasets.items())]
        return rows


# ---- the tables ---------------------------------------------------------------------------
def _twice(d: dict[str, Any], where: str, table: str = "") -> None:
    """Refuse a key written twice, once with hyphens and once with underscores (TOML sees two
    keys; read as one, the later would win silently)."""
    seen: dict[str, str] = {}
    for k in d:
        norm = str(k).replace("-", "_")
        if norm in seen:
            what = f"{table}.{norm.replace('_', '-')}" if table else f"[{norm}]"
            raise PolicyError(f"{where}: {what} is written twice ({seen[norm]!r} and {k!r}); "
                              "keep one of them")
        seen[norm] = str(k)


def _check_tables(doc: dict[str, Any], where: str) -> dict[str, dict[str, Any]]:
    unknown = sorted(k for k in doc if str(k).replace("-", "_") not in _TABLES)
    if unknown:
        known = sorted(t.replace("_", "-") for t in _TABLES)
        raise PolicyError(f"{where}: unknown table(s) {unknown}; known: {known}")
    _twice(doc, where)
    doc = _norm(doc)
    out = {}
    for table, keys in _TABLES.items():
        value = doc.get(table, {})
        if not isinstance(value, dict):
            raise PolicyError(f"{where}: [{table}] must be a table, got {value!r}")
        if keys is not None:
            _twice(value, where, table.replace("_", "-"))
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
            "witness": _path(t.get("witness"), base, where, "site.witness"),
            "roster": _path(t.get("roster"), base, where, "site.roster"),
            "signing_key": _path(t.get("signing_key"), base, where, "site.signing-key")}


def _disclosure_table(t: dict, where: str) -> DisclosurePolicy:
    try:
        return DisclosurePolicy(**{k: (math.inf if v == "inf" else v) for k, v in t.items()})
    except (TypeError, ValueError) as err:
        raise PolicyError(f"{where}: [disclosure]: {err}") from err


def _privacy_table(t: dict, where: str) -> dict[str, Any]:
    either = t.get("required") == DP_OR_VERIFIED
    if not either and not isinstance(t.get("required", False), bool):
        raise PolicyError(f"{where}: privacy.required must be true, false or "
                          f"{DP_OR_VERIFIED!r}, got {t['required']!r}")
    out = {"privacy_required": either or _bool(t, "required", False, where, "privacy"),
           "verified_suffices": either,
           "max_epsilon": _positive(t, "max_epsilon", where),
           "max_delta": _positive(t, "max_delta", where, below_one=True),
           "lifetime_epsilon": _positive(t, "lifetime_epsilon", where),
           "lifetime_delta": _positive(t, "lifetime_delta", where, below_one=True)}
    why = _pair_problem(out["lifetime_epsilon"], out["lifetime_delta"])
    if why:
        raise PolicyError(f"{where}: {why}")
    return out


def _pair_problem(epsilon: float | None, delta: float | None) -> str | None:
    """Why a lifetime budget is not a pair (epsilon, delta), or None."""
    if (epsilon is None) == (delta is None):
        return None
    if epsilon is None:
        return ("privacy.lifetime-delta without privacy.lifetime-epsilon sets no budget; "
                "give both (e.g. lifetime-epsilon = 3.0, lifetime-delta = 1e-5)")
    return ("privacy.lifetime-epsilon without privacy.lifetime-delta: the budget would be "
            "counted at each fit's own delta, which the server chooses; give both (e.g. "
            "lifetime-delta = 1e-5)")


def _answer_table(t: dict, where: str) -> dict[str, Any]:
    return {"models": _names(t, "models", where, "answer"),
            "exchanges": _names(t, "exchanges", where, "answer")}


def _datasets_table(t: dict, base: Path, where: str) -> dict[str, Path]:
    out = {}
    for name, value in t.items():
        if "/" in name or "\\" in name or ".." in name:
            raise PolicyError(f"{where}: datasets.{name}: a data set's name is a plain name")
        out[str(name)] = _path(value, base, where, f"datasets.{name}")
    seen: dict[Path, str] = {}
    for name, path in out.items():
        other = seen.setdefault(path.resolve(), name)
        if other != name:  # its lifetime budget is kept under one name
            raise PolicyError(f"{where}: datasets.{other} and datasets.{name} name the same "
                              f"file {path}; a data set has one name (the ledger keeps its "
                              "lifetime budget under it)")
    return out
