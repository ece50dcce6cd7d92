"""The SecAgg+ masking graph: whom each client masks with and deals its Shamir shares to.

Bell et al. (CCS 2020) replace the complete graph of Bonawitz et al. (every client masks with
every other) by a random k-regular graph: a client masks with its k neighbours only and deals
the Shamir shares of its secrets to them (and keeps one, which it never reveals), each secret
rebuilt from ``t`` of its neighbours' ``k`` shares. The graph here is the Harary graph H(k, n)
(the circulant graph in which the client at ring position i is adjacent to positions i +- 1,
..., i +- k/2) over a uniformly random ring order of the clients. The order is public randomness
nobody steers: the ChaCha20 keystream of SHA-256 over a seed the server committed to before any
client drew its keys, the enrolled ids and each client's opening (a hash of its fresh key and
nonce, committed before any was revealed: :mod:`~fedlatent.engine.secagg.commitments`;
:func:`graph_digest`). Every client rebuilds the graph from the roster it was sent and the
revealed seed, after checking the seed against the commitment it got first and every opening
against the closed list of commitments; nobody takes a neighbour list from the server.

``degree=None`` or ``degree >= n - 1`` is the complete graph: the all-pairs protocol of
Bonawitz et al. with its threshold over all the clients.

:func:`plus_parameters` chooses ``(k, t)`` for ``n`` clients, participation ``p``, a dropout
fraction ``delta`` and a fraction ``gamma`` of clients colluding with the server, with
statistical security ``sigma`` and correctness ``eta`` bits (module docstring of
:mod:`fedlatent.engine.secagg.secure` and docs/privacy.md give the argument).

References
----------
Bell, Bonawitz, Gascon, Lepoint, Raykova, "Secure Single-Server Aggregation with
(Poly)Logarithmic Overhead", CCS 2020. Harary, "The maximum connectivity of a graph", PNAS 1962.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

import fedlatent.engine.secagg._crypto as _crypto
from fedlatent.engine.protocol.messages import frozen, same_frozen

__all__ = ["GRAPH_TAG", "MaskingGraph", "binom_log_tails", "digest_of", "graph_digest",
           "openings_digest", "plus_parameters", "secrecy_threshold"]

GRAPH_TAG = b"fedlatent/secagg/graph\x00"


def graph_digest(seed: bytes, ids_json: str, openings: np.ndarray) -> bytes:
    """SHA-256 of the tag, the server's seed and :func:`openings_digest` of the enrolled ids
    (their sorted JSON list) and every enrolled client's opening (an (n, 32) array in that
    order, :func:`~fedlatent.engine.secagg.commitments.opening`).

    The openings hash each client's fresh X25519 key and nonce, committed before any of them
    was revealed, and the seed was committed before the clients drew them: neither the server
    nor a client can steer the ring order (:mod:`~fedlatent.engine.secagg.commitments`).
    """
    return digest_of(seed, openings_digest(ids_json, openings))


def openings_digest(ids_json: str, openings: np.ndarray) -> bytes:
    """SHA-256 of the ids' SHA-256 and every opening (the content the ring order and the
    check of the commitments both hash, computed once per roster).

    A pure function of public data, remembered for the last few rosters of the process and
    found by comparing the openings (not a hash of them): in-process clients each check the
    same n openings, and hashing them once per client cost 6% of the set-up at 10,000 clients (a
    real client hashes them once: 1 ms). They are compared in place, eight bytes at a time: a
    copy of them as bytes (320 KB at 10,000 clients, fresh pages each time) cost 0.3 ms a
    client, 4% of the set-up there. Openings the in-process runtime relays uncopied (the
    server's, which nobody can write) are found without comparing them."""
    flat, text = np.ascontiguousarray(openings, dtype=np.uint8).reshape(-1), str(ids_json)
    words = flat.view(np.uint64) if flat.size % 8 == 0 else flat
    for seen_text, seen, got in tuple(_CONTENTS):
        if seen_text == text and seen.dtype == words.dtype and (
                same_frozen(seen, words) or np.array_equal(seen, words)):
            return got
    got = _crypto.commit(_ids_commit(text) + flat.tobytes())
    kept = words if frozen(words) else words.copy()  # (a frozen array: nobody changes it)
    kept.flags.writeable = False
    _CONTENTS[:] = [(text, kept, got), *_CONTENTS[:3]]
    return got


#: ``(ids JSON, openings as read-only words, their digest)`` of the last rosters
#: :func:`openings_digest` hashed
_CONTENTS: list[tuple[str, np.ndarray, bytes]] = []


def digest_of(seed: bytes, content: bytes) -> bytes:
    """:func:`graph_digest` from an :func:`openings_digest` already computed."""
    return _crypto.commit(GRAPH_TAG + bytes(seed) + bytes(content))


@lru_cache(maxsize=8)
def _ids_commit(ids_json: str) -> bytes:
    """SHA-256 of the ids' JSON list (once per list in a process: every client hashes it)."""
    return _crypto.commit(ids_json.encode())


class MaskingGraph:
    """The closed neighbourhoods of a k-regular Harary graph over a random ring order.

    Parameters
    ----------
    ids : sequence of str
        The enrolled clients, sorted.
    degree : int or None
        Neighbours per client, even (an odd degree is raised by one); None or >= n - 1: the
        complete graph.
    digest : bytes or None
        32 bytes of public randomness fixing the ring order (:func:`graph_digest`); needed for a
        sparse graph.
    """

    def __init__(self, ids: Sequence[str], degree: int | None, digest: bytes | None):
        self.ids = tuple(ids)
        n = len(self.ids)
        self.complete = degree is None or int(degree) >= n - 1
        self.degree = n - 1 if self.complete else int(degree) + int(degree) % 2
        self._index = dict(zip(self.ids, range(n)))
        self._closed: dict[str, tuple[str, ...]] = {}
        self._closed_sets: dict[str, frozenset] = {}
        self._closed_index: dict[str, np.ndarray] = {}
        if self.complete:
            return
        if self.degree < 2:
            raise ValueError(f"a masking graph needs an even degree >= 2, got {degree!r}")
        if digest is None or len(digest) != 32:
            raise ValueError("a sparse masking graph needs 32 bytes of public randomness")
        words = _crypto.prg_uint64(bytes(digest), n)
        order = np.lexsort((np.arange(n), words))  # ring position -> client index
        self._order = order
        self._position = np.empty(n, dtype=np.int64)
        self._position[order] = np.arange(n)

    @staticmethod
    def of(ids: Sequence[str], degree: int | None, digest: bytes | None) -> MaskingGraph:
        """``MaskingGraph(ids, degree, digest)``, the same object for the same arguments within
        a process: a pure function of public inputs, so in-process clients that each derived
        the same digest from their own roster share one ring order instead of sorting n
        words each (nothing secret is cached; a client still checks the seed and its
        neighbourhood itself)."""
        degree = None if degree is None else int(degree)
        digest = None if digest is None else bytes(digest)
        for key, graph in tuple(_GRAPHS):  # the ids compared last: n strings (one object: at once)
            if key == (degree, digest) and (graph.ids is ids or graph.ids == tuple(ids)):
                return graph
        graph = MaskingGraph(ids, degree, digest)
        _GRAPHS[:] = [((degree, digest), graph), *_GRAPHS[:7]]
        return graph

    @property
    def n(self) -> int:
        return len(self.ids)

    def closed(self, u: str) -> tuple[str, ...]:
        """``u`` and its neighbours, sorted (everyone on the complete graph)."""
        got = self._closed.get(u)
        if got is None:
            if self.complete:
                got = self.ids
            else:
                half = self.degree // 2
                at = self._position[self._index[u]] + np.arange(-half, half + 1)
                got = tuple(sorted(self.ids[i] for i in self._order[at % self.n]))
            self._closed[u] = got
        return got

    def closed_set(self, u: str) -> frozenset:
        """:meth:`closed` as a set (built once per client and graph)."""
        got = self._closed_sets.get(u)
        if got is None:
            got = self._closed_sets[u] = frozenset(self.closed(u))
        return got

    def closed_index(self, u: str) -> np.ndarray:
        """:meth:`closed` as positions among the sorted ids (built once per client and graph)."""
        got = self._closed_index.get(u)
        if got is None and self.complete:  # one array for everyone
            got = self._closed_index[u] = self._closed_index.setdefault(
                "", np.arange(self.n, dtype=np.int64))
        elif got is None:
            index = self._index
            got = self._closed_index[u] = np.array([index[v] for v in self.closed(u)],
                                                   dtype=np.int64)
        return got

    def neighbours(self, u: str) -> tuple[str, ...]:
        """``u``'s neighbours, sorted (``u`` excluded)."""
        return tuple(v for v in self.closed(u) if v != u)

    def adjacent(self, u: str, v: str) -> bool:
        """Whether ``u`` and ``v`` share an edge (or are the same client)."""
        if self.complete or u == v:
            return True
        gap = abs(int(self._position[self._index[u]]) - int(self._position[self._index[v]]))
        return min(gap, self.n - gap) <= self.degree // 2


#: the last graphs :meth:`MaskingGraph.of` built, ``((degree, digest), graph)`` (found by
#: comparing the ids, not hashing them: a tuple of n ids is hashed anew at every lookup, 2% of
#: the set-up at 10,000 clients)
_GRAPHS: list[tuple[tuple, MaskingGraph]] = []


# ---- the parameters ----------------------------------------------------------------------------
@lru_cache(maxsize=64)  # every client recomputes it (twice) from the same public numbers
def plus_parameters(n: int, participation: float = 1.0, *, dropout: float = 0.05,
                    corrupt: float = 0.05, sigma: int = 40, eta: int = 20,
                    exchanges: int = 128) -> tuple[int, int]:
    """``(k, t)``: the smallest even degree ``k`` for which a neighbourhood threshold ``t``
    meets, for ``n`` clients, the three conditions of Bell et al. (each a union bound over the
    clients), and the largest such ``t``:

    * secrecy: no honest client has ``t`` corrupt neighbours (they alone would rebuild both
      its secrets): ``n P[Bin(k, gamma) >= t] <= 2^-sigma``;
    * no small sum: the server learns the sum of each connected part of the graph on the
      honest survivors; two parts need two runs of ``k / 2`` consecutive ring positions without
      an honest survivor: ``n^2 / 2 (1 - (1 - gamma) rho)^k <= 2^-sigma``,
      ``rho = p (1 - delta)``;
    * correctness: a participant's neighbours hold ``t`` surviving participants in every
      exchange: ``n E P[Bin(k, rho) < t] <= 2^-eta``.

    Returns ``(n - 1, 0)`` (the complete graph; its threshold is the caller's) when no such
    ``k`` is at most half the other clients: a graph not much sparser than the complete one
    would give up the complete graph's threshold over all the clients for little.
    """
    rho = float(participation) * (1.0 - dropout)
    if n < 4 or rho <= 0:
        return n - 1, 0
    q = 1.0 - (1.0 - corrupt) * rho
    secret, correct = sigma * math.log(2), eta * math.log(2) + math.log(n * exchanges)
    k0 = math.ceil((secret + math.log(n * n / 2.0)) / -math.log(q)) if q > 0 else 2
    for k in range(max(2, k0 + k0 % 2), (n - 1) // 2 + 1, 2):
        lo = _secrecy_threshold(k, corrupt, math.log(n) + secret)
        hi = _largest_threshold(k, rho, correct)
        if hi >= max(lo, 2):
            return k, hi
    return n - 1, 0


def secrecy_threshold(k: int, n: int, *, corrupt: float = 0.05, sigma: int = 40) -> int:
    """The smallest neighbourhood threshold that keeps ``n`` clients of degree ``k`` secret
    (:func:`plus_parameters`' second condition): ``n P[Bin(k, gamma) >= t] <= 2^-sigma``."""
    return _secrecy_threshold(int(k), float(corrupt), math.log(n) + sigma * math.log(2))


@lru_cache(maxsize=256)
def _secrecy_threshold(k: int, gamma: float, log_budget: float) -> int:
    """The smallest t with log P[Bin(k, gamma) >= t] <= -log_budget."""
    if gamma <= 0:
        return 1
    upper, _ = binom_log_tails(k, gamma)
    ok = np.flatnonzero(upper[1:] <= -log_budget)  # t = 1..k+1
    return int(ok[0]) + 1 if ok.size else k + 2


@lru_cache(maxsize=256)
def _largest_threshold(k: int, rho: float, log_budget: float) -> int:
    """The largest t with log P[Bin(k, rho) < t] <= -log_budget (0: none)."""
    _, lower = binom_log_tails(k, rho)
    ok = np.flatnonzero(lower[1:k + 1] <= -log_budget)  # t = 1..k
    return int(ok[-1]) + 1 if ok.size else 0


def binom_log_tails(k: int, p: float) -> tuple[np.ndarray, np.ndarray]:
    """``(upper, lower)``, two arrays over t = 0..k+1: ``upper[t] = log P[Bin(k, p) >= t]`` and
    ``lower[t] = log P[Bin(k, p) < t]`` (-inf for an empty event).

    Exact sums of the probability mass in log space, each term from ``math.lgamma`` (what
    ``scipy.stats.binom.logsf(t - 1, k, p)`` and ``logcdf(t - 1, k, p)`` give, tested, and
    exact to about 1e-12 relative where scipy's far tails lose digits or underflow to -inf; no
    scipy import: it cost the set-up 1.8 s in a fresh process).
    """
    k, p = int(k), float(p)
    if not (k >= 0 and 0.0 <= p <= 1.0):
        raise ValueError(f"a binomial needs k >= 0 and 0 <= p <= 1, got k={k}, p={p}")
    j = np.arange(k + 1, dtype=np.float64)
    if p in (0.0, 1.0):  # all the mass on one count
        logpmf = np.full(k + 1, -np.inf)
        logpmf[0 if p == 0.0 else k] = 0.0
    else:
        lg = _log_factorials(1 << k.bit_length())[:k + 1]
        logpmf = lg[k] - lg - lg[::-1] + j * math.log(p) + (k - j) * math.log1p(-p)
    with np.errstate(invalid="ignore"):  # -inf + -inf sums stay -inf
        upper = np.append(np.logaddexp.accumulate(logpmf[::-1])[::-1], -np.inf)
        lower = np.append(-np.inf, np.logaddexp.accumulate(logpmf))
    return np.minimum(upper, 0.0), np.minimum(lower, 0.0)  # a probability's log, rounding aside


@lru_cache(maxsize=32)
def _log_factorials(size: int) -> np.ndarray:
    """``log(i!)`` for i = 0..size-1 (``math.lgamma``), one table per power-of-two size."""
    return np.array([math.lgamma(i + 1.0) for i in range(size)])
