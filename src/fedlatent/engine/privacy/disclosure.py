"""Disclosure control: replies that are functions of too few records are not sent.

A sum over one record is the record; over two records, ``(n, sum x, sum x x^T)`` gives both back
(:mod:`.attacks`). :class:`DisclosurePolicy` holds thresholds named after what they protect,
anchored on the defaults DataSHIELD's server package ``dsBase`` ships (its ``default.nfilter.*``
options, set in ``tests/testthat/disclosure/set_disclosure_settings.R`` and read by
``listDisclosureSettingsDS``):

====================================  ==========  ===========================================
fedlatent                             default     DataSHIELD anchor
====================================  ==========  ===========================================
``min_records``                       3           ``nfilter.tab`` = 3 (smallest non-empty
                                                  cell), ``nfilter.subset`` = 3 (smallest
                                                  subset)
``min_records_per_block``             3           ``nfilter.tab`` = 3 (a cluster block of an
                                                  agent is a cell of its table of labels)
``max_parameters_per_record``         0.33        ``nfilter.glm`` = 0.33 (``glmDS2`` refuses
                                                  ``p > nfilter.glm * N``)
``tree_min_leaf``                     3           ``nfilter.tab`` = 3 (a leaf's value is a
                                                  mean over its cell)
``max_levels_density``                0.33        ``nfilter.levels.density`` = 0.33
``allow_row_storing_learners``        False       (DataSHIELD returns no row-level object)
====================================  ==========  ===========================================

(``nfilter.string`` = 80 and ``nfilter.stringShort`` = 20 bound strings a user passes in;
fedlatent takes no code or formula strings from the server, so they have no counterpart.)

The check functions are pure: each returns ``None`` when the reply may be sent, or the refusal
text naming the client, the rule and how to change it. Empty counts (exactly 0) disclose nothing
and pass, as in DataSHIELD (``0 < n < nfilter.tab`` is the disclosive range).

With secure aggregation the server sees only the sum over a round's participants, so
:func:`effective` moves the count rules from each client to that aggregate
(:func:`check_aggregate`).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace

import numpy as np

__all__ = [
    "DisclosurePolicy",
    "check_aggregate",
    "check_counts",
    "check_learner",
    "check_levels",
    "check_saturation",
    "check_tree_leaves",
    "effective",
]

SCOPES = ("client", "aggregate")
_OFF_HINT = "DisclosurePolicy.off() disables every rule"


@dataclass(frozen=True)
class DisclosurePolicy:
    """Thresholds that keep a reply from being a function of too few records.

    Parameters
    ----------
    min_records : int
        A client's aggregate reply (round statistics, initialization sums, counts, objectives)
        must be a sum over at least this many records.
    min_records_per_block : int
        Every non-empty block of a reply that is a sum over a subset of the records (an HLCR
        cluster block of an agent, a component's count) must hold at least this many.
    max_parameters_per_record : float
        A regression block with ``p`` coefficients over ``n`` records is refused when
        ``p > max_parameters_per_record * n`` (a saturated fit reproduces its data).
    tree_min_leaf : int
        Minimum number of training records in a leaf of a tree a client sends (SEC).
    max_levels_density : float
        A list of the distinct levels of a variable is refused when ``levels / n`` exceeds this.
    allow_row_storing_learners : bool
        Whether a client may send a fitted model that stores training rows (KNN, SVR).
    count_scope : {"client", "aggregate"}
        Where the count rules apply; :func:`effective` sets ``"aggregate"`` under secure
        aggregation.
    """

    min_records: int = 3
    min_records_per_block: int = 3
    max_parameters_per_record: float = 0.33
    tree_min_leaf: int = 3
    max_levels_density: float = 0.33
    allow_row_storing_learners: bool = False
    count_scope: str = "client"

    def __post_init__(self) -> None:
        for name, low in (("min_records", 0), ("min_records_per_block", 0),
                          ("tree_min_leaf", 1)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < low:
                raise ValueError(f"DisclosurePolicy: {name} must be an integer >= {low}, got "
                                 f"{v!r}")
            object.__setattr__(self, name, int(v))  # numpy integers become plain ints
        for name in ("max_parameters_per_record", "max_levels_density"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or math.isnan(v) or v <= 0:
                raise ValueError(f"DisclosurePolicy: {name} must be a number > 0 (math.inf "
                                 f"disables it), got {v!r}")
            object.__setattr__(self, name, float(v))
        if not isinstance(self.allow_row_storing_learners, bool):
            raise ValueError(f"DisclosurePolicy: allow_row_storing_learners must be True or "
                             f"False, got {self.allow_row_storing_learners!r}")
        if self.count_scope not in SCOPES:
            raise ValueError(f"DisclosurePolicy: count_scope must be one of {SCOPES}, got "
                             f"{self.count_scope!r}")

    @classmethod
    def off(cls) -> DisclosurePolicy:
        """Every rule disabled (for trusted settings and to demonstrate the attacks)."""
        return cls(min_records=0, min_records_per_block=0, max_parameters_per_record=math.inf,
                   tree_min_leaf=1, max_levels_density=math.inf,
                   allow_row_storing_learners=True)

    @property
    def is_off(self) -> bool:
        """True when no rule can refuse anything."""
        return replace(self, count_scope="client") == DisclosurePolicy.off()


def effective(policy: DisclosurePolicy, secure_aggregation: bool) -> DisclosurePolicy:
    """The policy in force: under secure aggregation the count rules apply to the round's
    aggregate (the server never sees one client's sum), otherwise to each client."""
    return replace(policy, count_scope="aggregate" if secure_aggregation else "client")


def _smallest_disclosive(counts, threshold: int) -> float | None:
    arr = np.asarray(counts, dtype=np.float64).ravel()
    bad = arr[(arr > 0) & (arr < threshold)]
    return float(bad.min()) if bad.size else None


def _fmt(x: float) -> str:
    return f"{x:.0f}" if float(x).is_integer() else f"{x:.3g}"


def _count_rule(policy: DisclosurePolicy, counts, what: str, per_block: bool,
                who: str) -> str | None:
    rule = "min_records_per_block" if per_block else "min_records"
    threshold = getattr(policy, rule)
    small = _smallest_disclosive(counts, threshold)
    if small is None:
        return None
    where = "a block of " if per_block else ""
    return (f"{who}: {where}{what} is a sum over {_fmt(small)} record(s), fewer than "
            f"{rule}={threshold} (DataSHIELD nfilter.tab); it is not sent. Merge small "
            f"clients or lower DisclosurePolicy({rule}=...); {_OFF_HINT}")


def check_counts(policy: DisclosurePolicy, client: str, counts, what: str, *,
                 per_block: bool = False) -> str | None:
    """Refusal text if a client's reply is a sum over too few records, else ``None``.

    Parameters
    ----------
    policy : DisclosurePolicy
    client : str
        The client's id (named in the refusal).
    counts : float or array_like
        Number of records behind the reply (``per_block=False``: its total) or behind each of
        its blocks (``per_block=True``: e.g. an agent's entity count per cluster). Soft counts
        (sums of responsibilities) are compared as they are.
    what : str
        What the reply is ("round statistics", "initialization sums", ...).
    per_block : bool
        Apply ``min_records_per_block`` to every non-empty entry instead of ``min_records``.

    Under ``count_scope="aggregate"`` (secure aggregation) a single client is not checked:
    :func:`check_aggregate` checks the round's sum instead.
    """
    if policy.count_scope == "aggregate":
        return None
    return _count_rule(policy, counts, what, per_block, f"client {client!r}")


def check_aggregate(policy: DisclosurePolicy, counts, what: str, participants, *,
                    per_block: bool = False) -> str | None:
    """Under secure aggregation: refusal text if the round's aggregate (the sum of the
    participants' counts) is over too few records, else ``None``.

    ``participants`` (the client ids taking part) are named in the refusal. Under
    ``count_scope="client"`` the aggregate is not checked (each client was).
    """
    if policy.count_scope == "client":
        return None
    names = ", ".join(repr(str(p)) for p in participants)
    return _count_rule(policy, counts, what, per_block,
                       f"the aggregate of this round's participants ({names})")


def check_saturation(policy: DisclosurePolicy, client: str, n_parameters: int,
                     n_records: float, what: str) -> str | None:
    """Refusal text if a regression block has too many coefficients for its records
    (``p > max_parameters_per_record * n``, DataSHIELD's ``nfilter.glm`` trap), else ``None``."""
    limit = policy.max_parameters_per_record
    if n_records <= 0 or n_parameters <= limit * n_records:
        return None
    return (f"client {client!r}: {what} has {n_parameters} coefficient(s) over "
            f"{_fmt(n_records)} record(s), more than max_parameters_per_record={limit:g} per "
            f"record (DataSHIELD nfilter.glm); it is not sent. Use fewer features or more "
            f"records, or raise DisclosurePolicy(max_parameters_per_record=...); {_OFF_HINT}")


def check_tree_leaves(policy: DisclosurePolicy, client: str, leaf_sizes,
                      what: str) -> str | None:
    """Refusal text if a tree (or forest) sent by a client has a leaf with fewer than
    ``tree_min_leaf`` training records, else ``None``. Pass ``min_samples_leaf=
    policy.tree_min_leaf`` to the learner so it never happens."""
    sizes = np.asarray(leaf_sizes, dtype=np.float64).ravel()
    if sizes.size == 0 or sizes.min() >= policy.tree_min_leaf:
        return None
    return (f"client {client!r}: {what} has a leaf with {_fmt(sizes.min())} training "
            f"record(s), fewer than tree_min_leaf={policy.tree_min_leaf} (DataSHIELD "
            f"nfilter.tab); it is not sent. Fit it with min_samples_leaf="
            f"{policy.tree_min_leaf}; {_OFF_HINT}")


def check_learner(policy: DisclosurePolicy, client: str, learner: str,
                  stores_rows: bool) -> str | None:
    """Refusal text if a learner that keeps training rows in its fitted state (KNN, SVR's
    support vectors) would be sent while ``allow_row_storing_learners`` is False."""
    if not stores_rows or policy.allow_row_storing_learners:
        return None
    return (f"client {client!r}: learner {learner!r} stores training rows in its fitted model, "
            f"so sending it sends the rows; it is not sent. Choose another candidate, or set "
            f"DisclosurePolicy(allow_row_storing_learners=True) if the rows may be shared")


def check_levels(policy: DisclosurePolicy, client: str, n_levels: int, n_records: float,
                 what: str) -> str | None:
    """Refusal text if the list of distinct levels of ``what`` is too dense
    (``levels / n > max_levels_density``, DataSHIELD's ``nfilter.levels.density``)."""
    limit = policy.max_levels_density
    if n_records <= 0 or n_levels <= limit * n_records:
        return None
    return (f"client {client!r}: {what} has {n_levels} distinct level(s) over "
            f"{_fmt(n_records)} record(s), denser than max_levels_density={limit:g} "
            f"(DataSHIELD nfilter.levels.density); the levels are not sent. Group rare levels "
            f"or raise DisclosurePolicy(max_levels_density=...); {_OFF_HINT}")
