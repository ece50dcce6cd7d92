"""Secure aggregation: the server learns only the sum of the participants' messages.

The protocol family of Bonawitz et al. (CCS 2017) and SecAgg+ (Bell et al., CCS 2020), on
primitives from ``cryptography`` (the optional extra ``fedlatent[privacy]``, imported on first
use): fixed-point encoding in Z_{2^64} with a public scale (:mod:`.encoding`); per client, drawn
from the OS once per fit, ONE X25519 key pair c_u, a nonce, and a self-mask seed b_u,e per planned
exchange e; per neighbour pair, ONE agreement X25519(c_u, c_v) at set-up, from which one key
derivation (NIST SP 800-56C's one-step KDF, SHA-512, bound to the set-up and the pair) gives the
pair's share-encryption key and its secret s_uv (:func:`.protocol.pair_keys`). Exchange e's pair
mask is the AES-256-CTR keystream of s_uv (Bonawitz et al.'s PRG) under a nonce hashed from the
exchange's label and slot, its next two words the pair's consistency tokens; the self mask is the
ChaCha20 keystream of b_u,e under another nonce hashed from the label. An exchange costs one
keystream per neighbour. The seeds are Shamir-shared limb-wise over GF(2^31 - 1) in NumPy
(:func:`.shamir.share_seeds`), every exchange's at once, and sealed in one AES-256-GCM message per
neighbour. :mod:`.driver` runs the whole protocol in memory.

Threat model (issue 37). Secure against a server that deviates from the protocol, colluding with
fewer than ``t`` of any honest client's neighbours (the secrecy condition of
:func:`.graph.plus_parameters`: a fraction ``gamma = 0.05`` of the clients), provided the sites
pin a roster of each other's Ed25519 keys (:mod:`fedlatent.engine.site.keys`): the roster is
what makes every pair secret its two sites' own and what bounds the colluders to rostered sites.
Four mechanisms:

* set-up commitments (:mod:`.commitments`): keys and a nonce committed before anything that
  orders the masking graph is revealed, the ring order a hash of the server's committed seed and
  every opening, a key added, changed or left out after the close refused: a client's
  neighbourhood is uniform whatever keys sybils choose;
* every client recomputes the graph's degree and threshold from the library's bounds and refuses
  a weaker graph (:func:`.commitments.check_strength`);
* a consistency round before every reveal (:mod:`.consistency`): each survivor confirms its split
  of its neighbourhood with a pair-secret token per surviving neighbour, reveals only by it, and
  a holder reveals a peer's share only with that peer's token: the server never obtains both a
  client's self-mask seed and all its pair masks unless ``t`` colluding neighbours hand over their
  shares (on a sparse graph a client never reveals its share of its own seed);
* authenticated peers: a client given its site's signing key signs its public keys for the run
  and the set-up; one given a pinned roster verifies every peer's signed keys before deriving
  anything from them, and then requires the consistency round. A deployed Flower SuperNode
  refuses secure aggregation without a roster (:func:`fedlatent.runtime.flower_site.
  require_roster`); the in-process and simulation runtimes provision keys and a roster for the
  sites they hold. A client given no roster trusts the server to relay keys and splits
  (honest-but-curious) and skips the consistency check.

Not protected: who takes part and who drops, the server's choice to abandon an exchange or a
set-up (each visible to the sites), the aggregate itself (differential privacy), and, with
``Federation(verified=False)``, the parameters a site is asked to evaluate (verified rounds, on
by default: each site checks its reply is in the sum and replays the server,
:mod:`fedlatent.engine.node.verify`). Cost (docs/privacy.md): the set-up is
one message more (the commitments) and a hash per enrolled client; a round one message more
(the confirmations) and a keystream word per neighbour.

Per exchange the server unmasks the sum with, from each survivor, its shares of its surviving
neighbours' seeds b_v,e (the self masks), and for a participant d that dropped, its pair mask
with d of exchange e: every surviving neighbour of d must answer that reveal (the server holds
no key of d from which to rebuild it), or the exchange stops naming the silent ones. Revealing
per-exchange pair masks is as strong as revealing Shamir shares of the dropped client's key
(Bonawitz et al.'s recovery) under the same threshold: a reveal gives one exchange's masks only
(other exchanges' are keystreams under other nonces), and with the consistency round a client's
reply is readable only with ``t`` colluding holders of its seed's shares (docs/privacy.md gives
the argument). A client declared dropped is excluded from later exchanges (defence in depth).

SecAgg+ (``SecAggConfig(degree=k, local_threshold=t)``, :mod:`.graph`): each client masks with,
and deals its shares to, only its k neighbours on a random k-regular graph (a Harary graph over
a ring order fixed as above); each seed is rebuilt from t of its k neighbours' shares. Every
client derives the graph itself and refuses a seed that does not match the commitment, the keys
of another neighbourhood, or a share from a non-neighbour. A round costs O(k) per client and
O(n k) on the server; ``degree=None`` (or ``>= n - 1``) is the complete graph, the all-pairs
protocol with its threshold over all the clients (a client's own share counts there).

Per-exchange secrets (``SecAggConfig(slots=E)``, what the engine uses): E self-mask seeds per
client, all shared at set-up, and exchange e uses only the e-th seed and its own pair masks, so
a client that drops in any exchange is recovered. With ``slots=None`` (one self-mask seed per
fit, pair masks per exchange label) a client whose self-mask seed was revealed can never be
recovered later.

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
