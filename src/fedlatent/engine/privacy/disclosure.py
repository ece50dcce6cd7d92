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

Rules on what a reply determines (issue 22)
-------------------------------------------
A count threshold does not bound how many numbers a reply determines: three rows in two
dimensions are six unknowns, and a two-component mixture's soft sums ``(nk, sum r x,
sum r x x^T)`` over them are twelve numbers, enough to solve for the rows. Four rules bound
what a reply determines:

**Saturation** (:func:`check_reply_numbers`, anchored on ``nfilter.glm``). A reply of the
round carries ``F`` free numbers: the entries of its statistic blocks, a symmetric matrix
counted once (``K (1 + d + d (d + 1) / 2)`` for a full Gaussian mixture); the model declares
``F`` through :meth:`FederatedModel.reply_numbers` (so a new model declares its own). The
reply summarizes ``n`` records of ``w`` values each (:meth:`FederatedModel.record_width`: the
features, plus the target of a regression). It is refused when
``F > max_parameters_per_record * n * w``: then fewer than three values of the records stand
behind each number, and the reply can be solved for them. Per client without secure
aggregation (each client checks at setup, for its full pass and, when the setup carries it,
its mini-batch; and every reply it computes); under secure aggregation per aggregate: at
setup the server checks ``F`` against the records of the smallest cohort that can ever be
unmasked (the ``threshold`` smallest clients). Both happen before the first round. Not
applied under differential privacy (the noise covers what the numbers determine).

*One reply, not the fit's replies.* The rule counts one reply, as ``glmDS2`` counts one
call. Rounds re-query the same records at new parameters, so an attacker solving all the
rounds jointly has ``T F`` equations in the same ``n w`` unknowns. The totals
``sum_k (nk, sum r x, sum r x x^T)`` are the same in every round (they repeat, they add
nothing); what changes is the split over components, a non-linear function of the rows
through the broadcast parameters, and EM's rounds converge, so late rounds' equations are
nearly dependent on early ones. Counting the fit's replies would refuse every fit of more than
``1 / 0.33`` rounds on any client of realistic size. With the per-reply rule no single reply
(nor the initialization's) can be solved for the records; a joint solve needs at least
``1 / max_parameters_per_record`` rounds at parameters far enough apart and a non-linear
solver started near the rows. That is not a proof it fails: the defences with a bound are
secure aggregation (the rule then covers a cohort's records) and differential privacy (the
accountant composes every round).

**Rare levels** (:func:`check_level_counts`, ``nfilter.tab``). A category level held by one
record gives that record's row back from any sum that carries its indicator (``sum r x
x_j`` over the records with the level). Every level of a one-hot encoded column, and every
category of a latent class analysis variable, must be held by 0 or at least
``min_records_per_block`` of a client's records; the client refuses the setup otherwise,
naming the column and the level (merge rare levels before encoding). Checked per client even
under secure aggregation: a client's level counts of 0 or >= 3 make every cohort's, whatever
its participants, dropouts included.

**Differencing of blocks** (:func:`fedlatent.engine.privacy.enforce.suppress_differences`).
A model whose blocks are sums over hard-labelled subsets (HLCR's cluster blocks) releases, over
the rounds, many sums over overlapping subsets of the same records; any linear combination of
them is known to the server. A block is suppressed (sent as zeros) when, with the agent's
blocks released before it, some combination would be a sum over fewer than
``min_records_per_block`` records (one entity of one or two events, or two one-event
entities: complete for thresholds up to 3).

**Cohorts under secure aggregation** (:meth:`Federation` refuses the setting). With partial
participation and no control variates every round's aggregate carries the participants' full
statistics, whose totals do not change; aggregates over different cohorts are then a linear
system in each client's totals (40 rounds give every client's ``sum x``, and a one-row
client's row). That combination is refused up front; control variates (the replies are then
differences that cancel the totals), full participation or differential privacy avoid it.
"""

from __future__ import annotations

import logging
import math
import numbers
from dataclasses import dataclass, fields, replace

import numpy as np

logger = logging.getLogger(__name__)

__all__ = [
    "DisclosurePolicy",
    "check_aggregate",
    "check_counts",
    "check_learner",
    "check_level_counts",
    "check_levels",
    "check_reply_numbers",
    "check_saturation",
    "free_numbers",
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

    def smallest_site(self, n_numbers: int | None, width: int) -> int:
        """The fewest records a site needs for a reply of ``n_numbers`` free numbers about
        records of ``width`` values to pass the count and saturation rules: ``max(min_records,
        ceil(n_numbers / (max_parameters_per_record * width)))`` (``n_numbers`` None: the
        count rule alone)."""
        if n_numbers is None or math.isinf(self.max_parameters_per_record):
            return self.min_records
        need = math.ceil(int(n_numbers) / (self.max_parameters_per_record
                                           * max(int(width), 1)))
        return max(self.min_records, need)

    @property
    def is_off(self) -> bool:
        """True when no rule can refuse anything: every rule's field at :meth:`off`'s value
        (the scope aside), compared field by field (asked for every reply: no policy built)."""
        off = _OFF_FIELDS
        return all(getattr(self, name) == value for name, value in off.items())


#: the rules' fields of :meth:`DisclosurePolicy.off` (every field but the scope)
_OFF_FIELDS = {f.name: getattr(DisclosurePolicy.off(), f.name) for f in fields(DisclosurePolicy)
               if f.name != "count_scope"}


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
    return (f"{who}: {where}{what} is a sum over fewer than {rule}={threshold} records "
            f"(DataSHIELD nfilter.tab); it is not sent. Merge small clients or lower "
            f"DisclosurePolicy({rule}=...); {_OFF_HINT}")


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
    return (f"client {client!r}: {what} has a leaf with fewer than tree_min_leaf="
            f"{policy.tree_min_leaf} training records (DataSHIELD "
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


def free_numbers(shapes, symmetric=()) -> int:
    """The free numbers of statistic blocks of the given shapes: every entry, except that a
    block named in ``symmetric`` (its last two axes a symmetric matrix) counts each pair once.

    Parameters
    ----------
    shapes : dict of str to tuple of int
        The blocks' shapes (``stat_shapes``).
    symmetric : iterable of str
        The blocks whose last two axes are a symmetric matrix (``sum r x x^T``); name only
        those (a diagonal block of shape (K, d) with ``K == d`` is not one).
    """
    total = 0
    for name, shape in shapes.items():
        shape = tuple(int(s) for s in shape)
        size = int(np.prod(shape)) if shape else 1
        if name in symmetric and len(shape) >= 2 and shape[-1] == shape[-2]:
            p = shape[-1]
            size = size // (p * p) * (p * (p + 1) // 2) if p else 0
        total += size
    return total


def check_reply_numbers(policy: DisclosurePolicy, who: str, n_numbers: int | None,
                        n_records: float, width: int, what: str) -> str | None:
    """Refusal text if a reply carries too many free numbers for the records it summarizes
    (the saturation rule: ``n_numbers > max_parameters_per_record * n_records * width``,
    DataSHIELD's ``nfilter.glm``), else ``None``.

    Parameters
    ----------
    policy : DisclosurePolicy
    who : str
        Who sends it (``"client 'c1'"``, or the smallest cohort under secure aggregation).
    n_numbers : int or None
        The free numbers one reply carries (``FederatedModel.reply_numbers``; None: the model
        declares none, nothing is checked).
    n_records : float
        The records the reply is a sum over.
    width : int
        The values each record holds (``FederatedModel.record_width``).
    what : str
        What the reply is ("the round statistic").
    """
    limit = policy.max_parameters_per_record
    cells = float(n_records) * int(width)
    if n_numbers is None or cells <= 0 or n_numbers <= limit * cells:
        return None
    need = policy.smallest_site(n_numbers, width)
    return (f"{who}: {what} carries {n_numbers} free numbers about {_fmt(n_records)} "
            f"record(s) of {width} value(s), more than max_parameters_per_record={limit:g} per "
            f"value (DataSHIELD nfilter.glm): the records could be solved for, so it is not "
            f"sent. Merge sites to at least {need} records, use "
            f"Federation(secure_aggregation=True) (the rule then covers a cohort's records) or "
            f"differential privacy (Federation(privacy=...)), or fit fewer numbers (fewer "
            f"components or features, covariance_type='diag'); {_OFF_HINT}")


def check_level_counts(policy: DisclosurePolicy, client: str, column: str, levels,
                       counts) -> str | None:
    """Refusal text if a level of a categorical column is held by ``0 < n <
    min_records_per_block`` of the client's records (its indicator would give those records
    back; DataSHIELD's ``nfilter.tab`` on a table's cells), else ``None``.

    Parameters
    ----------
    policy : DisclosurePolicy
    client : str
    column : str
        The column (or variable) the levels are of.
    levels : sequence of str
        The level names, in the order of ``counts``.
    counts : array_like of shape (n_levels,)
        Records of the client holding each level.
    """
    counts = np.asarray(counts, dtype=np.float64).ravel()
    t = policy.min_records_per_block
    bad = np.flatnonzero((counts > 0) & (counts < t))
    if bad.size == 0:
        return None
    logger.warning("client %r: column %r: level(s) %s held by fewer than "
                   "min_records_per_block=%d records (this line stays at the site; the "
                   "refusal the server gets names no level)", client, column,
                   ", ".join(f"{str(levels[i])!r} ({_fmt(counts[i])})" for i in bad[:10]), t)
    return (f"client {client!r}: column {column!r} has {bad.size} level(s) held by fewer than "
            f"min_records_per_block={t} records (DataSHIELD nfilter.tab; the site's own log "
            f"names them); any sum carrying their indicator gives those records back, so "
            f"nothing is sent. Merge rare levels "
            f"into a common one on every client before encoding (e.g. df[{column!r}].replace"
            f"(..., 'other')), or drop the column; {_OFF_HINT}")
