"""What the secure-aggregation client and server share: settings, the roster, mask derivation.

Masks are derived per exchange: the label ``(round, exchange)`` enters HKDF's ``info``, so every
exchange of a fit gets independent keystreams from keys agreed once per fit.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

import fedlatent.engine.secagg._crypto as _crypto
from fedlatent.engine.secagg.encoding import FixedPoint

__all__ = ["KEYS_PURPOSE", "Roster", "SecAggConfig", "SecureAggregationError", "as_bytes",
           "as_u8", "exchange_label", "keys_payload", "pair_mask", "self_mask", "slot_item"]

KEY_FIELDS = ("mask_key", "enc_key", "self_commit")
#: the optional field carrying a client's Ed25519 signature of its public keys
#: (:mod:`fedlatent.engine.site.keys`); 64 zero bytes in the roster: unsigned
SIGNATURE_FIELD, SIGNATURE_BYTES = "signature", 64
#: what a site's signature of its key-agreement keys is for
KEYS_PURPOSE = "secagg-keys"


def keys_payload(keys: Mapping[str, bytes]) -> bytes:
    """The bytes a site signs of its public keys: the key fields in a fixed order."""
    return b"".join(bytes(keys[f]) for f in KEY_FIELDS)


class SecureAggregationError(RuntimeError):
    """A secure-aggregation exchange cannot go on (too few survivors, a refused reveal, a bad
    message); the message names the exchange, the client and the rule."""


@dataclass(frozen=True)
class SecAggConfig:
    """Public settings every client and the server share.

    Parameters
    ----------
    threshold : int
        Shares needed to rebuild a client's secrets, so the fewest survivors an exchange can
        unmask. Must exceed half the clients enrolled at set-up, so that no two disjoint groups of
        honest clients can each hand the server a different kind of secret for the same client.
    encoding : FixedPoint
        The public fixed-point scale and bounds.
    slots : int or None
        None (one mask key and one self-mask seed per client for the whole fit): a client whose
        self-mask seed was revealed (it survived an exchange) can never be recovered later.
        An int E: every client draws E mask key pairs and E self-mask seeds at set-up, all
        Shamir-shared then, and exchange number e (0 <= e < E, assigned by the server's
        :meth:`~.server.SecAggServer.announce`) uses only the e-th of each; revealing the
        secrets of one exchange reveals nothing of another, so a client that drops in any
        exchange is recovered (and excluded for the rest of the fit).
    """

    threshold: int
    encoding: FixedPoint
    slots: int | None = None

    @property
    def n_slots(self) -> int:
        """Secrets per client: one per planned exchange (``slots``), or one for the fit."""
        return 1 if self.slots is None else int(self.slots)

    def check_clients(self, n_clients: int) -> None:
        """Refuse a threshold outside (n_clients / 2, n_clients]."""
        t = self.threshold
        if not (isinstance(t, int | np.integer) and 2 * t > n_clients and t <= n_clients):
            lo = n_clients // 2 + 1
            raise ValueError(
                f"secure aggregation threshold {t!r} for {n_clients} clients: it must be an "
                f"integer in [{lo}, {n_clients}] (more than half the clients, at most all of "
                f"them); set threshold={max(lo, 2) if n_clients >= 2 else n_clients}, say")


def exchange_label(round: int, exchange: str) -> bytes:
    """The public context of one exchange, bound into every mask it uses."""
    return json.dumps([int(round), str(exchange)]).encode()


def describe(round: int, exchange: str) -> str:
    return f"round {int(round)}, exchange {str(exchange)!r}"


def self_mask(seed: bytes, label: bytes, n: int) -> np.ndarray:
    """A client's own mask for one exchange: PRG(HKDF(b_u; info=label))."""
    return _crypto.prg_uint64(_crypto.derive_key(seed, b"fedlatent/secagg/self\x00" + label), n)


def pair_mask(shared: bytes, label: bytes, n: int) -> np.ndarray:
    """The mask a pair of clients shares in one exchange: PRG(HKDF(X25519(s_u, s_v); label))."""
    return _crypto.prg_uint64(_crypto.derive_key(shared, b"fedlatent/secagg/pair\x00" + label), n)


def as_u8(data: bytes) -> np.ndarray:
    """Bytes as a uint8 array (what crosses Flower's ArrayRecord)."""
    return np.frombuffer(bytes(data), dtype=np.uint8).copy()


def as_bytes(arr, *, what: str, size: int | None = None) -> bytes:
    """A received uint8 array back to bytes, checking its dtype and (optionally) its length."""
    a = np.asarray(arr)
    if a.dtype != np.uint8 or a.ndim != 1:
        raise SecureAggregationError(f"{what}: expected a 1-d uint8 array, got dtype {a.dtype} "
                                     f"with shape {a.shape}")
    if size is not None and a.size != size:
        raise SecureAggregationError(f"{what}: expected {size} bytes, got {a.size}")
    return a.tobytes()


def _per(field: str, config: SecAggConfig) -> int:
    """32-byte items per client in a key field: one per slot for mask keys and commitments."""
    return 1 if field == "enc_key" else config.n_slots


def slot_item(blob: bytes, slot: int) -> bytes:
    """The 32 bytes of ``slot`` in a per-slot key field."""
    return blob[32 * slot:32 * slot + 32]


class Roster:
    """The clients enrolled at set-up, their public keys and their Shamir x-coordinates.

    Parameters
    ----------
    keys : mapping of client id to {"mask_key", "enc_key", "self_commit"} uint8 arrays
        What each client's :meth:`SecAggClient.public_keys` sent to the server.
    config : SecAggConfig
    """

    def __init__(self, keys: Mapping[str, Mapping[str, np.ndarray]], config: SecAggConfig):
        ids = sorted(str(u) for u in keys)
        if len(set(ids)) != len(keys):
            raise SecureAggregationError("client ids must be distinct strings")
        config.check_clients(len(ids))
        self.ids = tuple(ids)
        self.index = {u: i + 1 for i, u in enumerate(ids)}
        self.keys: dict[str, dict[str, bytes]] = {}
        for u in ids:
            msg = keys[u]
            missing = [f for f in KEY_FIELDS if f not in msg]
            if missing:
                raise SecureAggregationError(f"client {u!r}: public keys lack {missing}; send "
                                             "what SecAggClient.public_keys() returns")
            self.keys[u] = {f: as_bytes(msg[f], what=f"client {u!r}: field {f!r}",
                                        size=32 * _per(f, config))
                            for f in KEY_FIELDS}
        #: each client's signature of its keys (64 zero bytes: it sent none)
        self.signatures = {u: bytes(SIGNATURE_BYTES) if keys[u].get(SIGNATURE_FIELD) is None
                           else as_bytes(keys[u][SIGNATURE_FIELD], size=SIGNATURE_BYTES,
                                         what=f"client {u!r}: field {SIGNATURE_FIELD!r}")
                           for u in ids}
        for f in ("mask_key", "enc_key"):
            seen: dict[bytes, str] = {}
            for u in ids:
                k = self.keys[u][f]
                if k in seen:
                    raise SecureAggregationError(f"clients {seen[k]!r} and {u!r} announce the "
                                                 f"same {f}; every client draws its own keys")
                seen[k] = u

    def to_message(self) -> dict:
        """The flat broadcast: ``ids`` (a JSON list, sorted) and one (n, 32) uint8 array per key
        field, rows in the order of ``ids``."""
        msg: dict = {"ids": json.dumps(list(self.ids))}
        for f in KEY_FIELDS:
            msg[f] = np.stack([as_u8(self.keys[u][f]) for u in self.ids])
        if any(any(s) for s in self.signatures.values()):  # relayed when any client signed
            msg[SIGNATURE_FIELD] = np.stack([as_u8(self.signatures[u]) for u in self.ids])
        return msg

    @classmethod
    def from_message(cls, msg: Mapping, config: SecAggConfig) -> Roster:
        """Inverse of :meth:`to_message`, checking its form."""
        try:
            ids = json.loads(msg["ids"])
            assert isinstance(ids, list) and all(isinstance(u, str) for u in ids)
        except (KeyError, TypeError, ValueError, AssertionError) as exc:
            raise SecureAggregationError("the roster's 'ids' must be a JSON list of client id "
                                         "strings") from exc
        keys: dict[str, dict] = {u: {} for u in ids}
        for f in KEY_FIELDS:
            a = np.asarray(msg.get(f))
            width = 32 * _per(f, config)
            if a.dtype != np.uint8 or a.shape != (len(ids), width):
                raise SecureAggregationError(f"the roster's {f!r} must be a ({len(ids)}, {width})"
                                             f" uint8 array, got {a.dtype} {a.shape}")
            for u, row in zip(ids, a):
                keys[u][f] = row
        if msg.get(SIGNATURE_FIELD) is not None:
            a = np.asarray(msg[SIGNATURE_FIELD])
            if a.dtype != np.uint8 or a.shape != (len(ids), SIGNATURE_BYTES):
                raise SecureAggregationError(
                    f"the roster's {SIGNATURE_FIELD!r} must be a ({len(ids)}, {SIGNATURE_BYTES}) "
                    f"uint8 array, got {a.dtype} {a.shape}")
            for u, row in zip(ids, a):
                keys[u][SIGNATURE_FIELD] = row
        if len(set(ids)) != len(ids):
            raise SecureAggregationError("the roster lists a client twice")
        return cls(keys, config)

    @property
    def n(self) -> int:
        return len(self.ids)

    def check_members(self, members: Iterable[str], *, what: str) -> list[str]:
        """Sorted distinct members, all enrolled (error naming an unknown one)."""
        members = [str(m) for m in members]
        unknown = sorted(set(members) - set(self.ids))
        if unknown:
            raise SecureAggregationError(f"{what}: {unknown} did not take part in the key "
                                         "set-up; they need a new set-up to join")
        if len(set(members)) != len(members):
            raise SecureAggregationError(f"{what}: a client is listed twice")
        return sorted(members)
