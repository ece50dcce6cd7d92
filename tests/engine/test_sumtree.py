"""The projected sum tree (issue 38's transcript): every site checks, from its own leaf and a
path of ceil(log2 n) nodes, that the aggregate it is shown is the committed sum of the
survivors' leaves; a server that changes the aggregate, drops or alters a site's leaf, or lies
about a node of the path is refused by the sites whose paths it touches."""

from __future__ import annotations

import numpy as np
import pytest

from fedlatent.engine.secagg.protocol import SecureAggregationError
from fedlatent.engine.secagg.sumtree import (
    PROJECTIONS,
    P,
    SumTree,
    challenge,
    project,
    ring_sum,
    verify_leaf,
)

LABEL = b"run/round 3/estep"


def _leaves(n, m=7, seed=0):
    return np.random.default_rng(seed).integers(0, 2**64, size=(n, m), dtype=np.uint64)


def _ids(n):
    return [f"s{i:04d}" for i in range(n)]


def _verify_all(tree, leaves, A=None, c=None, root=None):
    n = len(tree.ids)
    return [verify_leaf(LABEL, i, n, tree.ids[i], leaves[i], tree.A if A is None else A,
                        tree.c if c is None else c, tree.root if root is None else root,
                        tree.path(i)) for i in range(n)]


@pytest.mark.parametrize("n", [1, 2, 3, 8, 13, 100])
def test_every_site_accepts_the_honest_tree_and_gets_one_digest(n):
    leaves = _leaves(n)
    tree = SumTree(LABEL, _ids(n), leaves)
    assert np.array_equal(tree.A, leaves.sum(axis=0, dtype=np.uint64))  # the ring sum
    digests = set(_verify_all(tree, leaves))
    assert digests == {tree.digest()}
    depth = int(np.ceil(np.log2(n))) if n > 1 else 0
    assert all(len(tree.path(i)[0]) <= 32 * depth for i in range(n))


def test_the_carries_make_the_integer_sum():
    leaves = _leaves(50, m=4, seed=1)
    A, c = ring_sum(leaves)
    exact = [sum(int(v) for v in leaves[:, j]) for j in range(4)]
    assert [int(a) + (int(k) << 64) for a, k in zip(A, c)] == exact


def test_projections_are_linear_modulo_p():
    leaves = _leaves(9, m=5, seed=2)
    A, c = ring_sum(leaves)
    r = challenge(LABEL, A, c)
    assert r.shape == (PROJECTIONS, 5) and int(r.max()) < P
    total = project(r, leaves).sum(axis=0) % P
    want = [sum(int(r[j, k]) * ((int(A[k]) + (int(c[k]) << 64)) % P) for k in range(5)) % P
            for j in range(PROJECTIONS)]
    assert [int(t) for t in total] == want


class _Lying(SumTree):
    """A server claiming the aggregate ``A`` (carries ``c``) for the true leaves: the tree
    built honestly around the false claim (its challenge is the false claim's)."""

    def __init__(self, label, ids, leaves, A, c):
        self.label, self.ids = bytes(label), list(ids)
        self.A, self.c = A, c
        self._commit(leaves)


@pytest.mark.parametrize("word, bit", [(0, 40), (3, 0), (6, 63)])
def test_a_changed_aggregate_is_refused_by_every_site(word, bit):
    leaves = _leaves(20)
    honest = SumTree(LABEL, _ids(20), leaves)
    A = honest.A.copy()
    step = np.zeros_like(A)
    step[word] = np.uint64(1) << np.uint64(bit)  # bit 40 of a word: a relative change ~1e-7
    A = A + step  # (wrapping in the ring)
    tree = _Lying(LABEL, _ids(20), leaves, A, honest.c)
    for i in range(20):
        with pytest.raises(SecureAggregationError, match="is not the sum the tree commits to"):
            verify_leaf(LABEL, i, 20, tree.ids[i], leaves[i], A, tree.c, tree.root,
                        tree.path(i))
        with pytest.raises(SecureAggregationError, match="refusing it"):  # old tree, new claim
            verify_leaf(LABEL, i, 20, tree.ids[i], leaves[i], A, honest.c, honest.root,
                        honest.path(i))


def test_a_tree_without_a_sites_own_vector_is_refused_by_that_site():
    leaves = _leaves(16)
    forged = leaves.copy()
    forged[5] = 0  # the server leaves site 5's contribution out
    tree = SumTree(LABEL, _ids(16), forged)
    for i in range(16):
        if i == 5:
            with pytest.raises(SecureAggregationError,
                               match=r"site 's0005': its own contribution \(leaf 5\) is not in "
                                     "the committed sum"):
                verify_leaf(LABEL, 5, 16, "s0005", leaves[5], tree.A, tree.c, tree.root,
                            tree.path(5))
        else:
            verify_leaf(LABEL, i, 16, tree.ids[i], leaves[i], tree.A, tree.c, tree.root,
                        tree.path(i))


def test_a_lie_in_a_node_of_the_path_is_refused():
    leaves = _leaves(8)
    tree = SumTree(LABEL, _ids(8), leaves)
    raw, sums = tree.path(0)
    bad = sums.copy()
    bad[1, 0] = (bad[1, 0] + np.uint64(1)) % np.uint64(P)
    with pytest.raises(SecureAggregationError, match="not in the committed sum"):
        verify_leaf(LABEL, 0, 8, "s0000", leaves[0], tree.A, tree.c, tree.root, (raw, bad))
    with pytest.raises(SecureAggregationError, match="too short"):
        verify_leaf(LABEL, 0, 8, "s0000", leaves[0], tree.A, tree.c, tree.root,
                    (raw[:32], sums[:1]))


def test_another_label_or_another_position_is_refused():
    leaves = _leaves(6)
    tree = SumTree(LABEL, _ids(6), leaves)
    with pytest.raises(SecureAggregationError,
                       match=r"its own contribution \(leaf 2\) is not in the committed sum"):
        verify_leaf(b"run/round 4/estep", 2, 6, "s0002", leaves[2], tree.A, tree.c, tree.root,
                    tree.path(2))
    with pytest.raises(SecureAggregationError,  # its leaf shown at another site's place
                       match=r"its own contribution \(leaf 3\) is not in the committed sum"):
        verify_leaf(LABEL, 3, 6, "s0002", leaves[2], tree.A, tree.c, tree.root, tree.path(3))
