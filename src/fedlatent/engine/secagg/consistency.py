"""The consistency round: each survivor commits to its split of its neighbourhood before anyone
reveals, and a holder reveals a peer's share only with that peer's word that it survived.

After the masked replies of an exchange are in, the server tells each survivor ``u`` which of
the participants of its neighbourhood survived (``S_u``) and which dropped (``D_u``). Before any
reveal, ``u`` answers once per exchange with its *confirmations*: for each ``w`` in ``S_u``
(itself aside), the token ``tau(u -> w)``, a keystream word of the pair's secret ``s_uw`` that
only ``u`` and ``w`` can compute (:func:`split_words`); for the others, zeros. It reveals only by
the split it confirmed: its share of ``b_w`` for each ``w`` in ``S_u``, its pair mask with each
``d`` in ``D_u``. The server relays to ``w`` the confirmations of the owners whose shares it
reveals; ``w`` reveals its share of ``b_u`` only holding ``tau(u -> w)``, and refuses when one
is missing or wrong (:func:`check`).

Why it holds against a server that lies (one exchange e, an honest client u; every other
exchange's secrets are independent: slots, nonces and tokens are per exchange). To read
``y_u`` the server must remove ``u``'s self mask (``t`` shares of ``b_u,e``) and every pair mask
``m_uw,e``, ``w`` in ``P_u``. A pair mask ``m_uw,e`` leaves only ``w`` (when told ``u``
dropped) or ``u`` (when ``w`` is in ``D_u``). An honest holder ``w`` reveals its share of
``b_u,e`` only with ``tau(u -> w)``, which ``u`` gave only because ``w`` is in ``S_u`` (the
server cannot forge it: the keystream of ``s_uw``, AES-CTR, is pseudo-random without the
pair's secret, and its token words are never revealed, not even with a dropped peer's pair
mask); so neither ``u`` nor ``w`` ever reveals ``m_uw,e``, and ``y_u`` stays masked. Every
share of ``b_u,e`` the server can combine with all of ``u``'s pair masks thus comes from
colluding holders, and needs ``t`` of them (on a sparse graph a client never reveals its share
of its own seed; on the complete graph ``u``'s own share counts, so ``t - 1``). Telling some
neighbours that ``u`` dropped and others that it survived is refused by those told it
survived whenever ``u``'s own split disagrees; where it does not, it yields nothing. The
pair's secret comes from X25519 keys that every site signed (Ed25519) and its peers verified
against their pinned roster once per fit, so a token authenticates ``u`` to ``w`` as a
signature would, at the cost of a keystream word.

This is Bonawitz et al.'s consistency check (CCS 2017, round ConsistencyCheck of the malicious
model: the survivors confirm the survivor set before the unmasking), carried to Bell et al.'s
sparse graph (CCS 2020) per neighbourhood: each survivor confirms its own neighbourhood's
split, and a holder checks the confirmation of each owner whose share it reveals, ``O(k)``
comparisons per client and exchange. It needs no quorum over two groups of honest holders
(Bonawitz et al.'s ``t > (n + c) / 2``, which ``k`` of order ``log n`` cannot meet) because a
dropped client's masks are recovered here from each surviving neighbour's pair mask, not from a
threshold of shares of its key: every surviving neighbour's cooperation is needed, and one
missing confirmation suffices to stop it.
"""

from __future__ import annotations

import numpy as np

from fedlatent.engine.secagg.protocol import SecureAggregationError

__all__ = ["TOKEN_WORDS", "check", "split_words"]

#: keystream words a pair's exchange keystream carries beyond the mask: a token each way
TOKEN_WORDS = 2


def split_words(rows: np.ndarray, before: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``(out, in)``: from each peer's exchange keystream (``rows``, one row of ``n + 2`` words
    per peer, peers sorted, the first ``before`` of them sorting before this client), the token
    this client gives the peer (``tau(me -> peer)``) and the one it expects from it
    (``tau(peer -> me)``): word ``n`` goes from the smaller id to the larger, word ``n + 1``
    the other way."""
    lower = np.arange(len(rows)) >= before  # this client's id is the smaller
    out = np.where(lower, rows[:, n], rows[:, n + 1])
    into = np.where(lower, rows[:, n + 1], rows[:, n])
    return out.astype(np.uint64, copy=False), into.astype(np.uint64, copy=False)


def check(me: str, owners: list[str], got, want: np.ndarray, where: str, *,
          digest: bool = False) -> None:
    """Refuse (SecureAggregationError naming the first owner) unless ``got``, the relayed
    confirmations of ``owners`` (one uint64 word each, as bytes or an array), equals ``want``,
    the tokens this client expects from them."""
    a = np.asarray(got)
    if a.dtype == np.uint8 and a.ndim == 1 and a.size == 8 * len(owners):
        if a.tobytes() == np.asarray(want, "<u8").tobytes():  # every one right (the common
            return  # case): one comparison of the bytes
        a = a.view("<u8")
    if a.shape != (len(owners),):
        raise SecureAggregationError(
            f"client {me!r}: {where}: the relayed confirmations must be one word for each of "
            f"its {len(owners)} surviving neighbours, got {a.dtype} {a.shape}; refusing to "
            "reveal")
    bad = np.flatnonzero(a.astype(np.uint64) != want)
    if bad.size:
        u = owners[int(bad[0])]
        raise SecureAggregationError(
            f"client {me!r}: {where}: {u!r} did not confirm {me!r} as a survivor of its "
            f"neighbourhood (its confirmation is missing or wrong), yet {me!r} was told {u!r} "
            "survived: the server told them different splits" + (
                " or showed them different transcripts of the exchange before (or, in a "
                "verified fit, told them different setups, units or seeds)" if digest
                else "") + "; refusing to reveal anything")
