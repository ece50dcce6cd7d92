"""An in-memory driver running the whole protocol, for tests, benchmarks and as the reference
sequence of calls the engine's runtimes follow. Every message is flat, as the engine's are:
names to NumPy arrays (bytes as uint8) or to strings (lists of client ids as JSON).

Every message is copied as if it crossed a wire and, with ``Wire(record=True)``, kept with its
step, sender and recipient, so tests can inspect what the server saw and count bytes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from fedlatent.engine.secagg.client import SecAggClient
from fedlatent.engine.secagg.protocol import SecAggConfig, as_u8
from fedlatent.engine.secagg.server import SecAggServer, route_shares

__all__ = ["Wire", "open_keys", "run_exchange", "setup"]

SERVER = "<server>"


def _copy(msg: Mapping) -> dict:
    return {k: v if isinstance(v, str) else np.array(v, copy=True) for k, v in msg.items()}


def _nbytes(msg: Mapping) -> int:
    return sum(len(v.encode()) if isinstance(v, str) else int(np.asarray(v).nbytes)
               for v in msg.values())


@dataclass
class Wire:
    """Carries flat messages (str -> array or str), copying them, and counts their bytes.

    Parameters
    ----------
    record : bool
        Keep every message as ``(step, sender, recipient, message)`` in :attr:`log`.
    transport : callable, optional
        Applied to every message on its way, e.g. a Flower record encode/decode round trip.
    """

    record: bool = False
    transport: Callable[[dict], dict] | None = None
    up: int = 0
    down: int = 0
    log: list = field(default_factory=list)

    def send(self, step: str, sender: str, recipient: str, msg: Mapping) -> dict:
        out = _copy(msg)
        if self.transport is not None:
            out = self.transport(out)
        if sender == SERVER:
            self.down += _nbytes(out)
        else:
            self.up += _nbytes(out)
        if self.record:
            self.log.append((step, sender, recipient, out))
        return out


def setup(client_ids: Iterable[str], config: SecAggConfig, *, wire: Wire | None = None,
          identities: Mapping | None = None, run: str = "", round: int = 0
          ) -> tuple[SecAggServer, dict[str, SecAggClient]]:
    """The once-per-fit key set-up: commitments, the closed list, opened keys, the roster,
    sealed shares relayed by the server (steps ``keys``, ``open``, ``roster``, ``shares``).

    ``identities`` (client id -> :class:`~fedlatent.engine.site.keys.SiteIdentity`): a client
    with a signing key signs its keys for the set-up; one with a pinned roster verifies its
    peers' signed keys (:meth:`SecAggClient.receive_peer_keys`) and, in every exchange,
    requires their confirmations (:func:`run_exchange` runs the consistency round).
    """
    wire = wire or Wire()
    ident = dict(identities or {})
    server = SecAggServer(config, run=run, round=round)
    clients = {str(u): SecAggClient(str(u), config, run=run, round=round,
                                    graph_commit=server.graph_commit) for u in client_ids}
    server.collect_keys(open_keys(server, clients, wire=wire, identities=ident))
    for u, c in clients.items():
        c.receive_peer_keys(wire.send("roster", SERVER, u, server.roster_for(u)),
                            trust=getattr(ident.get(u), "roster", None))
    outgoing = {u: wire.send("shares", u, SERVER, c.share_messages()) for u, c in clients.items()}
    for v, inbox in route_shares(outgoing).items():
        clients[v].receive_shares(wire.send("shares", SERVER, v, inbox))
    return server, clients


def open_keys(server: SecAggServer, clients: Mapping[str, SecAggClient], *,
              wire: Wire | None = None, identities: Mapping | None = None) -> dict[str, dict]:
    """The set-up's first two steps: every client's commitment (step ``keys``), the list closed
    by the server, every client's opened keys (step ``open``, signed by those with a signing
    key in ``identities``); returns the opened keys, for :meth:`SecAggServer.collect_keys`."""
    wire = wire or Wire()
    ident = dict(identities or {})
    commits = {u: wire.send("keys", u, SERVER, c.commitment()) for u, c in clients.items()}
    close = server.collect_commitments(commits)
    keys = {}
    for u, c in clients.items():
        got = wire.send("open", SERVER, u, {"closed": as_u8(close["closed"]),
                                            "n": str(close["n"])})
        keys[u] = wire.send("open", u, SERVER, c.open(got["closed"].tobytes(), int(got["n"]),
                                                      signer=_keys_of(ident.get(u))))
    return keys


def _keys_of(identity):
    return getattr(identity, "keys", None)


def run_exchange(server: SecAggServer, clients: Mapping[str, SecAggClient],
                 stats: Mapping[str, Mapping[str, np.ndarray]], round: int, exchange: str,
                 participants: Sequence[str], *, drop: Iterable[str] = (),
                 silent: Iterable[str] = (), wire: Wire | None = None) -> dict[str, np.ndarray]:
    """One secure exchange: announce, mask, sum, the consistency round, reveal, unmask.

    Parameters
    ----------
    stats : mapping of client id to its named float arrays
        The inputs of (at least) the participants.
    participants : sequence of str
        The clients the server announces.
    drop : iterable of str
        Participants that go silent after the announcement (they mask nothing and reveal
        nothing): their masks are recovered from the survivors' shares.
    silent : iterable of str
        Survivors that send their masked reply but do not answer the reveal request: not needed
        as long as ``threshold`` other survivors reveal.

    Returns
    -------
    dict of str to float64 ndarray
        The sum over the survivors of their ``stats``.
    """
    wire = wire or Wire()
    drop = {str(u) for u in drop}
    P = server.announce(round, exchange, participants)
    masked = {}
    for u in P:
        announced = wire.send("announce", SERVER, u, {"participants": json.dumps(P),
                                                      "slot": str(server.slot)})
        if u not in drop:
            y = clients[u].mask(stats[u], round, exchange, json.loads(announced["participants"]),
                                slot=int(announced["slot"]))
            masked[u] = wire.send("masked", u, SERVER, y)
    request = {k: json.dumps(v) for k, v in server.aggregate(masked).items()}
    confirmed = {}
    for u in json.loads(request["survivors"]):
        req = wire.send("consistency", SERVER, u, request)
        confirmed[u] = wire.send("consistency", u, SERVER, clients[u].consistency(
            round, exchange, json.loads(req["survivors"]), json.loads(req["dropped"])))
    server.collect_confirmations(confirmed)
    revealed = {}
    silent = {str(u) for u in silent}
    for u in json.loads(request["survivors"]):
        if u in silent:
            continue
        req = wire.send("reveal-request", SERVER, u, {"confirm": server.confirmations_for(u)})
        revealed[u] = wire.send("reveal", u, SERVER, clients[u].reveal(
            round, exchange, confirmations=req["confirm"]))
    return server.unmask(revealed)
