"""The split a client keeps with its leaf (verified rounds, issue 38): which members of its
closed neighbourhood were in an exchange's sum and which were not (their leaves must then be
zero in the exchange's sum tree), made by position at mask time."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("cryptography")

from fedlatent.engine.secagg import FixedPoint, SecAggConfig, setup  # noqa: E402
from fedlatent.engine.secagg.near import Near  # noqa: E402
from fedlatent.engine.secagg.protocol import exchange_label  # noqa: E402

IDS = [f"c{i:02d}" for i in range(24)]


@pytest.fixture(autouse=True)
def small_graphs(monkeypatch):
    """Graphs of degree 6 among 24 clients (as test_secagg_plus.py: the library's bounds
    would give the complete graph here)."""
    import fedlatent.engine.secagg.graph as graph

    monkeypatch.setattr(graph, "plus_parameters", lambda n, p, **kw: (6, 4))


def test_near_absent_is_the_sorted_complement_of_the_positions():
    ids = ["a", "b", "c", "d", "e"]
    near = Near(ids, "c")
    assert near.absent(np.arange(5)) == ()
    assert near.absent(np.array([0, 2, 3])) == ("b", "e")
    assert near.absent(np.array([2])) == ("a", "b", "d", "e")


@pytest.mark.parametrize("drop", [0, 1, 2])
def test_the_kept_split_is_the_participants_and_the_rest_of_the_neighbourhood(drop):
    """After masking with ``keep_leaf``, leaf_split gives the participants of its
    neighbourhood and, sorted, the members that were not (none at full participation)."""
    cfg = SecAggConfig(13, FixedPoint(scale=2.0**20, bound=100.0), slots=4, degree=6,
                       local_threshold=4)
    server, clients = setup(IDS, cfg)
    graph = server.roster.graph
    u = IDS[5]
    closed = list(graph.closed(u))
    gone = [v for v in closed if v != u][:drop]
    part = [v for v in closed if v not in gone]
    c = clients[u]
    c.keep_leaf = True
    c.mask({"s": np.ones(3)}, 1, "estep", part, slot=0)
    S, absent = c.leaf_split(exchange_label(1, "estep"))
    assert list(S) == part and list(absent) == sorted(set(closed) - set(part)) == sorted(gone)
    assert c.leaf_split(exchange_label(2, "estep")) is None
