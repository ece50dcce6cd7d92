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
   challenge ``r`` (``PROJECTIONS x m`` numbers, row ``j`` modulo the prime ``p_j``, the
   four largest primes below ``2^31``: :data:`PRIMES`) drawn from the SHAKE-128 output of
   the tag, the label, ``m`` and the claim ``(A, c)`` in the bytes the sites are sent
   (:func:`challenge`): ``r`` is fixed by the claim, so a claim cannot be chosen to fit ``r``;
2. each leaf's projections ``pi_wj = r_j z_w mod p_j`` (:func:`project`), and a hash tree over
   them whose nodes carry the sums of their leaves' projections (each modulo its prime) and
   bind both children's hashes and both children's sums (SHA-256 of a tag, the hashes and
   the sums, left then right; a node's sums are its children's added);
3. each site gets ``A``, ``c`` and its *path*: the sibling's hash and projections at each
   level (``ceil(log2 n)`` levels, 32 + 4 ``PROJECTIONS`` bytes each), not the root.

A site (:func:`verify_leaf`) refuses carries of ``n`` or more (``n`` words below ``2^64``
carry at most ``n - 1``) and trees of more than :data:`MAX_LEAVES` leaves, recomputes ``r``
from the claim's bytes, its own leaf's projections from its own ``z_w``, climbs its path to a
root (each parent's sums and hash from its children's), and checks that the root's
projections equal ``r_j (A + 2^64 c)`` modulo ``p_j``; it folds :func:`tree_digest` of that
root and the claim into its consistency tokens of the exchange, so neighbours that reached
different roots refuse to reveal (a root sent beside the path would add nothing: the server
could send each site the root its path reaches).

Why this suffices when every site reaches the same root: the hashes bind one tree, each node's
sums with its parent's hash, so the sibling sums each site adds are the ones the sites below
that sibling computed (were a node to bind only its own sums, the server could send each half of
the tree the sibling sums that complete the claim: every site would reach one root and pass any
``A'``); each honest site checks its own leaf, so the root's projections are ``r`` times the
true integer sum ``S`` plus whatever colluding sites' leaves add (a colluding site can add any
vector to the sum anyway, as its own reply). A false claim ``S' = A' + 2^64 c' != S`` passes
only if ``r_j (S' - S) = 0 mod p_j`` for every ``j``. Both lie in ``[0, n 2^64)``, so each word
of ``d = S' - S`` is below ``n 2^64 <= 2^92`` in magnitude, while any three of the primes
multiply to more than ``2^92.99``: a nonzero word of ``d`` is divisible by at most two of them,
so ``d`` is nonzero modulo at least two primes ``p, q``. Place ``k`` of ``r`` is one 64-bit word
``w_k`` of the SHAKE output, ``r_jk = w_k mod p_j``; by the Chinese remainder theorem the two
projections pass together iff ``sum_k (w_k mod pq) d_k = 0 mod pq``, and for ``w_k mod pq``
uniform on ``Z_pq`` that has probability ``1 / pq`` (``d`` is nonzero modulo ``p`` at some place
and modulo ``q`` at some place: fixing every other place, the one or two left map onto
``Z_pq``); ``w_k mod pq`` gives no value more than 5 of the ``2^64`` words, within ``5/4`` of
uniform (``2^64 > 4 pq``), so the probability is at most ``(5/4)^2 / pq ~ 2^-61.4`` for the
``r`` that ``A'`` itself fixes (grinding claims costs a hash each). One prime would not do:
``A' = A + p`` in one word (or any ``A'`` with ``c'`` chosen to make ``S' = S`` modulo ``p``) would
pass every site.

Cost at a site: one SHAKE-128 call (the claim's key and the words ``w``: ``32 + 8 m`` bytes),
one integer product of ``w``'s halves and the limbs of ``z``, ``A`` and ``c`` (``24 m``
multiplications: :func:`_projections` needs no word reduced, since ``r_j x = sum_k w_k x_k mod
p_j``) and ``ceil(log2 n) + 2`` SHA-256 calls, the levels' schedule (which have a sibling, on
which side) made once per place; the numbers (the claim read, the projections, the sums up the
path and the bytes each level hashes) come from two compiled calls
(:mod:`._sumtree_kernel`), the hashes from :mod:`hashlib`; bytes down ``8 + ceil(log2
n) (32 + 4 PROJECTIONS)`` plus ``A`` and ``c`` in their fewest bytes (:func:`shared_fields`),
not ``n m`` words (shipping every survivor's masked vector).
``benchmarks/bench_verified_round.py`` measures it at 1,000 sites.
"""

from __future__ import annotations

import functools
import hashlib
import operator
import struct
from typing import Any

import numpy as np

import fedlatent.engine.secagg._crypto as _crypto
from fedlatent.engine.protocol.compiled import kernels, worth
from fedlatent.engine.secagg.protocol import SecureAggregationError
from fedlatent.engine.secagg.ring_bytes import _ring, pack_ring, unpack_ring

__all__ = ["MAX_LEAVES", "PRIMES", "PROJECTIONS", "SumTree", "challenge", "claim_bytes",
           "pack_ring", "project", "read_paths", "read_transcript", "ring_sum", "shared_fields",
           "transcript_fields", "unpack_ring", "verify_leaf", "verify_zero", "zero_fields"]

_V = "verify/"  # the message fields of a transcript

#: the moduli of the projections, one each: the four largest primes below 2^31 (products of two
#: residues fit in 62 bits; any three multiply to more than 2^92.99, see the module docstring)
PRIMES = (2147483647, 2147483629, 2147483587, 2147483579)
#: independent projections (one modulo each of :data:`PRIMES`)
PROJECTIONS = len(PRIMES)
#: the largest number of leaves a tree may have (the soundness bound needs n 2^64 < 2^92.99)
MAX_LEAVES = 1 << 28
LEAF_TAG = b"fedlatent/sumtree/leaf\x00"
NODE_TAG = b"fedlatent/sumtree/node\x00"
CHALLENGE_TAG = b"fedlatent/sumtree/challenge\x00"
DIGEST_TAG = b"fedlatent/sumtree/digest\x00"
_PR = np.array(PRIMES, dtype=np.uint64)  # (PROJECTIONS,): a row of sums, modulo each prime
_PC = _PR.reshape(-1, 1)  # (PROJECTIONS, 1): a row of r per prime


def ring_sum(leaves: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(A, c)``: the ring sum of ``leaves`` (n, m) uint64 and its carries, ``sum = A + 2^64 c``
    over the integers (32-bit halves summed apart: exact for fewer than 2^32 leaves)."""
    x = np.asarray(leaves, dtype=np.uint64)
    lo = (x & np.uint64(0xFFFFFFFF)).sum(axis=0, dtype=np.uint64)
    hi = (x >> np.uint64(32)).sum(axis=0, dtype=np.uint64)
    return x.sum(axis=0, dtype=np.uint64), (hi + (lo >> np.uint64(32))) >> np.uint64(32)


def challenge(label: bytes, A: np.ndarray, c: np.ndarray) -> np.ndarray:
    """``r`` (PROJECTIONS, m): row ``j`` residues modulo ``PRIMES[j]`` of words of the
    SHAKE-128 output of ``(tag, label, m, claim)``, the claim ``(A, c)`` in the bytes a site
    is sent (:func:`_claim`): a function of the claim only (:func:`_claim_hash`)."""
    return _reduced(_claim_hash(label, _claim(A, c), np.size(A))[1])


def _claim_hash(label: bytes, claim: bytes, m: int) -> tuple[bytes, bytes]:
    """``(key, words)`` of the claim's bytes ``claim`` (:func:`_claim`, bytes or a uint8
    array) of ``m`` words, from one SHAKE-128 (FIPS 202's extendable-output function) of the
    tag, the label, ``m`` and the claim's bytes as sent (they give one ``(A, c)`` for ``m``
    words, so ``r`` is fixed with the claim; another encoding of one claim is another ``r``,
    a hash more to grind, and another digest, which neighbours shown the first refuse):
    its first 32 bytes are the claim's key, which the digest binds (:func:`tree_digest`),
    the next ``8 m`` (``words``) one word ``w_k`` (``<u8``) a place: ``r_jk = w_k mod
    PRIMES[j]`` (:func:`_reduced`; a site never reduces them: :func:`_projections`).
    The claim is hashed once, by one call, for both."""
    out = hashlib.shake_128(b"".join((CHALLENGE_TAG, _Q.pack(len(label)), label, _Q.pack(m),
                                      claim))).digest(32 + 8 * m)
    return out[:32], out[32:]


def _reduced(words: bytes) -> np.ndarray:
    """``r`` (PROJECTIONS, m) uint64 of the challenge's ``words``: ``r_jk = w_k mod p_j``."""
    return np.remainder(np.frombuffer(words, "<u8"), _PC, dtype=np.uint64)


_Q = struct.Struct("<Q")


def project(r: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """``r_j z mod PRIMES[j]`` of each row ``z`` of ``vectors`` (n, m) uint64: (n,
    PROJECTIONS) uint64."""
    z = np.atleast_2d(np.asarray(vectors, dtype=np.uint64))
    out = np.empty((z.shape[0], r.shape[0]), dtype=np.uint64)
    for j, p in enumerate(_PR):  # (PROJECTIONS passes; each product < 2^62)
        out[:, j] = (((z % p) * r[j]) % p).sum(axis=1, dtype=np.uint64) % p
    return out


def _leaf_bytes(label: bytes, i: int, u: str, sums: bytes) -> bytes:
    """What leaf ``i`` (site ``u``, its projections' bytes ``sums``: PROJECTIONS ``<u4``)
    hashes."""
    return b"".join((LEAF_TAG, _Q.pack(len(label)), label, _leaf_place(i, u), sums))


@functools.lru_cache(maxsize=1 << 16)
def _leaf_place(i: int, u: str) -> bytes:
    """Leaf ``i``'s index and site name as its hash takes them (each site's, made once)."""
    b = str(u).encode()
    return struct.pack("<QI", i, len(b)) + b


def _leaf_hashes(label: bytes, ids, projs: np.ndarray) -> list[bytes]:
    rows = projs.astype("<u4")
    return _crypto.commit_many([_leaf_bytes(label, i, u, rows[i].tobytes())
                                for i, u in enumerate(ids)])


#: what a node hashes: the tag, its children's hashes and their sums (left, then right)
_NODE_BYTES = struct.Struct(f"<{len(NODE_TAG)}s32s32s{2 * PROJECTIONS}I")


def _parents(hashes: list[bytes], sums: np.ndarray) -> tuple[list[bytes], np.ndarray]:
    """The next level up: pairs combined, a lone last node carried up unchanged."""
    n = len(hashes)
    even = n - n % 2
    up = (sums[0:even:2] + sums[1:even:2]) % _PR
    rows, pack = sums.tolist(), _NODE_BYTES.pack  # (a node binds its children's sums)
    out = _crypto.commit_many([pack(NODE_TAG, hashes[2 * i], hashes[2 * i + 1], *rows[2 * i],
                                    *rows[2 * i + 1]) for i in range(even // 2)])
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
        self.claim = _claim(self.A, self.c)
        self.r = _reduced(_claim_hash(self.label, self.claim, np.size(self.A))[1])
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
        """What each site's consistency statement carries (:func:`tree_digest`)."""
        return tree_digest(self.label, self.root, self.A, self.c)

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


def tree_digest(label: bytes, root: bytes, A: np.ndarray, c: np.ndarray) -> bytes:
    """SHA-256 of the root and the claim ``(A, c)``'s key (:func:`_claim_hash`: the label and
    the claim hashed)."""
    return _digest(root, _claim_hash(label, _claim(A, c), np.size(A))[0])


def _digest(root: bytes, key: bytes) -> bytes:
    return hashlib.sha256(DIGEST_TAG + bytes(root) + key).digest()


def _joined_words(leaf, A, c) -> np.ndarray:
    """``leaf``, ``A`` and ``c`` as one new C-contiguous uint64 vector (what the kernels take:
    one type whatever the caller passed); ValueError when they are not of one length."""
    leaf, A, c = _words(leaf), _words(A), _words(c)
    if not leaf.size == A.size == c.size:
        raise ValueError(f"a leaf of {leaf.size} words against a sum of {A.size} and "
                         f"{c.size} carries")
    return np.concatenate((leaf, A, c), axis=None)


def _compiled(m: int) -> bool:
    """Whether a site's check of ``m`` words runs compiled (:func:`~fedlatent.engine.protocol.
    compiled.worth`: not one deployed site's, a leaf a process, but a simulation's)."""
    return worth(int(m))


@functools.cache
def _kernels():
    """The compiled kernels (:mod:`._sumtree_kernel`), imported at the first check (a
    process that never checks a tree does not import numba for it); ImportError if they
    restate the primes or the node tag otherwise than this module."""
    mod = kernels("fedlatent.engine.secagg._sumtree_kernel")  # (saying when numba compiles)
    if (mod.PRIMES, mod.NODE_TAG) != (PRIMES, NODE_TAG):
        raise ImportError("the sum tree's kernels restate its primes or node tag otherwise "
                          "than fedlatent.engine.secagg.sumtree: a site cannot check a tree")
    return mod


def verify_leaf(label: bytes, index: int, n: int, site: str, leaf: np.ndarray, A: np.ndarray,
                c: np.ndarray, root: bytes | None, path, claim=None,
                compiled: bool | None = None) -> bytes:
    """Check, as site ``site`` (leaf ``index`` of ``n``, its own ``leaf`` z_w), that ``A`` is
    the sum the tree of root ``root`` commits to; return :func:`tree_digest` (for its
    consistency statement). ``root`` None: the root its path reaches (a transcript sends
    none: the digest the site folds into its tokens carries it, and a neighbour shown
    another tree refuses to reveal). ``path``: :meth:`SumTree.path`'s ``(hashes, sums)``,
    or the levels as a transcript encodes them (bytes: :func:`read_transcript`); levels
    beyond those the leaf's place has are not read. ``claim``: ``(A, c)`` as the site was
    sent them (:func:`claim_bytes`; made from ``A`` and ``c`` when None). The numbers (the
    projections, the sums up the path, the carries' bound) come from one compiled call
    (:func:`._sumtree_kernel.climb`), the hashes from :mod:`hashlib`, where numba pays
    (``compiled`` None: :func:`_compiled`), else NumPy's and Python's (the same digest or
    refusal). SecureAggregationError naming the site and what failed."""
    if not (_compiled(np.size(A)) if compiled is None else compiled):
        return _verify_leaf_numpy(label, index, n, site, leaf, A, c, root, path, claim)
    if not 0 <= index < n <= MAX_LEAVES:
        raise SecureAggregationError(f"site {site!r}: leaf {index} of a tree of {n} leaves "
                                     f"(at most {MAX_LEAVES})")
    x = _joined_words(leaf, A, c)  # (leaf, A and c: one new uint64 vector, one kernel type)
    m = x.size // 3
    if claim is None:  # (the carries checked before a claim is made of them)
        if m and int(x[2 * m:].max()) >= n:
            raise _carries_refused(site, x[2 * m:], n)
        claim = _claim(x[m:2 * m], x[2 * m:]).tobytes()
    key, words = _claim_hash(label, _as_bytes(claim), m)
    if type(path) is not bytes:
        path = _path_bytes(path, len(_sides(index, n)))
    out = _kernels().climb(words, x, path, int(index), int(n)).tobytes()
    if out[-1] & 1:
        raise _carries_refused(site, x[2 * m:], n)
    if out[-1] & 2:
        raise SecureAggregationError(f"site {site!r}: the path of leaf {index} is too short")
    sha = hashlib.sha256
    h = sha(_leaf_bytes(label, index, site, out[:16])).digest()
    for start, cut, end in _cuts(index, n):  # (each level: the kernel's record, this node's
        h = sha(out[start:cut] + h + out[cut:end]).digest()  # hash where it goes)
    if root is None and not out[-1] & 4:  # (the common case)
        return _digest(h, key)
    _refuse_root(site, index, root, h, bool(out[-1] & 4))
    return _digest(h, key)


def _carries_refused(site: str, c: np.ndarray, n: int) -> SecureAggregationError:
    """The refusal of carries ``c`` of ``n`` or more (``n`` words below ``2^64`` carry at
    most ``n - 1``)."""
    return SecureAggregationError(
        f"site {site!r}: the carries shown reach {int(c.max())}, more than a sum of {n} "
        "leaves can carry: the claimed sum is not a sum of the leaves; refusing it")


_U64, _U8 = np.dtype(np.uint64), np.dtype(np.uint8)


def _words(x) -> np.ndarray:
    """``x`` as a uint64 array (itself when it is one: what a site passes)."""
    return x if type(x) is np.ndarray and x.dtype == _U64 else np.asarray(x, dtype=_U64)


def _as_bytes(claim) -> bytes:
    """The claim's bytes (:func:`claim_bytes`' bytes as they are, an array's as bytes)."""
    return claim if type(claim) is bytes else np.asarray(claim, dtype=np.uint8).tobytes()


def _refuse_root(site: str, index: int, root: bytes | None, h: bytes, differ: bool) -> None:
    """:func:`verify_leaf`'s refusals once its path reached the root ``h`` (``differ``: the
    projections it reached are not the claim's)."""
    who = f"site {site!r}"
    if root is not None and h != bytes(root):
        raise SecureAggregationError(
            f"{who}: its own contribution (leaf {index}) is not in the committed sum (the "
            "path does not reach the root): the aggregate shown is not the sum of the "
            "survivors' replies; refusing it")
    if differ and root is None:  # (no root: either its leaf is missing or A is false)
        raise SecureAggregationError(
            f"{who}: its own contribution (leaf {index}) is not in the committed sum, or the "
            "aggregate shown is not the sum the tree commits to (the projections its path "
            "reaches are not the claim's); refusing it")
    if differ:
        raise SecureAggregationError(
            f"{who}: the aggregate shown is not the sum the tree commits to (its projections "
            "differ); refusing it")


@functools.lru_cache(maxsize=1 << 16)
def _sides(index: int, n: int) -> tuple[bool, ...]:
    """Leaf ``index``'s schedule in a tree of ``n`` leaves: at each level of its path that
    has a sibling, whether the sibling is the left child (a lone last node is carried up
    unchanged: no level). It depends only on the place, so each site computes it once."""
    out, i, width = [], index, n
    while width > 1:
        if (i ^ 1) < width:
            out.append(i % 2 == 1)
        i, width = i // 2, (width + 1) // 2
    return tuple(out)


def _path_bytes(path, need: int) -> bytes:
    """``path`` (:func:`verify_leaf`'s two forms) as a transcript's bytes (each level the
    sibling's hash and its sums as ``<u4``); its first ``need`` levels, or none when it has
    fewer (the kernel then finds it too short)."""
    if isinstance(path, bytes | bytearray | memoryview):
        return bytes(path)
    raw, sums = path
    raw = bytes(raw)
    if isinstance(sums, np.ndarray):
        sums = sums.astype(np.uint64).reshape(-1, PROJECTIONS).tolist()
    if 32 * need > len(raw) or need > len(sums):
        return b""
    return b"".join([_LEVEL.pack(raw[32 * k: 32 * (k + 1)], *sums[k]) for k in range(need)])


@functools.lru_cache(maxsize=1 << 16)
def _cuts(index: int, n: int) -> tuple[tuple[int, int, int], ...]:
    """Where :func:`verify_leaf` reads each level's record in the kernel's bytes (after the
    leaf's 16): ``(start, cut, end)``, the climbing node's hash going at ``cut`` (after the
    tag and the sibling's hash when the sibling is the left child, after the tag else)."""
    record, tag = len(NODE_TAG) + 32 + 8 * PROJECTIONS, len(NODE_TAG)
    return tuple((16 + k * record, 16 + k * record + tag + 32 * left, 16 + (k + 1) * record)
                 for k, left in enumerate(_sides(index, n)))


def verify_zero(label: bytes, index: int, n: int, site: str, A: np.ndarray, c: np.ndarray,
                path: tuple[bytes, np.ndarray], digest: bytes, claim=None) -> bool:
    """Whether leaf ``index`` of ``n`` (site ``site``, not in the exchange's sum) holds zero
    in the tree whose :func:`tree_digest` is ``digest`` (the one the checking site reached
    from its own leaf): its path from a zero leaf must climb to that root."""
    try:
        got = verify_leaf(label, index, n, site, np.zeros(np.size(A), np.uint64), A, c, None,
                          path, claim)
    except SecureAggregationError:
        return False
    return got == digest


#: bytes a level of a path takes: the sibling's hash and its projections
_NODE = 32 + 4 * PROJECTIONS
_LEVEL = struct.Struct(f"<32s{PROJECTIONS}I")


def transcript_fields(tree, i: int) -> dict[str, Any]:
    """What leaf ``i``'s site is sent of the server's ``tree`` besides :func:`shared_fields`:
    ``verify/path``, bytes: its index and the number of leaves (two ``<u4``), then per level
    of its path (:meth:`SumTree.path`) the sibling's hash (32 bytes) and projections
    (PROJECTIONS ``<u4``: each below 2^31). Neither the root (the site's path reaches it,
    and the digest its tokens carry binds it) nor which exchange the tree is of (the site
    checks its own leaf of its last exchange, whose label every leaf hash binds) is sent."""
    raw, sums = tree.path(i)
    levels = sums.shape[0]
    body = np.empty((levels, _NODE), dtype=np.uint8)
    body[:, :32] = np.frombuffer(raw, np.uint8).reshape(levels, 32)
    body[:, 32:] = sums.astype("<u4").view(np.uint8).reshape(levels, _NODE - 32)
    head = np.array([i, len(tree.ids)], dtype="<u4").view(np.uint8)
    return {_V + "path": np.concatenate([head, body.ravel()])}


def zero_fields(tree, indices) -> dict[str, Any]:
    """``verify/zero``, bytes: the paths (:func:`transcript_fields`' encoding, one after the
    other) of the leaves ``indices``, those of sites not in the exchange's sum that the site
    sent them checks hold zero; none when ``indices`` is empty."""
    if not len(indices):
        return {}
    return {_V + "zero": np.concatenate([transcript_fields(tree, int(i))[_V + "path"]
                                         for i in indices])}


def read_paths(msg: dict[str, Any]) -> dict[int, tuple[int, tuple[bytes, list]]]:
    """``{index: (n, path)}`` of :func:`zero_fields`' bytes in ``msg`` (empty without them);
    SecureAggregationError when they do not parse."""
    raw = np.asarray(msg.get(_V + "zero", ()), dtype=np.uint8).reshape(-1).tobytes()
    out, k = {}, 0
    while k < len(raw):
        if k + 8 > len(raw):
            raise SecureAggregationError(f"its transcript's zero paths ({len(raw)} bytes) do "
                                         "not parse")
        index, n = struct.unpack_from("<II", raw, k)
        levels = range(k + 8, k + 8 + _NODE * len(_sides(index, n)), _NODE)
        end = k + 8 + _NODE * len(levels)
        if end > len(raw):
            raise SecureAggregationError(f"its transcript's zero paths ({len(raw)} bytes) do "
                                         "not parse")
        out[index] = (n, (b"".join([raw[j:j + 32] for j in levels]),
                          [struct.unpack_from(f"<{PROJECTIONS}I", raw, j + 32) for j in levels]))
        k = end
    return out


def shared_fields(tree) -> dict[str, Any]:
    """The part of a transcript every site is sent alike: ``verify/A``, the claim ``(A, c)``
    (:func:`_claim`; a :class:`SumTree`'s, made once). Exact: :func:`read_transcript` gives
    back ``A`` and ``c``."""
    claim = getattr(tree, "claim", None)
    return {_V + "A": _claim(tree.A, tree.c) if claim is None else claim}


def _claim(A: np.ndarray, c: np.ndarray) -> np.ndarray:
    """The claim as bytes (uint8): the ring sum ``A``, its words as signed integers in a common
    width ``w`` that most of them fit, the others whole (:func:`pack_ring` less its last
    byte: an aggregate of small values takes about 4 to 5 of 8 bytes a word), then each carry
    less the carries' smallest value in the fewest bytes of 1, 2 or 4 (the carries of ``n``
    uniform leaves lie within a few ``sqrt(n)`` of ``n / 2``), that smallest value (``<u2``
    below 65,536, else ``<u4``), and one byte: ``w`` (bits 0-3), the carries' width (bits
    4-5: 0, 1, 2 for 1, 2, 4 bytes) and the smallest value's (bit 6: 4 bytes)."""
    c = np.asarray(c, dtype=np.int64)
    base = int(c.min()) if c.size else 0
    span = int(c.max()) - base if c.size else 0
    code = (0 if span < 1 << 8 else 1 if span < 1 << 16 else 2) | (4 if base >> 16 else 0)
    a = pack_ring(A)
    return np.concatenate([a[:-1], (c - base).astype(f"<u{1 << (code & 3)}").view(np.uint8),
                           np.array([base], "<u4" if code & 4 else "<u2").view(np.uint8),
                           np.array([int(a[-1]) | code << 4], np.uint8)])


def _count(m) -> int:
    """A number of words as the kernels take it (an int below 2^40: one type; ValueError
    otherwise)."""
    m = operator.index(m)
    if not 0 <= m < 1 << 40:
        raise ValueError(f"a leaf of {m} words")
    return m


def read_transcript(msg: dict[str, Any], m: int, compiled: bool | None = None
                    ) -> tuple[int, int, np.ndarray, np.ndarray, bytes]:
    """``(index, n, A, c, path)`` of the transcript fields of ``msg``
    (:func:`shared_fields`, :func:`transcript_fields`) for a leaf of ``m`` words: ``A`` and
    ``c`` (m,) uint64, ``path`` the levels' bytes as :func:`verify_leaf` takes them (each
    a sibling's hash and its projections). SecureAggregationError when a field is missing
    or has a length no encoding of ``m`` words gives. The claim is read by one compiled
    call (:func:`._sumtree_kernel.decode_claim`) where numba pays (``compiled`` None:
    :func:`_compiled`), else by NumPy (the same numbers or refusal)."""
    if not (_compiled(m) if compiled is None else compiled):
        return _read_transcript_numpy(msg, m)
    raw, path = _field(msg, "A"), _field(msg, "path")
    Ac = None
    if len(path) >= 8 and not (len(path) - 8) % _NODE:
        index, n = _HEAD.unpack_from(path)
        Ac = _kernels().decode_claim(raw, _count(m))
    if Ac is None or not len(Ac):
        raise SecureAggregationError(
            f"its transcript's sum and carries ({len(raw)} bytes) or path ({len(path)}) do not "
            f"fit this site's contribution of {m} words")
    return index, n, Ac[0], Ac[1], path[8:]


def claim_bytes(msg: dict[str, Any]) -> bytes:
    """The claim's bytes in ``msg`` as :func:`read_transcript` read them (for
    :func:`verify_leaf`'s ``claim``)."""
    return _field(msg, "A")


def _field(msg: dict[str, Any], key: str) -> bytes:
    """The transcript field ``key`` of ``msg`` as bytes, its entries in order (empty when
    missing)."""
    v = msg.get(_V + key, ())
    if type(v) is np.ndarray and v.dtype == _U8:
        return v.tobytes()  # (any shape or strides: the entries in C order, as reshape(-1))
    return np.asarray(v, dtype=np.uint8).tobytes()


_HEAD = struct.Struct("<II")


# ---- the NumPy site path (one site in its process: numba's set-up would not pay) ----
def _projections(words: bytes, leaf: np.ndarray, A: np.ndarray, c: np.ndarray) -> tuple:
    """``[r z, r (A + 2^64 c)]``, projection ``j`` modulo ``PRIMES[j]``, of the leaf ``z``
    for the challenge's ``words`` (:func:`_claim_hash`), as lists of Python ints. Since
    ``r_jk = w_k mod p_j``, ``r_j x = (sum_k w_k x_k) mod p_j``: one exact integer sum a
    vector, reduced by each prime at its end, and no word reduced (the same numbers as
    :func:`project` of :func:`challenge`'s ``r``). The sums are exact in uint64 pieces: each
    ``w_k`` in two 32-bit halves (16-bit quarters from :data:`_WIDE` words on) times each of
    ``z``, ``A`` and ``c``'s words in four 16-bit limbs, one integer product of the two
    arrays (each product below ``2^48``, each of its sums below ``2^64``), joined by their
    offsets on Python ints (:func:`_joined`); ``r (A + 2^64 c)`` is ``r A + 2^64 r c``.
    (Inside a round of 1,000 sites this takes 22 us where a product with the reduced ``r``
    took 28 us and reducing ``r`` 6 more; a float64 product of 16-bit limbs, a broadcast
    product summed, ``w`` in quarters times ``x`` in halves, and the product cast by
    ``matmul(..., dtype=uint64)`` instead of two ``astype`` each took more there.)"""
    m = leaf.size
    half = "<u4" if m < _WIDE else "<u2"
    w = np.frombuffer(words, half, -1).reshape(m, -1).T.astype(np.uint64)
    x = np.concatenate((leaf, A, c)).view("<u2").reshape(3, m, 4).astype(np.uint64)
    sz, sa, sc = np.matmul(w, x).tolist()  # ((3, halves, 4) sums)
    tz, t = _joined(sz), _joined(sa) + (_joined(sc) << 64)
    p0, p1, p2, p3 = PRIMES  # (no comprehension: a frame each on Python 3.11, 1.5 us a site)
    return [tz % p0, tz % p1, tz % p2, tz % p3], [t % p0, t % p1, t % p2, t % p3]


#: from this many words on, a challenge's words are split in 16-bit quarters, not 32-bit
#: halves (a sum of ``m`` products below ``2^48`` stays below ``2^64`` for ``m < 2^16``)
_WIDE = 1 << 16


def _joined(sums: list) -> int:
    """``sum_ab sums[a][b] 2^(h a + 16 b)`` on Python ints (``h`` 32 for two rows, 16 for
    four): the integer the limb products' sums stand for."""
    if len(sums) == 2:
        (s00, s01, s02, s03), (s10, s11, s12, s13) = sums
        return (s00 + (s01 << 16) + ((s02 + s10) << 32) + ((s03 + s11) << 48) + (s12 << 64)
                + (s13 << 80))
    return sum(v << (16 * (a + b)) for a, row in enumerate(sums) for b, v in enumerate(row))


_SUMS = struct.Struct(f"<{PROJECTIONS}I")


def _verify_leaf_numpy(label: bytes, index: int, n: int, site: str, leaf: np.ndarray,
                       A: np.ndarray, c: np.ndarray, root: bytes | None, path,
                       claim=None) -> bytes:
    """:func:`verify_leaf` in NumPy and Python ints (where numba does not pay): the same
    digest, or the same refusal."""
    if not 0 <= index < n <= MAX_LEAVES:
        raise SecureAggregationError(f"site {site!r}: leaf {index} of a tree of {n} leaves "
                                     f"(at most {MAX_LEAVES})")
    A, c, leaf = _words(A), _words(c), _words(leaf)  # (as they come: no conversion)
    claim = None if claim is None else _as_bytes(claim)
    if c.size and _carries_reach(claim) >= n and int(c.max()) >= n:  # (n words below 2^64
        # carry at most n - 1; the claim's encoding mostly bounds them below n already)
        raise SecureAggregationError(
            f"site {site!r}: the carries shown reach {int(c.max())}, more than a sum of {n} "
            "leaves can carry: the claimed sum is not a sum of the leaves; refusing it")
    key, words = _claim_hash(label, _claim(A, c) if claim is None else claim, A.size)
    (s0, s1, s2, s3), claimed = _projections(words, leaf, A, c)
    sha = hashlib.sha256
    h = sha(_leaf_bytes(label, index, site, _SUMS.pack(s0, s1, s2, s3))).digest()
    sides = _sides(index, n)  # (its place's schedule: which levels have a sibling, where)
    if type(path) is bytes and len(path) == len(sides) * _NODE:  # (a transcript's: as sent)
        levels = _LEVEL.iter_unpack(path)
    elif (levels := _path_levels(path, len(sides))) is None:
        raise SecureAggregationError(f"site {site!r}: the path of leaf {index} is too short")
    pack, tag = _NODE_BYTES.pack, NODE_TAG
    p0, p1, p2, p3 = PRIMES  # (PROJECTIONS = 4: the sums as four ints)
    for (sib, a0, a1, a2, a3), left in zip(levels, sides):
        h = sha(pack(tag, sib, h, a0, a1, a2, a3, s0, s1, s2, s3) if left
                else pack(tag, h, sib, s0, s1, s2, s3, a0, a1, a2, a3)).digest()
        s0, s1, s2, s3 = (s0 + a0) % p0, (s1 + a1) % p1, (s2 + a2) % p2, (s3 + a3) % p3
    differ = [s0, s1, s2, s3] != claimed
    if root is None and not differ:  # (the common case)
        return _digest(h, key)
    _refuse_root(site, index, root, h, differ)
    return _digest(h, key)


def _carries_reach(claim: bytes | None) -> float:
    """An upper bound of the carries the claim's bytes ``claim`` (:func:`_claim`) can hold:
    their least value plus the largest offset their width holds (inf without the bytes)."""
    if claim is None or not len(claim):
        return float("inf")
    t = claim[-1]
    bw = 4 if t & 64 else 2
    return int.from_bytes(claim[-1 - bw:-1], "little") + (1 << (8 << (t >> 4 & 3))) - 1


def _path_levels(path, need: int):
    """The first ``need`` levels of ``path`` (:func:`verify_leaf`'s two forms) as
    ``(sibling hash, sum, sum)`` tuples; None when it has fewer."""
    if isinstance(path, bytes | bytearray | memoryview):
        size = need * _NODE
        if len(path) < size:
            return None
        return _LEVEL.iter_unpack(path if len(path) == size else memoryview(path)[:size])
    raw, sums = path
    raw = bytes(raw)
    if isinstance(sums, np.ndarray):
        sums = sums.astype(np.uint64).reshape(-1, PROJECTIONS).tolist()
    if 32 * need > len(raw) or need > len(sums):
        return None
    return [(raw[32 * k: 32 * (k + 1)], *sums[k]) for k in range(need)]


def _read_transcript_numpy(msg: dict[str, Any], m: int) -> tuple[int, int, np.ndarray, np.ndarray,
                                                          bytes]:
    """``(index, n, A, c, path)`` of the transcript fields of ``msg``
    (:func:`shared_fields`, :func:`transcript_fields`) for a leaf of ``m`` words: ``A`` and
    ``c`` (m,) uint64, ``path`` the levels' bytes as :func:`verify_leaf` takes them (each
    a sibling's hash and its projections). SecureAggregationError when a field is missing
    or has a length no encoding of ``m`` words gives."""
    raw, path = _field(msg, "A"), _field(msg, "path")  # (read from bytes: few NumPy calls)
    A = None
    t = raw[-1] if raw else 0xFF
    if t >> 4 & 3 < 3 and t < 128 and len(path) >= 8 and not (len(path) - 8) % _NODE:
        index, n = _HEAD.unpack_from(path)
        cw, bw = 1 << (t >> 4 & 3), 4 if t & 64 else 2
        k = len(raw) - 1 - bw - m * cw  # (where the carries start)
        A = _ring(raw, k, m, t & 15) if k >= 0 else None
    if A is None:
        raise SecureAggregationError(
            f"its transcript's sum and carries ({len(raw)} bytes) or path ({len(path)}) do not "
            f"fit this site's contribution of {m} words")
    c = np.add(np.frombuffer(raw, _CARRY[cw], m, k), int.from_bytes(raw[-1 - bw:-1], "little"),
               dtype=np.uint64)
    return index, n, A, c, path[8:]


_CARRY = {w: np.dtype(f"<u{w}") for w in (1, 2, 4)}
