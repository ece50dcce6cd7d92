"""One integer seed from what a user gives as ``random_state``, and the generators keyed by
(seed, client, round, purpose) drawn from it (re-exported by
:mod:`fedlatent.engine.contract.model`)."""

from __future__ import annotations

import zlib

import numpy as np

__all__ = ["client_key", "client_keys", "client_rng", "resolve_seed", "server_rng"]


def resolve_seed(random_state) -> int:
    """One integer seed from an int, a Generator or None (fresh entropy)."""
    if random_state is None:
        return int(np.random.SeedSequence().entropy % (2**63))
    if isinstance(random_state, np.random.Generator):
        return int(random_state.integers(0, 2**63 - 1))
    if isinstance(random_state, np.random.RandomState):
        return int(random_state.randint(0, 2**31 - 1))
    return int(random_state)


def client_key(client_id: str) -> int:
    """A stable integer for a client id (independent of client order and runtime)."""
    return zlib.crc32(str(client_id).encode("utf-8"))


def client_keys(client_ids) -> np.ndarray:
    """:func:`client_key` of every id, as an int64 array (one pass, no call per id)."""
    crc = zlib.crc32
    return np.fromiter((crc(str(c).encode("utf-8")) for c in client_ids), dtype=np.int64,
                       count=len(client_ids))


def client_rng(seed: int, client_id: str, round_: int, purpose: int = 0) -> np.random.Generator:
    """The generator of one client in one round.

    Equivalent to ``Generator.spawn`` children, but addressed by (client, round, purpose) instead
    of by spawn order, so results do not depend on client order, on the runtime, or on where a
    resumed run restarts.
    """
    key = (client_key(client_id), round_, purpose)
    ss = np.random.SeedSequence(entropy=int(seed), spawn_key=key)
    return np.random.default_rng(ss)


def server_rng(seed: int, round_: int, purpose: int = 0) -> np.random.Generator:
    ss = np.random.SeedSequence(entropy=int(seed), spawn_key=(2**32 + 7, round_, purpose))
    return np.random.default_rng(ss)
