"""An in-memory driver running the whole protocol, for tests, benchmarks and as the reference
sequence of calls the engine's runtimes follow.

Every message is copied as if it crossed a wire and, with ``Wire(record=True)``, kept with its
step, sender and recipient, so tests can inspect what the server saw and count bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from .client import SecAggClient
from .protocol import SecAggConfig
from .server import SecAggServer, route_shares

__all__ = ["Wire", "run_exchange", "setup"]

SERVER = "<server>"


def _copy(msg):
    if isinstance(msg, Mapping):
        return {k: _copy(v) for k, v in msg.items()}
    if isinstance(msg, list | tuple):
        return [str(x) for x in msg]
    return np.array(msg, copy=True)


def _nbytes(msg) -> int:
    if isinstance(msg, Mapping):
        return sum(_nbytes(v) for v in msg.values())
    if isinstance(msg, list):
        return sum(len(x.encode()) for x in msg)
    return int(np.asarray(msg).nbytes)


@dataclass
class Wire:
    """Copies messages and counts the bytes of their arrays (and id strings) up and down.

    Parameters
    ----------
    record : bool
        Keep every message as ``(step, sender, recipient, message)`` in :attr:`log`.
    """

    record: bool = False
    up: int = 0
    down: int = 0
    log: list = field(default_factory=list)

    def send(self, step: str, sender: str, recipient: str, msg):
        out = _copy(msg)
        if sender == SERVER:
            self.down += _nbytes(out)
        else:
            self.up += _nbytes(out)
        if self.record:
            self.log.append((step, sender, recipient, out))
        return out


def setup(client_ids: Iterable[str], config: SecAggConfig, *, wire: Wire | None = None
          ) -> tuple[SecAggServer, dict[str, SecAggClient]]:
    """The once-per-fit key set-up: keys, roster broadcast, sealed shares relayed by the server."""
    wire = wire or Wire()
    clients = {str(u): SecAggClient(str(u), config) for u in client_ids}
    server = SecAggServer(config)
    keys = {u: wire.send("keys", u, SERVER, c.public_keys()) for u, c in clients.items()}
    roster = server.collect_keys(keys)
    for u, c in clients.items():
        c.receive_peer_keys(wire.send("roster", SERVER, u, roster))
    outgoing = {u: wire.send("shares", u, SERVER, c.share_messages()) for u, c in clients.items()}
    for v, inbox in route_shares(outgoing).items():
        clients[v].receive_shares(wire.send("shares", SERVER, v, inbox))
    return server, clients


def run_exchange(server: SecAggServer, clients: Mapping[str, SecAggClient],
                 stats: Mapping[str, Mapping[str, np.ndarray]], round: int, exchange: str,
                 participants: Sequence[str], *, drop: Iterable[str] = (),
                 wire: Wire | None = None) -> dict[str, np.ndarray]:
    """One secure exchange: announce, mask, sum, reveal, unmask.

    Parameters
    ----------
    stats : mapping of client id to its named float arrays
        The inputs of (at least) the participants.
    participants : sequence of str
        The clients the server announces.
    drop : iterable of str
        Participants that go silent after the announcement (they mask nothing and reveal
        nothing): their masks are recovered from the survivors' shares.

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
        announced = wire.send("announce", SERVER, u, P)
        if u not in drop:
            y = clients[u].mask(stats[u], round, exchange, announced)
            masked[u] = wire.send("masked", u, SERVER, y)
    request = server.aggregate(masked)
    revealed = {}
    for u in request["survivors"]:
        req = wire.send("reveal-request", SERVER, u, request)
        revealed[u] = wire.send("reveal", u, SERVER, clients[u].reveal(
            round, exchange, req["survivors"], req["dropped"]))
    return server.unmask(revealed)
