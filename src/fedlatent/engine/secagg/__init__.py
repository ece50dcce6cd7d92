"""Secure aggregation: the server learns only the sum of the participants' messages.

The protocol family of Bonawitz et al. (CCS 2017) and SecAgg+ (Bell et al., CCS 2020), on
primitives from ``cryptography`` (the optional extra ``fedlatent[privacy]``, imported on first
use): fixed-point encoding in Z_{2^64} with a public scale (:mod:`.encoding`); per client, drawn
from the OS once per fit, ONE X25519 key pair c_u and a self-mask seed b_u,e per planned
exchange e; per neighbour pair, ONE agreement X25519(c_u, c_v) at set-up, from which HKDF
(bound to the run and the pair) derives the pair's share-encryption key and its mask
secret s_uv (:func:`.protocol.pair_keys`). Exchange e's pair mask is the AES-256-CTR
keystream of s_uv (Bonawitz et al.'s PRG) under a nonce hashed from the exchange's label (each
client masks an exchange once: one keystream per pair and exchange); the self mask is the
ChaCha20 keystream of b_u,e under another nonce hashed from the label. An exchange costs one
keystream per neighbour: no key agreement, no key derivation, no key schedule (each pair's
cipher is made once per fit). The seeds b_u,e are Shamir-shared limb-wise over GF(2^31 - 1)
in NumPy (:func:`.shamir.share_seeds`), every exchange's at once, and sealed in one
ChaCha20-Poly1305 message per neighbour. :mod:`.driver` runs the whole protocol in memory.

Per exchange the server unmasks the sum with, from each survivor, its shares of its surviving
neighbours' seeds b_v,e (the self masks), and for a participant d that dropped, its pair mask
with d of exchange e: every surviving neighbour of d must answer that reveal (the server holds
no key of d from which to rebuild it), or the exchange stops naming the silent ones.

Why revealing per-exchange pair masks is as strong as revealing Shamir shares of the dropped
client's key (Bonawitz et al.'s recovery), under the same neighbourhood threshold t:

* what a reveal gives is bounded to one exchange: mask_uv,e is AES-CTR's keystream of s_uv
  under exchange e's nonce, so the masks of every other exchange (other nonces) stay
  pseudo-random given it; s_uv and c_u never leave the clients. (Until 2026-11 the reveal was a
  32-byte per-exchange seed whose keystream was the mask; revealing the mask itself gives the
  server exactly what it subtracts, no more, and spares every exchange a key schedule per
  pair.) Rebuilding d's key instead gave the server every pair mask of d for that slot, no
  more: the per-slot keys of the old design bound it the same way.
* to read a client u's reply y_u,e the server must remove its self mask (b_u,e) and every pair
  mask of u with its participating neighbours in e. An honest neighbour v answers one reveal per
  exchange and gives, for u, either its share of b_u,e (it was told u survived) or mask_uv,e (u
  dropped), never both (the rule below). If u really dropped, y_u,e never arrived. If the
  server received y_u,e and declares u dropped to get the pair masks, no honest neighbour gives
  a share of b_u,e in that exchange, so the server needs t shares from corrupt neighbours: the
  same ``t`` corrupt neighbours an attacker needs to rebuild both of u's secrets in the old
  protocol. If it declares u a survivor, honest neighbours give no pair mask of u and it needs
  every participating neighbour of u corrupt (the graph's "no small sum" condition bounds that).
* a client declared dropped is still excluded from later exchanges, as before, but it need not
  be for secrecy: its later secrets (b_u,e' and mask_uv,e' for e' != e) are untouched by the
  recovery. The exclusion is kept as defence in depth and because the engine treats a dropped
  client as out of the fit (its history records it so).

SecAgg+ (``SecAggConfig(degree=k, local_threshold=t)``, :mod:`.graph`): each client masks with,
and deals its shares to, only its k neighbours on a random k-regular graph (a Harary graph over
a ring order fixed by public randomness: a seed the server commits to before the keys, hashed
with every enrolled id and fresh X25519 key); each seed is rebuilt from t of the k + 1 shares of
its neighbourhood. Every client derives the graph itself and refuses a seed that does not match
the commitment, the keys of another neighbourhood, or a share from a non-neighbour. A round
costs O(k) per client and O(n k) on the server; ``degree=None`` (or ``>= n - 1``) is the complete
graph, the all-pairs protocol with its threshold over all the clients.

Authenticated peers (optional): a client given its site's Ed25519 signing key signs its public
keys for the run and the set-up round; a client given a pinned roster of site keys
(:mod:`fedlatent.engine.site.keys`) verifies every peer's signed keys before deriving anything
from them and aborts naming an unknown, unsigned or substituted peer. Without a roster the
server is trusted to relay the keys faithfully (honest-but-curious), as before.

Per-exchange secrets (``SecAggConfig(slots=E)``, what the engine uses): E self-mask seeds per
client, all shared at set-up, and exchange e uses only the e-th seed and its own pair masks, so
a client that drops in any exchange (not only its first) is recovered. With ``slots=None`` (one
self-mask seed per fit, pair masks per exchange label) a client whose self-mask seed was revealed
can never be recovered later.

Multi-round rule: an honest client never reveals both its share of a peer's self-mask seed and
its pair mask with that peer for the same slot (with ``slots=None``: over the whole fit). A
dropped client is excluded from later exchanges (it must rejoin with new keys); without slots,
a client whose self-mask seed was revealed (it survived an exchange) cannot later be declared
dropped: its peers refuse, and that exchange is abandoned.
"""

from fedlatent.engine.secagg.client import SecAggClient
from fedlatent.engine.secagg.driver import Wire, run_exchange, setup
from fedlatent.engine.secagg.encoding import FixedPoint, Layout
from fedlatent.engine.secagg.protocol import SecAggConfig, SecureAggregationError
from fedlatent.engine.secagg.server import SecAggServer, route_shares

__all__ = [
    "FixedPoint",
    "Layout",
    "SecAggClient",
    "SecAggConfig",
    "SecAggServer",
    "SecureAggregationError",
    "Wire",
    "route_shares",
    "run_exchange",
    "setup",
]
