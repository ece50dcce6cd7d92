"""The one checked protocol for "ask the clients, combine the replies".

Every exchange outside the round loop (setup, ``describe``, initialization queries such as
moments and k-means centroids, SEC's select and exchange, federated scoring) goes through
:func:`ask`: each reply is validated against what the caller expects (present keys, shapes,
finite values, bounds) with the same checks as the round loop's statistics
(:func:`fedlatent.engine.protocol.messages.check_fields`), and a client that does not answer or
answers badly is treated one way:

- ``required=True`` (the default, what an initialization needs): the exchange stops with a
  :class:`~fedlatent.engine.faults.FederatedFitError` naming the client(s) and the reason;
- ``required=False``: the client is left out of this exchange, recorded in ``Replies.faults``
  (client -> reason) and logged; the caller combines the replies of the others.

No runtime and no model special-cases an exchange: a runtime only carries messages.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedlatent.engine.faults import FederatedFitError
from fedlatent.engine.privacy.disclosure import DisclosurePolicy
from fedlatent.engine.protocol.messages import (
    ERROR_KEY,
    REFUSED_KEY,
    ClientReplyError,
    Expect,
    array,
    check_fields,
    check_rows,
    fault_detail,
    number,
    refusal_detail,
    text,
)
from fedlatent.engine.protocol.runtime import Runtime
from fedlatent.engine.stats import units_number

__all__ = ["Expect", "Replies", "RowReplies", "SiteSetup", "array", "ask", "cohort_refusal",
           "number", "setup_clients", "setup_sites", "text"]

logger = logging.getLogger(__name__)


class Replies(dict):
    """``{client: reply}`` of the clients whose replies passed the checks.

    Attributes
    ----------
    faults : dict of str to str
        Clients left out of this exchange and why ("no reply", or the failed check).
    refused : dict of str to str
        Those of ``faults`` that refused by a rule (a disclosure rule, their site's policy),
        with the rule: a fit's setup may leave them out and go on.
    """

    def __init__(self, *args, faults: dict[str, str] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.faults: dict[str, str] = dict(faults or {})
        #: the clients of ``faults`` that refused by a rule (client -> the rule), not failed
        self.refused: dict[str, str] = {}

    def total(self, field: str) -> np.ndarray:
        """``field`` summed over the replies in client order, as float64."""
        return sum(np.asarray(r[field], dtype=np.float64) for r in self.values())


class RowReplies(Mapping):
    """The checked replies of many clients computed at once (a runtime's
    :meth:`~fedlatent.engine.protocol.runtime.Runtime.call_rows`), kept as rows: a mapping
    client -> reply like :class:`Replies` (a reply is built when looked up), whose sums
    (:meth:`total`) are taken over the rows without a loop over clients.

    Attributes
    ----------
    clients : list of str
        The clients whose replies passed the checks, in client order.
    fields : dict of str to ndarray or None
        Their replies' entries stacked (``fields[k][i]`` is ``clients[i]``'s entry ``k``);
        None when only the sums were kept (``ask(..., only_sums=True)``).
    faults : dict of str to str
        Clients left out of this exchange and why.
    refused : dict of str to str
        Those of ``faults`` that refused by a rule, with the rule (as :class:`Replies`).
    """

    def __init__(self, clients: list[str], fields: dict[str, np.ndarray] | None,
                 faults: dict[str, str] | None = None,
                 totals: dict[str, np.ndarray] | None = None,
                 refused: dict[str, str] | None = None):
        self.clients = list(clients)
        self.fields = fields
        self.faults: dict[str, str] = dict(faults or {})
        self.refused: dict[str, str] = dict(refused or {})
        self._totals = totals
        self._pos: dict[str, int] | None = None

    def __getitem__(self, c: str) -> dict[str, Any]:
        if self.fields is None:
            raise TypeError("only the sums of these replies were kept (only_sums=True)")
        if self._pos is None:
            self._pos = {k: i for i, k in enumerate(self.clients)}
        i = self._pos[c]
        return {k: v[i] for k, v in self.fields.items()}

    def __iter__(self) -> Iterator[str]:
        return iter(self.clients)

    def __len__(self) -> int:
        return len(self.clients)

    def total(self, field: str) -> np.ndarray:
        """``field`` summed over the rows, as float64 (each entry added row after row, as
        :meth:`Replies.total` adds the replies)."""
        if self.fields is None:
            return self._totals[field]
        return _row_sum(None, np.asarray(self.fields[field], dtype=np.float64))


def _row_sum(acc: np.ndarray | None, a: np.ndarray) -> np.ndarray:
    """``acc`` (None: nothing yet) plus the sum of the rows of ``a``, added one after the
    other."""
    if a.shape[0] == 0:
        total = np.zeros(a.shape[1:])
    else:
        total = np.cumsum(a)[-1] if a.ndim == 1 else np.add.reduce(a, axis=0)
    return total if acc is None else acc + total


def ask(
    runtime: Runtime,
    method: str,
    messages: Mapping[str, Mapping[str, Any]] | Mapping[str, Any],
    *,
    what: str,
    clients: list[str] | None = None,
    expect: Mapping[str, Expect] | None = None,
    required: bool | None = True,
    per_client: bool = False,
    model=None,
    only_sums: bool = False,
) -> Replies | RowReplies:
    """Send one message per client and return the checked replies.

    Parameters
    ----------
    runtime : Runtime
    method : str
        The client node's method (``"query"``, ``"setup"``, ``"describe"``...).
    messages : dict
        One message for every client, or, with ``per_client=True``, ``{client: message}``.
    what : str
        What the exchange is for, in words ("k-means initialization"): errors start with it.
    clients : list of str or None
        Who is asked (default: every client of the runtime; with ``per_client``, the keys).
    expect : dict of str to Expect or None
        What every reply must hold; keys not listed are passed through unchecked.
    required : bool or None
        Whether every asked client must answer validly (see the module docstring); None: the
        faults are the caller's to settle (``faults``, ``refused``), nothing raised or logged.
    model : FederatedModel or None
        The fit's model, when the runtime may answer many clients at once (the same message
        to every client; :meth:`~fedlatent.engine.protocol.runtime.Runtime.call_rows`): the
        replies then come as rows, checked row-wise (:func:`check_rows`) into a
        :class:`RowReplies`, with the same faults and reasons as one by one.
    only_sums : bool
        Whether only the sums of the replies are needed (:meth:`RowReplies.total`): rows
        answered at once are then checked and summed a chunk at a time, none kept.

    Returns
    -------
    Replies or RowReplies
    """
    if per_client:
        msgs = {str(c): dict(m) for c, m in messages.items()}
        ids = list(msgs) if clients is None else list(clients)
    else:
        ids = list(runtime.client_ids if clients is None else clients)
        rows = None if model is None or not ids else \
            runtime.call_rows(model, ids, method, dict(messages))
        if rows is not None:
            return _settled(_checked_rows(ids, rows, expect, not only_sums), what, required)
        msgs = {c: dict(messages) for c in ids}
    return _settled(_ask_each(runtime, ids, method, msgs, expect), what, required)


def _ask_each(runtime: Runtime, ids: list[str], method: str, msgs, expect) -> Replies:
    """The clients ``ids`` called one by one, each reply checked (:func:`_checked`)."""
    raw = runtime.call(ids, method, msgs) if ids else {}
    good = Replies()
    for c in ids:
        try:
            good[c] = _checked(c, raw.get(c), expect)
        except ClientReplyError as err:
            good.faults[c] = err.reason
            if err.refused:
                good.refused[c] = err.refused
    return good


def _settled(good, what: str, required: bool):
    """``good`` (Replies or RowReplies); with faults, a FederatedFitError (``required``) or
    a warning naming them (False); None: the caller settles them."""
    if good.faults and required is not None:
        detail = fault_detail(good.faults)
        if required:
            raise FederatedFitError(f"{what}: {detail}; nothing of this exchange was used",
                                    faults=good.faults)
        logger.warning("%s: left out %s", what, detail)
    return good


def _ids_at(ids: list[str], rows: np.ndarray) -> list[str]:
    """``ids`` at positions ``rows``: one slice when they are a run (a chunk of clients)."""
    if rows.size and rows[-1] - rows[0] == rows.size - 1 and np.all(np.diff(rows) == 1):
        return ids[int(rows[0]):int(rows[-1]) + 1]
    return [ids[r] for r in rows.tolist()]


def _checked_rows(ids: list[str], chunks, expect, keep: bool) -> RowReplies:
    """The replies of the clients ``ids`` answered at once, checked as :func:`_checked`
    checks each reply. ``chunks`` yields ``(rows, fields, errors)``: positions in ``ids``,
    their entries stacked, position in the chunk -> why that client declined. ``keep``:
    the rows kept (else only their sums: each chunk's rows added one after the other, then
    to the running total)."""
    why: dict[int, str] = {}
    refused: dict[str, str] = {}
    parts, totals = [], None
    for rows, fields, errors in chunks:
        bad = check_rows(_ids_at(ids, rows), fields, expect or {})
        for j, text_ in errors.items():
            if isinstance(text_, Mapping):  # a refusal (refusal_reply), not a failure
                refused[ids[int(rows[j])]] = str(text_.get(REFUSED_KEY) or "")
                text_ = text_[ERROR_KEY]
            bad[j] = str(text_).removeprefix(f"client {ids[int(rows[j])]!r}: ")
        ok = np.ones(len(rows), dtype=bool)
        ok[list(bad)] = False
        why.update({int(rows[j]): reason for j, reason in bad.items()})
        if bad:
            rows, fields = rows[ok], {k: np.asarray(v)[ok] for k, v in fields.items()}
        if keep:
            parts.append((rows, fields))
        else:
            totals = {k: _row_sum(None if totals is None else totals[k],
                                  np.asarray(v, dtype=np.float64)) for k, v in fields.items()}
    faults = {ids[i]: why[i] for i in sorted(why)}
    clients = [c for i, c in enumerate(ids) if i not in why] if why else list(ids)
    refused = {c: refused[c] for c in faults if refused.get(c)}
    if not keep:
        return RowReplies(clients, None, faults, totals or {}, refused)
    if len(parts) == 1 and np.array_equal(parts[0][0], np.arange(len(clients))):
        return RowReplies(clients, parts[0][1], faults, refused=refused)
    at = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, dtype=np.int64)
    order = None if np.all(at[1:] > at[:-1]) else np.argsort(at, kind="stable")
    fields = {k: _stacked([p[1][k] for p in parts], order) for k in parts[0][1]} \
        if parts else {}
    return RowReplies(clients, fields, faults, refused=refused)


def _stacked(parts: list, order: np.ndarray | None) -> np.ndarray:
    """The chunks' rows as one array, in ``order`` (None: as they come, in client order)."""
    out = np.concatenate(parts)
    return out if order is None else out[order]


def _checked(c: str, reply, expect) -> dict[str, Any]:
    """Client ``c``'s reply if it holds what ``expect`` says (ClientReplyError otherwise)."""
    if reply is None:
        raise ClientReplyError(c, "no reply")
    if ERROR_KEY in reply:  # the client declined or failed, and said why
        why = str(reply[ERROR_KEY])
        raise ClientReplyError(c, why.removeprefix(f"client {c!r}: "),
                               str(reply.get(REFUSED_KEY) or ""))
    if expect:
        check_fields(c, reply, expect)
    return reply


def setup_clients(runtime: Runtime, model, disclosure=None, privacy=None,
                  privacy_releases: int = 0, run: str | None = None, *,
                  batch_size: int | None = None, cohort: int | None = None,
                  fit: bool = False, statistics: int = 1) -> dict[str, int]:
    """Every client set up (:func:`setup_sites`); a client that refuses stops the exchange,
    naming it. Returns each client's number of units."""
    return setup_sites(runtime, model, disclosure, privacy, privacy_releases, run,
                       batch_size=batch_size, cohort=cohort, fit=fit,
                       statistics=statistics).n_units


@dataclass
class SiteSetup:
    """What a setup gave: the units of the clients taking part and those left out.

    Attributes
    ----------
    n_units : dict of str to int
        Each client taking part and its units (what it answered ``setup``), in client order.
    excluded : dict of str to str
        The clients that refused by a rule (a disclosure rule, their site's policy) and were
        left out, with the refusal (who, the rule, the fix); empty when every client takes part.
    rules : dict of str to str
        The rule of each of ``excluded`` (``"disclosure"``, ``"privacy"``, ``"site policy:
        ..."``).
    adopted : dict
        The disclosure floors the sites announced that raised the server's policy
        (:func:`~fedlatent.engine.protocol.settings.adopt_floors`; empty: none).
    """

    n_units: dict[str, int]
    excluded: dict[str, str] = field(default_factory=dict)
    rules: dict[str, str] = field(default_factory=dict)
    adopted: dict[str, Any] = field(default_factory=dict)


def setup_sites(runtime: Runtime, model, disclosure=None, privacy=None,
                privacy_releases: int = 0, run: str | None = None, *,
                batch_size: int | None = None, cohort=None, fit: bool = False,
                statistics: int = 1, on_refusal: str = "stop",
                min_clients: int = 1, verify=None) -> SiteSetup:
    """Send every client the model's name and config and the disclosure policy (None: the
    default, on), and the differential-privacy setting with the number of releases the fit
    plans (None: not private); return each client's number of units.

    The one place a model reaches the clients: they rebuild it from the registry (no code or
    pickle crosses). A client the policy keeps from answering anything (fewer records than
    ``min_records``, a reply the rules on what it determines refuse, its site's own policy)
    refuses here, before the first round: with ``on_refusal="stop"`` the setup stops naming
    it; with ``"exclude"`` it is left out (:attr:`SiteSetup.excluded`) and the others go on,
    while at least ``min_clients`` remain. A client that fails (no reply, an error) always
    stops it. ``run`` labels the fit for the sites' ledgers (a site fixes a run's plan at its
    first setup; a resumed fit sends the same label). ``batch_size``: the fit's mini-batch,
    whose replies each client's saturation check covers too. ``cohort``: under secure
    aggregation, the fewest clients an aggregate can cover (the threshold; a callable of the
    number of clients taking part); the saturation rule is then checked on the records of the
    ``cohort`` smallest clients (:func:`cohort_refusal`), for a round's sum of ``statistics``
    statistics (accelerated EM's multi-point rounds: 1 + the extra points; each client counts
    them itself on every round when no cohort rule applies). ``fit``: the setup is a fit's
    (its clients check the saturation and rare-level rules now, before the first round; any
    client also checks them on its first round statistic). The sites' announced floors are
    adopted first (:mod:`~fedlatent.engine.protocol.settings`: the strictest of them all).
    """
    from fedlatent.engine.protocol.settings import adopt_floors, site_settings

    disclosure, adopted = adopt_floors(DisclosurePolicy() if disclosure is None else disclosure,
                                       site_settings(runtime))
    msg = _setup_message(model, disclosure, privacy, privacy_releases, run, batch_size,
                         cohort is not None or batch_size is not None or fit, verify)
    replies = ask(runtime, "setup", msg, what="setup", expect={"n_units": number()},
                  model=model, required=None)
    out = SiteSetup({}, *_left_out(replies, len(runtime.client_ids), on_refusal, min_clients),
                    adopted=adopted)
    ids = [c for c in runtime.client_ids if c not in out.excluded] if out.excluded else \
        list(runtime.client_ids)
    if isinstance(replies, RowReplies):  # answered at once: the units as one array
        units = replies.fields["n_units"]
        out.n_units = dict(zip(replies.clients, _units_list(units)))
    else:
        out.n_units = {c: units_number(replies[c]["n_units"]) for c in ids}
        units = np.array([out.n_units[c] for c in ids], dtype=np.float64)
    empty = np.flatnonzero(np.asarray(units) <= 0)
    if empty.size:
        raise FederatedFitError(f"client {ids[int(empty[0])]!r} has no units to fit")
    if cohort is not None and privacy is None:
        _check_cohort(disclosure or DisclosurePolicy(), replies, ids,
                      int(cohort(len(ids)) if callable(cohort) else cohort), statistics)
    return out


def _units_list(units) -> list[int | float]:
    """:func:`~fedlatent.engine.stats.units_number` of every entry of ``units`` (whole
    counts, the usual case, converted at once)."""
    u = np.asarray(units, dtype=np.float64)
    if u.size and np.all((u == np.floor(u)) & (np.abs(u) < 2.0**53)):
        return u.astype(np.int64).tolist()
    return list(map(units_number, u.tolist()))


def _setup_message(model, disclosure, privacy, privacy_releases: int, run: str | None,
                   batch_size: int | None, fit: bool, verify=None) -> dict[str, Any]:
    """The setup message (:func:`setup_sites`)."""
    import json

    from fedlatent.engine.privacy.enforce import policy_to_json

    msg = {"model": model.name, "model_config": json.dumps(model.get_config()),
           "disclosure": policy_to_json(DisclosurePolicy() if disclosure is None else disclosure)}
    if privacy is not None:
        msg["privacy"] = json.dumps(privacy.to_config())
        msg["privacy_releases"] = int(privacy_releases)
    if run is not None:
        msg["run"] = str(run)
    if fit:
        msg["fit"] = 1  # the rules on what a fit's replies determine, checked at setup
    if batch_size:
        msg["batch_size"] = int(batch_size)
    if verify is not None:  # verified rounds: what the sites replay the server with
        msg["verify"] = json.dumps({"federation": verify.to_config()})
    return msg


def _check_cohort(policy: DisclosurePolicy, replies, ids: list[str], cohort: int,
                  statistics: int) -> None:
    """FederatedFitError when the cohort rule (:func:`cohort_refusal`) refuses the clients
    ``ids`` taking part."""
    if isinstance(replies, RowReplies):  # answered at once: only where no rule counts
        if policy.count_scope == "aggregate" and not policy.is_off:
            raise FederatedFitError("setup: the cohort rule needs every client's reply")
        return
    why = cohort_refusal(policy, {c: replies[c] for c in ids}, cohort, statistics)
    if why:
        raise FederatedFitError(why)


def _left_out(replies, n_clients: int, on_refusal: str,
              min_clients: int) -> tuple[dict[str, str], dict[str, str]]:
    """``(excluded, rules)`` of a setup's replies: the clients that refused by a rule, left
    out under ``on_refusal="exclude"``. FederatedFitError, naming every fault, when a client
    failed, when ``on_refusal="stop"`` and one refused, or when fewer than ``min_clients``
    would remain."""
    faults = replies.faults
    if not faults:
        return {}, {}
    failed = {c: why for c, why in faults.items() if c not in replies.refused}
    kept = n_clients - len(faults)
    if failed or on_refusal != "exclude" or (kept == 0 and min_clients > 0):
        raise FederatedFitError(f"setup: {fault_detail(faults)}; nothing of this exchange "
                                "was used", faults=faults)
    if kept < min_clients:
        raise FederatedFitError(
            f"setup: {len(faults)} of {n_clients} clients refused by a disclosure rule or "
            f"their own policy, leaving {kept}, fewer than Federation(min_clients="
            f"{min_clients}): {fault_detail(faults)}", faults=faults)
    logger.info("setup: left out %s", refusal_detail(faults))
    return dict(faults), {c: replies.refused[c] for c in faults}


def cohort_refusal(disclosure, replies: Mapping[str, Mapping[str, Any]],
                   cohort: int, statistics: int = 1) -> str | None:
    """Under secure aggregation: why the smallest aggregate the protocol can unmask (the
    ``cohort`` clients with the fewest records) carries too many free numbers for its records
    (:func:`~fedlatent.engine.privacy.disclosure.check_reply_numbers`), or None. ``replies``
    are the setup replies (``reply_numbers``, ``n_records``, ``record_width`` of each);
    ``statistics`` the statistics a round's sum carries (a multi-point round's ``1 + m``)."""
    from fedlatent.engine.privacy.disclosure import check_reply_numbers

    facts = {c: f for c, f in ((c, _facts(r)) for c, r in replies.items()) if f}
    if not facts or disclosure.count_scope != "aggregate":
        return None
    numbers = max(f[0] for f in facts.values())
    width = min(f[2] for f in facts.values())
    order = sorted(facts, key=lambda c: facts[c][1])[:max(int(cohort), 1)]
    records = sum(facts[c][1] for c in order)
    names = ", ".join(repr(str(c)) for c in order[:5]) + (", ..." if len(order) > 5 else "")
    what = "a round's sum" if statistics == 1 else (
        f"a round's sum of {statistics} statistics (the round's and {statistics - 1} extra "
        "points of Federation(acceleration='newton'); acceleration='squarem' sends one)")
    return check_reply_numbers(
        disclosure, f"the smallest aggregate secure aggregation can unmask ({len(order)} "
        f"client(s): {names})", numbers * int(statistics), records, width, what)


def _facts(reply: Mapping[str, Any]) -> tuple[int, float, int] | None:
    """``(reply_numbers, n_records, record_width)`` of a setup reply, None when it has none
    or they are not finite non-negative numbers (then the client is not counted)."""
    try:
        F, n, w = (float(reply[k]) for k in ("reply_numbers", "n_records", "record_width"))
    except (KeyError, TypeError, ValueError):
        return None
    if not all(math.isfinite(v) and v >= 0 for v in (F, n, w)):
        return None
    return int(F), n, int(w)
