"""Secure aggregation: the server learns only the sum of the participants' messages.

The protocol family of Bonawitz et al. (CCS 2017) and SecAgg+ (Bell et al., CCS 2020), on
primitives from ``cryptography`` (the optional extra ``fedlatent[privacy]``, imported on first
use): fixed-point encoding in Z_{2^64} with a public scale (:mod:`.encoding`), X25519 key pairs and
a self-mask seed per client drawn from the OS once per fit, Shamir shares of the mask key and the
seed sealed with ChaCha20-Poly1305 for each peer (:mod:`.shamir`), pairwise and self masks from the
ChaCha20 keystream of HKDF-derived per-exchange keys, and recovery of dropped participants' masks
from the survivors' shares. :mod:`.driver` runs the whole protocol in memory.

SecAgg+ (``SecAggConfig(degree=k, local_threshold=t)``, :mod:`.graph`): each client masks with,
and deals its shares to, only its k neighbours on a random k-regular graph (a Harary graph over a
ring order fixed by public randomness: a seed the server commits to before the keys, hashed with
every enrolled id and fresh share-encryption key); each secret is rebuilt from t of the k + 1
shares of its neighbourhood. Every client derives the graph itself and refuses a seed that does
not match the commitment, the keys of another neighbourhood, or a share from a non-neighbour.
A round costs O(k) per client and O(n k) on the server; ``degree=None`` (or ``>= n - 1``) is the
complete graph, the all-pairs protocol with its threshold over all the clients.

Authenticated peers (optional): a client given its site's Ed25519 signing key signs its public
keys for the run and the set-up round; a client given a pinned roster of site keys
(:mod:`fedlatent.engine.site.keys`) verifies every peer's signed keys before deriving anything
from them and aborts naming an unknown, unsigned or substituted peer. Without a roster the
server is trusted to relay the keys faithfully (honest-but-curious), as before.

Per-exchange secrets (``SecAggConfig(slots=E)``, what the engine uses): every client draws E
mask key pairs and E self-mask seeds at set-up, all shared then, and exchange e uses only the
e-th; revealing one exchange's secrets reveals nothing of another, so a client that drops in
any exchange (not only its first) is recovered. With ``slots=None`` (one secret of each kind
per fit) a client whose self-mask seed was revealed can never be recovered later.

Multi-round rule: over a fit, an honest client never reveals both the self-mask seed and the
mask key of the same peer (of the same exchange, with slots). A dropped client whose mask key
was rebuilt is excluded from later exchanges (it must rejoin with new keys); without slots, a
client whose self-mask seed was revealed (it survived an exchange) cannot later be declared
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
