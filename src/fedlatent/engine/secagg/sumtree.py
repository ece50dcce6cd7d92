"""A server's commitment to a secure sum that every site checks in ``O(log n)``: the projected
sum tree (issue 38's transcript, carried by each exchange's message: :func:`transcript_fields`).

What a site must know to replay the server (issue 38) is that the aggregate ``A`` it is shown
is the sum of every survivor's contribution, its own unchanged. Under secure aggregation each
survivor ``w`` can compute its own *leaf*

    z_w = y_w - s_w -+ m_wd  (d: the dropped neighbours whose pair mask w revealed)

(its masked vector, less its self mask, less the pair masks it revealed), and the ``z_w`` sum to
the unmasked aggregate exactly in the ring (the survivors' pair masks cancel). ``z_w`` is still
masked by ``w``'s pair masks with its surviving neighbours; it never leaves the server.

The server commits to ``A`` and to the leaves as follows (:class:`SumTree`):

1. the *carries* ``c`` (``sum_w z_w = A + 2^64 c`` over the integers, :func:`ring_sum`) and a
   challenge ``r`` (``PROJECTIONS x m`` numbers modulo the prime ``P = 2^31 - 1``) drawn from
   ``SHA-256(tag, label, A, c)`` (:func:`challenge`): ``r`` is fixed by the claim, so a claim
   cannot be chosen to fit ``r``;
2. each leaf's projections ``pi_w = r z_w mod P`` (:func:`project`), and a hash tree over them
   whose nodes carry the sum of their leaves' projections modulo ``P`` and bind both children
   and that sum (SHA-256 of a tag, the children's hashes and the sum);
3. each site gets ``A``, ``c``, the root and its *path*: the sibling's hash and projections at
   each level (``ceil(log2 n)`` levels, 32 + 8 ``PROJECTIONS`` bytes each).

A site (:func:`verify_leaf`) recomputes ``r`` from ``A`` and ``c``, its own leaf's projections
from its own ``z_w``, climbs its path checking each parent's sum and hash, and checks that the
root it reaches is the one committed and that the root's projections equal ``r (A + 2^64 c)``
modulo ``P``. Why this suffices when every site sees the same root (each site's signed
statement of the consistency round must carry :meth:`SumTree.digest`, so neighbours shown
different roots refuse to reveal): the hashes bind one tree; each honest site checks its own
leaf, so the root's projections are ``r`` times the true sum plus whatever colluding sites'
leaves add (a colluding site can add any vector to the sum anyway, as its own reply); a false
``A' != A`` passes only if ``r (A' - A) = 0`` for every projection, probability ``P^-2 ~
2^-62`` for the ``r`` that ``A'`` itself fixes (grinding claims costs a hash each).

Cost at a site: ``m`` products and ``ceil(log2 n)`` hashes of 48-byte nodes; bytes down
``ceil(log2 n) (32 + 8 PROJECTIONS)`` plus ``A`` and ``c``, not ``n m`` words (shipping every
survivor's masked vector). ``benchmarks/verified_round.py`` measures it at 1,000 sites.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

import fedlatent.engine.secagg._crypto as _crypto
from fedlatent.engine.secagg.protocol import SecureAggregationError

__all__ = ["P", "PROJECTIONS", "SumTree", "challenge", "project", "ring_sum", "shared_fields",
           "transcript_fields", "verify_leaf"]

_V = "verify/"  # the message fields of a transcript

#: the prime modulus of the projections (products of two residues fit in 62 bits)
P = (1 << 31) - 1
#: independent projections: a false aggregate passes with probability P**-PROJECTIONS
PROJECTIONS = 2
LEAF_TAG = b"fedlatent/sumtree/leaf\x00"
NODE_TAG = b"fedlatent/sumtree/node\x00"
CHALLENGE_TAG = b"fedlatent/sumtree/challenge\x00"
DIGEST_TAG = b"fedlatent/sumtree/digest\x00"
_TWO64 = (1 << 64) % P


def ring_sum(leaves: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(A, c)``: the ring sum of ``leaves`` (n, m) uint64 and its carries, ``sum = A + 2^64 c``
    over the integers (32-bit halves summed apart: exact for fewer than 2^32 leaves)."""
    x = np.asarray(leaves, dtype=np.uint64)
    lo = (x & np.uint64(0xFFFFFFFF)).sum(axis=0, dtype=np.uint64)
    hi = (x >> np.uint64(32)).sum(axis=0, dtype=np.uint64)
    return x.sum(axis=0, dtype=np.uint64), (hi + (lo >> np.uint64(32))) >> np.uint64(32)


def challenge(label: bytes, A: np.ndarray, c: np.ndarray) -> np.ndarray:
    """``r`` (PROJECTIONS, m): residues modulo :data:`P` from the ChaCha20 stream keyed by
    ``SHA-256(tag, label, A, c)``: a function of the claim only."""
    A, c = np.asarray(A, dtype="<u8"), np.asarray(c, dtype="<u8")
    key = _crypto.commit(CHALLENGE_TAG + struct.pack("<Q", len(label)) + bytes(label)
                         + A.tobytes() + c.tobytes())
    words = _crypto.prg_uint64(key, PROJECTIONS * A.size)
    return (words % np.uint64(P)).reshape(PROJECTIONS, A.size)


def project(r: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """``r z mod P`` of each row ``z`` of ``vectors`` (n, m) uint64: (n, PROJECTIONS) uint64."""
    z = np.atleast_2d(np.asarray(vectors, dtype=np.uint64)) % np.uint64(P)
    out = np.empty((z.shape[0], r.shape[0]), dtype=np.uint64)
    for j in range(r.shape[0]):  # (PROJECTIONS passes; each product < 2^62)
        out[:, j] = ((z * r[j]) % np.uint64(P)).sum(axis=1, dtype=np.uint64) % np.uint64(P)
    return out


def _claimed(r: np.ndarray, A: np.ndarray, c: np.ndarray) -> np.ndarray:
    """``r (A + 2^64 c) mod P``, (PROJECTIONS,)."""
    a = (np.asarray(A, dtype=np.uint64) % np.uint64(P)
         + (np.asarray(c, dtype=np.uint64) % np.uint64(P)) * np.uint64(_TWO64)) % np.uint64(P)
    return project(r, a[None, :])[0]


def _leaf_bytes(label: bytes, i: int, u: str, proj: np.ndarray) -> bytes:
    """What leaf ``i`` (site ``u``, projections ``proj``) hashes."""
    b = str(u).encode()
    return (LEAF_TAG + struct.pack("<Q", len(label)) + bytes(label) + struct.pack("<QI", i, len(b))
            + b + np.asarray(proj, dtype="<u8").tobytes())


def _leaf_hashes(label: bytes, ids, projs: np.ndarray) -> list[bytes]:
    return _crypto.commit_many([_leaf_bytes(label, i, u, projs[i]) for i, u in enumerate(ids)])


def _parents(hashes: list[bytes], sums: np.ndarray) -> tuple[list[bytes], np.ndarray]:
    """The next level up: pairs combined, a lone last node carried up unchanged."""
    n = len(hashes)
    even = n - n % 2
    up = (sums[0:even:2] + sums[1:even:2]) % np.uint64(P)
    rows = np.asarray(up, dtype="<u8")
    out = _crypto.commit_many([NODE_TAG + hashes[2 * i] + hashes[2 * i + 1] + rows[i].tobytes()
                               for i in range(even // 2)])
    if n % 2:
        out.append(hashes[-1])
        up = np.concatenate([up, sums[-1:]])
    return out, up


class SumTree:
    """The server's commitment to the sum of ``leaves`` (see the module docstring).

    Parameters
    ----------
    label : bytes
        The exchange's label (run, round, exchange: one tree per exchange).
    ids : sequence of str
        The survivors in leaf order (sorted).
    leaves : ndarray of shape (n, m), uint64
        Each survivor's leaf ``z_w``.
    """

    def __init__(self, label: bytes, ids, leaves: np.ndarray):
        self.label, self.ids = bytes(label), [str(u) for u in ids]
        self.A, self.c = ring_sum(leaves)
        self._commit(leaves)

    def _commit(self, leaves: np.ndarray) -> None:
        """The challenge of the claim ``(A, c)``, the leaves' projections and the levels."""
        self.r = challenge(self.label, self.A, self.c)
        sums = project(self.r, leaves)
        hashes = _leaf_hashes(self.label, self.ids, sums)
        self.levels = [(hashes, sums)]
        while len(hashes) > 1:
            hashes, sums = _parents(hashes, sums)
            self.levels.append((hashes, sums))

    @property
    def root(self) -> bytes:
        """The root's hash (32 bytes)."""
        return self.levels[-1][0][0]

    def digest(self) -> bytes:
        """What each site's consistency statement carries: SHA-256 of the root and the claim."""
        return tree_digest(self.root, self.A, self.c)

    def path(self, i: int) -> tuple[bytes, np.ndarray]:
        """Leaf ``i``'s path: the siblings' hashes concatenated (32 bytes a level that has
        one) and their projections (levels with a sibling, PROJECTIONS) uint64."""
        hashes, sums = [], []
        for h, s in self.levels[:-1]:
            if (i ^ 1) < len(h):
                hashes.append(h[i ^ 1])
                sums.append(s[i ^ 1])
            i //= 2
        return b"".join(hashes), np.asarray(sums, dtype=np.uint64).reshape(-1, PROJECTIONS)


def tree_digest(root: bytes, A: np.ndarray, c: np.ndarray) -> bytes:
    """SHA-256 of the root and the claim ``(A, c)``."""
    return _crypto.commit(DIGEST_TAG + bytes(root) + np.asarray(A, dtype="<u8").tobytes()
                          + np.asarray(c, dtype="<u8").tobytes())


#: the last claims checked in this process: ``(label, A, c) -> (r, r (A + 2^64 c))``, shared
#: by the sites a process holds (in-process fits: a thousand sites check one claim)
_CLAIMS: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}


def _claim(label: bytes, A: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(r, claimed projections)`` of the claim ``(A, c)``: computed once per claim in a
    process (keyed by the SHA-256 of the label and the claim; the values are read-only)."""
    A, c = np.asarray(A, dtype="<u8"), np.asarray(c, dtype="<u8")
    key = _crypto.commit(struct.pack("<Q", len(label)) + bytes(label) + struct.pack(
        "<Q", A.size) + A.tobytes() + c.tobytes())
    got = _CLAIMS.get(key)
    if got is None:
        r = challenge(label, A, c)
        got = (r, _claimed(r, A, c))
        if len(_CLAIMS) >= 8:
            _CLAIMS.pop(next(iter(_CLAIMS)))
        _CLAIMS[key] = got
    return got


def verify_leaf(label: bytes, index: int, n: int, site: str, leaf: np.ndarray, A: np.ndarray,
                c: np.ndarray, root: bytes, path: tuple[bytes, np.ndarray]) -> bytes:
    """Check, as site ``site`` (leaf ``index`` of ``n``, its own ``leaf`` z_w), that ``A`` is
    the sum the tree of root ``root`` commits to; return :func:`tree_digest` (for its
    consistency statement). SecureAggregationError naming the site and what failed."""
    who = f"site {site!r}"
    if not 0 <= index < n:
        raise SecureAggregationError(f"{who}: leaf {index} of a tree of {n} leaves")
    r, claimed = _claim(label, A, c)
    s = project(r, np.asarray(leaf, dtype=np.uint64)[None, :])[0]
    h = _crypto.commit(_leaf_bytes(label, index, site, s))
    raw, sums = path
    k, i, width = 0, index, n
    while width > 1:
        if (i ^ 1) < width:
            if 32 * (k + 1) > len(raw) or k >= len(sums):
                raise SecureAggregationError(f"{who}: the path of leaf {index} is too short")
            sib, ss = raw[32 * k: 32 * (k + 1)], np.asarray(sums[k], dtype=np.uint64)
            left, right = (h, sib) if i % 2 == 0 else (sib, h)
            s = (s + ss) % np.uint64(P)
            h = _crypto.commit(NODE_TAG + left + right + np.asarray(s, dtype="<u8").tobytes())
            k += 1
        i, width = i // 2, (width + 1) // 2
    if h != bytes(root):
        raise SecureAggregationError(
            f"{who}: its own contribution (leaf {index}) is not in the committed sum (the "
            "path does not reach the root): the aggregate shown is not the sum of the "
            "survivors' replies; refusing it")
    if not np.array_equal(s, claimed):
        raise SecureAggregationError(
            f"{who}: the aggregate shown is not the sum the tree commits to (its projections "
            "differ); refusing it")
    return tree_digest(root, A, c)


def transcript_fields(tree, i: int) -> dict[str, Any]:
    """What leaf ``i``'s site is sent of the server's ``tree``: the root, its index and the
    number of leaves (``at``), its path (:meth:`SumTree.path`; projections below 2^31 as
    uint32). Which exchange the tree is of is not sent: the site checks it against its own
    leaf of its last exchange, whose label every leaf hash binds."""
    raw, sums = tree.path(i)
    return {_V + "at": np.array([i, len(tree.ids)], dtype=np.uint32),
            _V + "root": np.frombuffer(tree.root, np.uint8),
            _V + "path": np.frombuffer(raw, np.uint8), _V + "sums": sums.astype(np.uint32)}


def shared_fields(tree) -> dict[str, Any]:
    """The part of a transcript every site is sent alike: ``A`` and its carries (below the
    number of leaves: the smallest unsigned type that holds them)."""
    c = tree.c
    top = int(c.max(initial=0))
    small = np.uint8 if top < 1 << 8 else np.uint16 if top < 1 << 16 else np.uint32
    return {_V + "A": tree.A, _V + "c": c.astype(small)}
