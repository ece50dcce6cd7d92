"""A site's replay of the start (issue 38): the first round's parameters recomputed from the
committed seed and the verified aggregates of the start's exchanges, and any other refused.

A start is a public, deterministic function of the fit's seed and of the sums the clients
sent for it: the GMM's pooled moments and k-means hard-assignment sums (each exchange's
centres themselves a function of the sums before), LCR's and LCA's random-membership sums
(each client draws its memberships from its own generator keyed by the seed), HLCR's sizes
and standardizing moments and the seed of its server-side draws, FedGMM's Gaussian part and
its learners' coefficients drawn from the seed. A model says how it starts by a function
registered with :func:`register_start` (``start(model, ctx) -> list of params``: the starts
it may have sent, LCR's "spread" and "random" share one exchange), which runs the server's
own start code on a :class:`ReplayContext`: each summed query the code asks is answered by
the next verified aggregate of the transcript, after checking the server asked the site that
query with that payload. :func:`start_refusal` then compares the first round's parameters with them.

The seed is committed before the site's data are involved: the setup message carries none,
so the site records the seed of the first message after a setup that carries one (the
start's first query, before the site has answered anything of its data in this fit but its
units), and refuses a later query or round message of that setup carrying another
(:func:`seed_refusal`). A server that wants other random draws must set up again, a new
start the site's ledger and ``max-rounds`` count; it cannot choose the draws after seeing
the site's sums. (Each of ``n_init`` starts is a setup of its own, its seed
``engine/contract/starts.start_seeds``'s; HLCR refuses more than one chain under secure
aggregation, so a verified HLCR fit has one start.)

A start given by the analyst (``means_init=...``, ``coef_init=...``) is not a function of
the aggregates: a verifying site refuses it unless its policy says ``[verification]
public-starts = true`` (then the first round's parameters are checked for their declared
shapes only). Tolerance: :data:`~fedlatent.engine.node.replay.REPLAY_RTOL` of each
parameter's largest entry, as for the rounds (k-means' labels are discrete, but the
candidates' distances differ by far more than rounding on real data; a tie broken otherwise
on another CPU refuses the start: it fails closed).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedlatent.engine.fedem.federation import Federation
from fedlatent.engine.node.replay import REPLAY_RTOL, params_refusal

__all__ = ["Exchange", "ReplayContext", "StartRefused", "query_refusal", "register_start",
           "replay_start", "seed_refusal", "start_refusal"]

#: model name -> ``start(model, ctx) -> list of params``: the starts a site may replay
_STARTS: dict[str, Callable[[Any, ReplayContext], list[dict]]] = {}

#: what a start refusal adds: how a site can accept an analyst's start
PUBLIC_STARTS_HINT = ("a start given by the analyst (means_init=... and the like) is answered "
                      "only by a site whose policy says [verification] public-starts = true "
                      "(a differentially private fit's: or bounds [privacy] max-epsilon or "
                      "lifetime-epsilon)")


class StartRefused(ValueError):
    """The start's transcript is not the one the server's start code asks (another query,
    another payload, an exchange missing or left over)."""


@dataclass(frozen=True)
class Exchange:
    """One summed exchange of the start as the site saw it: the ``query`` it was asked, the
    message's ``payload`` (every field but ``query`` and ``seed``) and the exchange's verified
    aggregate ``total`` (``{field: sum over every client}``)."""

    query: str
    payload: Mapping[str, Any]
    total: Mapping[str, np.ndarray]

    @classmethod
    def of(cls, msg: Mapping[str, Any], total: Mapping[str, np.ndarray]) -> Exchange:
        """The exchange of a query message as a client received it (``query``, ``seed`` and
        the payload; check the seed with :func:`seed_refusal`) and its verified total."""
        payload = {k: v for k, v in msg.items() if k not in ("query", "seed")}
        return cls(str(msg["query"]), payload, total)


@dataclass
class ReplayContext:
    """What a model's start code needs of a :class:`~fedlatent.engine.estimation.fitcontext.
    FitContext`, answered from a transcript: :meth:`ask_sum` returns the next exchange's
    verified total once the query and payload are the ones the code asks.

    ``n_total`` and ``n_clients`` are the setup's (the start uses only the total units and the
    number of clients); ``model`` the setup's model."""

    model: Any
    seed: int
    n_features: int
    n_total: float
    n_clients: int
    exchanges: Sequence[Exchange]
    rtol: float = REPLAY_RTOL
    federation: Federation = field(default_factory=lambda: Federation(secure_aggregation=True))
    secure: Any = True
    privacy: Any = None
    data: Any = None
    runtime_given: bool = False
    faults: list = field(default_factory=list)
    #: the query being asked now (its total not known yet): the code must ask it next
    pending: Exchange | None = None
    _next: int = 0

    @property
    def summed_only(self) -> bool:
        return True

    @property
    def client_ids(self) -> list[str]:
        return [f"client {i}" for i in range(self.n_clients)]

    @property
    def n_units(self) -> dict[str, float]:
        """The setup's units spread evenly (the start code reads only their sum)."""
        return dict.fromkeys(self.client_ids, self.n_total / max(self.n_clients, 1))

    def asks(self, query: str) -> bool:
        """Whether the transcript holds an exchange of ``query`` not yet replayed."""
        return any(e.query == query for e in self.exchanges[self._next:]) or (
            self.pending is not None and self.pending.query == query)

    def ask(self, query: str, *args, **kwargs):
        raise StartRefused(f"the start's code asks {query!r} in the clear, which a verifying "
                           "site cannot replay (only summed exchanges are)")

    def ask_sum(self, query: str, payload: dict | None = None, *, shapes: dict,
                what: str | None = None) -> dict[str, np.ndarray]:
        """The next exchange's total, after checking its query, payload and shapes."""
        i, what = self._next, what or f"query {query!r}"
        if i >= len(self.exchanges) and self.pending is None:
            raise StartRefused(f"{what}: the replayed start asks exchange {i + 1} ({query!r}), "
                               f"the transcript holds {len(self.exchanges)}")
        ex = self.exchanges[i] if i < len(self.exchanges) else self.pending
        why = (f"the server asked {ex.query!r}" if ex.query != query
               else _payload_problem(ex.payload, payload or {}, self.rtol))
        if why is None and ex is self.pending:
            raise _Reached  # (the query asked now is the start's next: answer it)
        if why is None:  # (a field of the right size is reshaped, as secure_sum_query does)
            bad = sorted(f for f, s in shapes.items()
                         if f not in ex.total or np.size(ex.total[f]) != int(np.prod(s)))
            why = f"its aggregate lacks or misshapes {bad}" if bad else None
        if why:
            raise StartRefused(f"{what}: exchange {i + 1} is not the replayed start's "
                               f"{query!r}: {why}")
        self._next += 1
        return {f: np.array(ex.total[f], dtype=np.float64).reshape(shapes[f]) for f in shapes}

    def finished(self) -> None:
        """StartRefused when exchanges of the transcript were not replayed."""
        if self._next != len(self.exchanges):
            raise StartRefused(f"the transcript holds {len(self.exchanges)} exchanges, the "
                               f"replayed start asks {self._next}: "
                               f"{self.exchanges[self._next].query!r} is not the start's")


class _Reached(Exception):  # noqa: N818 - a signal, not an error
    """The replayed start asked the pending query, with its payload (not a ValueError: no
    start code catches it)."""


def query_refusal(model, seed: int, exchanges: Sequence[Exchange], pending: Exchange,
                  client: str, *, n_features: int, n_total: float, n_clients: int) -> str | None:
    """Why a start's query ``pending`` (its query and payload, before the site answers it)
    is not the next one the model's start code asks after the verified ``exchanges`` from
    the committed ``seed`` (None: it is). A query the start would not ask (a probe: crafted
    centres, a payload of the server's choosing) is refused before anything of it leaves,
    not only at the first round."""
    who = f"client {client!r}: start exchange {len(exchanges) + 1} ({pending.query!r}) refused"
    ctx = ReplayContext(model, int(seed), int(n_features), float(n_total), int(n_clients),
                        list(exchanges), pending=pending)
    try:
        _known(model)(model, ctx)
    except _Reached:
        return None
    except StartRefused as err:
        return f"{who}: it is not the start's next query ({err}); {PUBLIC_STARTS_HINT}"
    return (f"{who}: the start replayed from the committed seed and the verified aggregates "
            f"asks no more exchanges after {len(exchanges)}; {PUBLIC_STARTS_HINT}")


def _payload_problem(sent: Mapping, replayed: Mapping, rtol: float) -> str | None:
    """Why a query's payload ``sent`` is not the replayed one (arrays to ``rtol`` of their
    largest entry, the rest exactly)."""
    if set(sent) != set(replayed):
        return f"its fields {sorted(sent)}, the replay's {sorted(replayed)}"
    arrays = {k: v for k, v in replayed.items() if isinstance(v, np.ndarray)}
    why = params_refusal({k: sent[k] for k in arrays}, arrays, 0, "", rtol)
    if why:
        return why.split("round 0 refused: ", 1)[1]
    for k in sorted(set(replayed) - set(arrays)):
        if sent[k] != replayed[k]:
            return f"field {k!r} is {sent[k]!r}, the replay's {replayed[k]!r}"
    return None


def register_start(name: str):
    """Decorator: ``start(model, ctx) -> list of params`` is how model ``name`` starts, the
    server's start code run on ``ctx`` (a :class:`ReplayContext` on a site): every start the
    server may have sent from those exchanges (an empty list: none a site can replay)."""
    def add(start):
        _STARTS[str(name)] = start
        return start
    return add


def replay_start(model, seed: int, exchanges: Sequence[Exchange], *, n_features: int,
                 n_total: float, n_clients: int, rtol: float = REPLAY_RTOL) -> list[dict]:
    """The starts the server may send after ``exchanges`` (the model's ``replay_start`` on a
    :class:`ReplayContext`); StartRefused when the transcript is not its start's, or the
    model has no replayable start."""
    name = str(getattr(model, "name", type(model).__name__))
    ctx = ReplayContext(model, int(seed), int(n_features), float(n_total), int(n_clients),
                        list(exchanges), rtol)
    starts = _known(model)(model, ctx)
    if not starts:
        raise StartRefused(f"model {name!r} has no start a site can replay in these settings "
                           "(differential privacy: its noisy start)")
    ctx.finished()
    return starts


def _known(model) -> Callable:
    """The registered start of ``model`` (imported with its estimator's modules when not
    yet); StartRefused when it has none."""
    name = str(getattr(model, "name", type(model).__name__))
    if name not in _STARTS:  # registered where the model's start is (its estimator's modules)
        from fedlatent.engine.contract.registry import estimator_class

        try:
            estimator_class(name)  # (that model's estimator alone is imported)
        except ValueError:
            pass
    if name not in _STARTS:
        raise StartRefused(f"model {name!r} has no start a site can replay")
    return _STARTS[name]


def start_refusal(sent: dict, model, seed: int, exchanges: Sequence[Exchange], client: str, *,
                  n_features: int, n_total: float, n_clients: int, public_starts: bool = False,
                  rtol: float = REPLAY_RTOL) -> str | None:
    """Why round 1's parameters ``sent`` are not a start the site replays from the committed
    ``seed`` and the verified ``exchanges`` (None: they are one, or ``public_starts``)."""
    if public_starts:
        return None
    who = f"client {client!r}: round 1 refused"
    try:
        starts = replay_start(model, seed, exchanges, n_features=n_features, n_total=n_total,
                              n_clients=n_clients, rtol=rtol)
    except StartRefused as err:
        return f"{who}: its start cannot be replayed ({err}); {PUBLIC_STARTS_HINT}"
    whys = [params_refusal(*_unknowns_equal(sent, s), 1, client, rtol) for s in starts]
    if any(w is None for w in whys):
        return None
    return (f"{whys[0]}; the start is not the one replayed from the committed seed and the "
            f"verified aggregates: {PUBLIC_STARTS_HINT}")


def _unknowns_equal(sent: dict, replayed: dict) -> tuple[dict, dict]:
    """``sent`` and ``replayed`` with the entries NaN in both set to 0 (a start's figure not
    known yet, HLCR's ``train_mse``); every other entry as it was."""
    a, b = dict(sent), dict(replayed)
    for k in set(a) & set(b):
        x, y = np.asarray(a[k], dtype=np.float64), np.asarray(b[k], dtype=np.float64)
        if x.shape == y.shape and np.any(both := np.isnan(x) & np.isnan(y)):
            a[k], b[k] = np.where(both, 0.0, x), np.where(both, 0.0, y)
    return a, b


def seed_refusal(msg: Mapping, committed: int, client: str, what: str) -> str | None:
    """Why a query or round message carries another seed than the setup's ``committed``
    one (None: it carries that one, or none)."""
    if "seed" not in msg or int(msg["seed"]) == int(committed):
        return None
    return (f"client {client!r}: {what} refused: it carries seed {int(msg['seed'])}, not the "
            f"seed {int(committed)} committed at the setup (random draws are the committed "
            "seed's)")
