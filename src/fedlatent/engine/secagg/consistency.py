"""The consistency round: survivors sign how they split their neighbourhood before anyone reveals.

After the masked replies of an exchange are in, the server tells each survivor ``v`` which of the
participants of its neighbourhood survived (``S_v``) and which dropped (``D_v``). Before any
reveal, ``v`` signs (Ed25519, its site key) a *statement*: the exchange, its slot, its
participants ``P_v`` and survivors ``S_v`` as bits over its closed neighbourhood, and the
SHA-256 of the masked vector it sent (:func:`payload`, :func:`message`). It signs one split per
exchange and reveals only by it: its share of ``b_u`` for each ``u`` in ``S_v``, its pair mask
with each ``d`` in ``D_v``. The server relays to ``v`` the statements of the peers whose shares
it reveals; ``v`` reveals a share of ``b_u`` only holding ``u``'s valid statement that lists ``v``
among its survivors (:func:`check_rows`), and refuses when a statement is missing, does not
verify, or disagrees.

Why it holds against a server that lies (one exchange e, an honest client u; every other
exchange's secrets are independent: slots and nonces are per exchange). To read ``y_u`` the
server must remove ``u``'s self mask (``t`` shares of ``b_u,e``) and every pair mask
``m_uw,e``, ``w`` in ``P_u``. A pair mask ``m_uw,e`` leaves only ``w`` (when ``w`` signed
``u`` dropped) or ``u`` (when ``u`` signed ``w`` dropped). An honest holder ``w`` reveals its
share of ``b_u,e`` only with ``u``'s statement listing ``w`` as a survivor, so then neither
signed the other dropped: ``m_uw,e`` never leaves, and ``y_u`` stays masked. Every share of
``b_u,e`` the server can combine with all of ``u``'s pair masks thus comes from colluding
holders, and needs ``t`` of them (on a sparse graph a client never reveals its share of its own
seed; on the complete graph ``u``'s own share counts, so ``t - 1``). Telling some neighbours
that ``u`` dropped and others that it survived is refused by those told it survived (``u``'s
statement disagrees with what they were told, or lacks them) and gives nothing where it is not.

This is Bonawitz et al.'s consistency check (CCS 2017, round ConsistencyCheck of the malicious
model: survivors sign the survivor set before the unmasking) carried to Bell et al.'s sparse
graph (CCS 2020) per neighbourhood: each survivor signs its own neighbourhood's split, and a
holder checks the statement of the owner whose share it reveals, ``O(k)`` verifications per
client and exchange. It needs no quorum over two groups of honest holders (Bonawitz et al.'s
``t > (n + c) / 2``, which ``k`` of order ``log n`` could not meet) because a dropped client's
masks are recovered here from each surviving neighbour's pair mask, not from a threshold of
shares of its key: every surviving neighbour's cooperation is needed, and one statement suffices
to stop it.
"""

from __future__ import annotations

import bisect
import functools

from fedlatent.engine.secagg.protocol import SecureAggregationError, json_str

__all__ = ["PURPOSE", "SIGNATURE_BYTES", "check_rows", "head", "message", "payload",
           "row_width"]

#: what a consistency statement's signature is for
PURPOSE = "secagg-consistency"
SIGNATURE_BYTES = 64
FINGERPRINT_BYTES = 32


@functools.lru_cache(maxsize=64)
def head(run: str, round: int, label: bytes, slot: int) -> bytes:
    """The statements' common head of one exchange (the run, the set-up round, the exchange's
    label and slot): :func:`~fedlatent.engine.site.keys.statement_head`."""
    from fedlatent.engine.site.keys import statement_head

    return statement_head(PURPOSE, {"run": str(run), "round": int(round),
                                    "exchange": bytes(label).decode(), "slot": int(slot)})


def _bits(closed: tuple[str, ...], members) -> bytes:
    """``members`` as bits over ``closed`` (little-endian within each byte)."""
    out = bytearray((len(closed) + 7) // 8)
    for m in members:
        i = bisect.bisect_left(closed, m)
        out[i >> 3] |= 1 << (i & 7)
    return bytes(out)


def payload(closed: tuple[str, ...], participants, survivors, fingerprint: bytes) -> bytes:
    """A statement's signed content: the participants and the survivors as bits over the
    signer's closed neighbourhood ``closed`` (sorted), and its masked vector's SHA-256."""
    return _bits(closed, participants) + _bits(closed, survivors) + bytes(fingerprint)


def message(head_: bytes, site: str, body: bytes) -> bytes:
    """The signed bytes: the exchange's head, the signer's id (JSON), a zero byte, the body."""
    return head_ + json_str(site) + b"\x00" + body


def row_width(closed_size: int) -> int:
    """Bytes of a relayed statement: two bit masks, the fingerprint, the signature."""
    return 2 * ((closed_size + 7) // 8) + FINGERPRINT_BYTES + SIGNATURE_BYTES


def check_rows(me: str, owners: list[str], raw: bytes, width: int, head_: bytes,
               closed_of, key_of, where: str) -> None:
    """Refuse (SecureAggregationError naming the owner) unless ``raw`` holds, for each of
    ``owners`` in order, a statement (``width`` bytes: :func:`payload` and its signature) that
    its rostered key (``key_of(owner)``, raw 32 bytes) signed for this exchange and that lists
    ``me`` among its survivors (``closed_of(owner)``: its closed neighbourhood, sorted)."""
    from fedlatent.engine.site.keys import verify_bytes

    if len(raw) != width * len(owners):
        raise SecureAggregationError(
            f"client {me!r}: {where}: the consistency statements relayed hold {len(raw)} "
            f"bytes, not one statement of {width} bytes for each of its {len(owners)} "
            "surviving neighbours; refusing to reveal")
    body = width - SIGNATURE_BYTES
    for j, u in enumerate(owners):
        row = raw[j * width:(j + 1) * width]
        closed = closed_of(u)
        i = bisect.bisect_left(closed, me)
        mb = (len(closed) + 7) // 8
        if i == len(closed) or closed[i] != me or not row[mb + (i >> 3)] >> (i & 7) & 1:
            raise SecureAggregationError(
                f"client {me!r}: {where}: {u!r} signed that {me!r} did not survive in its "
                f"neighbourhood (or was not its participant), yet {me!r} was told {u!r} "
                "survived; the server told them different splits: refusing to reveal")
        if not verify_bytes(key_of(u), row[body:], message(head_, u, row[:body])):
            raise SecureAggregationError(
                f"client {me!r}: {where}: the consistency statement of {u!r} is missing or does "
                "not verify against its rostered key; refusing to reveal anything of it")
