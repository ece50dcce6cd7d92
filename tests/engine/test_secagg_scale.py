"""SecAgg+ at scale (issue 23, item 5): the masking graph's parameters chosen without scipy, and
the round's and set-up's fast paths equal to the slow ones they replace."""

import math
import subprocess
import sys
import warnings
from fractions import Fraction
from unittest import mock

import numpy as np
import pytest

import fedlatent.engine.secagg.graph as graph


def _exact_log_tails(k, p):
    """log P[Bin(k, p) >= t] and log P[Bin(k, p) < t], t = 1..k, from exact rationals."""
    q = Fraction(p)
    pmf = [math.comb(k, j) * q**j * (1 - q) ** (k - j) for j in range(k + 1)]

    def log(x):
        return math.log(x.numerator) - math.log(x.denominator)

    return ([log(sum(pmf[t:])) for t in range(1, k + 1)],
            [log(sum(pmf[:t])) for t in range(1, k + 1)])


@pytest.mark.parametrize("k,p", [(1, 0.3), (12, 0.05), (30, 0.665), (60, 0.25), (86, 0.5)])
def test_binomial_log_tails_equal_the_exact_sums(k, p):
    upper, lower = graph.binom_log_tails(k, p)
    up, lo = _exact_log_tails(k, p)
    np.testing.assert_allclose(upper[1:k + 1], up, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lower[1:k + 1], lo, rtol=1e-12, atol=1e-12)
    assert upper[k + 1] == -np.inf and lower[0] == -np.inf and abs(upper[0]) < 1e-12


def test_binomial_log_tails_refuse_what_is_no_binomial():
    with pytest.raises(ValueError, match=r"a binomial needs k >= 0 and 0 <= p <= 1, got k=3, "
                       r"p=1.5"):
        graph.binom_log_tails(3, 1.5)


def _scipy_secrecy(k, gamma, budget):  # the choice as it was made with scipy.stats
    from scipy.stats import binom

    if gamma <= 0:
        return 1
    t = np.arange(1, k + 2)
    ok = np.flatnonzero(binom.logsf(t - 1, k, gamma) <= -budget)
    return int(t[ok[0]]) if ok.size else k + 2


def _scipy_largest(k, rho, budget):
    from scipy.stats import binom

    t = np.arange(1, k + 1)
    ok = np.flatnonzero(binom.logcdf(t - 1, k, rho) <= -budget)
    return int(t[ok[-1]]) if ok.size else 0


def test_the_graph_parameters_equal_the_scipy_choice_over_a_grid_of_clients():
    grid = [(n, p, e) for n in (4, 10, 30, 50, 100, 300, 1000, 2000, 10_000)
            for p in (0.3, 0.7, 1.0) for e in (21, 128)] + [(100_000, 0.7, 21)]
    mine = [graph.plus_parameters(n, p, exchanges=e) for n, p, e in grid]
    with (mock.patch.object(graph, "_secrecy_threshold", _scipy_secrecy),
          mock.patch.object(graph, "_largest_threshold", _scipy_largest)):
        ref = [graph.plus_parameters(n, p, exchanges=e) for n, p, e in grid]
    assert mine == ref
    assert graph.plus_parameters(1000, 0.7, exchanges=21) == (86, 28)  # the benchmark's graph
    assert graph.plus_parameters(10_000, 0.7, exchanges=21) == (96, 31)


def test_choosing_the_graph_imports_no_scipy():
    code = ("import sys; import fedlatent.engine.secagg.graph as g; "
            "print(g.plus_parameters(1000, 0.7, exchanges=21), 'scipy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["(86,", "28)", "False"]


# ---- the round's fast paths: the same answers, refusals and records as the slow ones ----------
pytest.importorskip("cryptography")

from fedlatent.engine.secagg import (  # noqa: E402
    FixedPoint,
    SecAggClient,
    SecAggConfig,
    SecureAggregationError,
    _crypto,
    run_exchange,
    setup,
)
from fedlatent.engine.secagg.protocol import Roster, exchange_label  # noqa: E402

IDS = [f"c{i:02d}" for i in range(24)]
SCALE = 2.0**20


@pytest.fixture
def small_graphs(monkeypatch):
    """Graphs of degree 6 among 24 clients, which the library's bounds never choose: here the
    bounds say (6, 4), so that the clients, which recompute them, accept the graph."""
    import fedlatent.engine.secagg.graph as graph

    monkeypatch.setattr(graph, "plus_parameters", lambda n, p, **kw: (6, 4))


def _plus(slots=6):
    return SecAggConfig(13, FixedPoint(scale=SCALE, bound=100.0), slots=slots, degree=6,
                        local_threshold=4)


def _inputs(seed):
    rng = np.random.default_rng(seed)
    return {u: {"s": rng.normal(0, 10, size=5)} for u in IDS}


@pytest.mark.usefixtures("small_graphs")
def test_a_client_checks_its_participants_against_its_neighbourhood_with_the_same_refusals():
    server, clients = setup(IDS, _plus())
    graph = server.roster.graph
    u = IDS[0]
    near = list(graph.closed(u))
    assert graph.closed_set(u) == frozenset(near)
    assert [graph.ids[i] for i in graph.closed_index(u)] == near
    c = clients[u]
    with pytest.raises(SecureAggregationError, match=r"round 1, exchange 'e': participants: a "
                       r"client is listed twice"):
        c.mask(_inputs(0)[u], 1, "e", near + near[-1:], slot=0)
    with pytest.raises(SecureAggregationError, match=r"round 1, exchange 'e': participants: "
                       r"\['zz'\] did not take part in the key set-up"):
        c.mask(_inputs(0)[u], 1, "e", near + ["zz"], slot=0)
    other = next(v for v in IDS if v not in near)  # enrolled, not a neighbour: left out
    y = c.mask(_inputs(0)[u], 1, "e", [other] + near[::-1], slot=0)
    assert c._masked[exchange_label(1, "e")] == tuple(near)
    # the masked reply: encode + the self mask (row 0 of one pass) + the signed pair masks
    enc = np.rint(_inputs(0)[u]["s"] * SCALE).astype(np.int64).view(np.uint64)
    from fedlatent.engine.secagg.protocol import self_nonce

    label = exchange_label(1, "e")
    want = enc + _crypto.prg_uint64(c._self_seeds[0], 5, nonce=self_nonce(label))
    # u = near[0]; the pair masks (what they are: test_secagg_pair_masks.py)
    for v, m in zip(near[1:], c._pair_masks(near[1:], label, 5, 0)):
        want = want + m if u < v else want - m
    assert np.array_equal(y["s"], want)


@pytest.mark.usefixtures("small_graphs")
def test_the_reveal_of_an_exchange_everyone_survived_still_refuses_a_wrong_split():
    server, clients = setup(IDS, _plus())
    u = IDS[3]
    near = list(server.roster.graph.closed(u))
    clients[u].mask(_inputs(1)[u], 2, "e", near, slot=0)
    with pytest.raises(SecureAggregationError, match=r"client 'c03': survivors .* and dropped "
                       r"\[\] of round 2, exchange 'e' must split its participants"):
        clients[u].reveal(2, "e", near[:-1], [])
    got = clients[u].reveal(2, "e", near, [])
    assert got["self"].shape == (len(near) - 1, 32)  # never its share of its own seed
    peer = next(v for v in near if v != u)
    assert clients[u]._revealed_self[peer] == {"0": "round 2, exchange 'e'"}
    assert u not in clients[u]._revealed_self
    with pytest.raises(SecureAggregationError, match=r"already revealed shares for round 2"):
        clients[u].reveal(2, "e", near, [])


@pytest.mark.usefixtures("small_graphs")
def test_the_server_rebuilds_each_seed_from_its_first_t_holders_by_x_coordinate():
    """A wrong share from a holder past the first t of a client's neighbourhood is never read;
    one among them is caught by the commitment (what the per-share lookups did)."""
    for row, caught in ((-1, False), (0, True)):
        server, clients = setup(IDS, _plus())
        stats = _inputs(2)
        closed = server.roster.graph.closed  # everyone takes part: each is told its own
        P = server.announce(1, "e", IDS)
        req = server.aggregate({u: clients[u].mask(stats[u], 1, "e", closed(u), slot=0)
                                for u in P})
        revealed = {u: clients[u].reveal(1, "e", closed(u), []) for u in req["survivors"]}
        owner = IDS[5]
        h = [v for v in closed(owner) if v != owner][row]  # sorted: ascending x-coordinates
        at = [v for v in closed(h) if v != h].index(owner)  # (its rows: all but its own)
        revealed[h]["self"] = revealed[h]["self"].copy()
        revealed[h]["self"][at, 0] ^= 1
        if caught:
            with pytest.raises(SecureAggregationError, match=rf"the self-mask seed of '{owner}' "
                               "rebuilt from the revealed shares does not match its commitment"):
                server.unmask(revealed)
        else:
            got = server.unmask(revealed)
            assert np.max(np.abs(got["s"] - sum(stats[u]["s"] for u in IDS))) <= 24 / SCALE


@pytest.mark.usefixtures("small_graphs")
def test_revealed_secrets_are_kept_by_slot_and_dumped_in_one_order():
    server, clients = setup(IDS, _plus())
    stats = _inputs(3)
    run_exchange(server, clients, stats, 1, "e", IDS)
    run_exchange(server, clients, stats, 2, "e", IDS, drop=["c07"])
    c = next(clients[v] for v in server.roster.graph.neighbours("c07"))
    assert c._revealed_pair == {"c07": {"1": "round 2, exchange 'e'"}}
    assert c._revealed_self["c07"] == {"0": "round 1, exchange 'e'"}
    again = SecAggClient.load(c.dump())
    assert again._revealed_self == c._revealed_self and again.dump() == c.dump()
    with pytest.raises(SecureAggregationError, match=r"participant 'c07' of round 3, exchange "
                       r"'e' was declared dropped in round 2, exchange 'e'"):
        c.mask(stats[c.id], 3, "e", list(server.roster.graph.closed(c.id)), slot=2)


def test_the_roster_check_names_unknown_and_repeated_members():
    server, _ = setup(IDS[:6], SecAggConfig(4, FixedPoint(scale=SCALE, bound=1.0), slots=2))
    roster: Roster = server.roster
    assert roster.check_members(["c02", "c00"], what="w") == ["c00", "c02"]
    with pytest.raises(SecureAggregationError, match=r"w: \['c99'\] did not take part"):
        roster.check_members(["c00", "c99"], what="w")
    with pytest.raises(SecureAggregationError, match=r"w: a client is listed twice"):
        roster.check_members(["c00", "c00"], what="w")


# ---- the benchmark's measurement ---------------------------------------------------------------
def test_the_benchmark_times_the_two_fits_in_turns_over_the_same_seconds(monkeypatch):
    import importlib
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    bench = importlib.import_module("bench_secagg_scale")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", bench.fl.ConvergenceWarning)
        r = bench.paired(bench.data(10), 4, every=25)
    assert r["setup"]["graph"] == ("all", 6)
    assert len(r["secure"]) == 3 and len(r["ratio"]) == 3 and len(r["plain"]) >= 1
    assert np.all(r["ratio"] > 0) and np.all(np.isfinite(r["ratio"]))
    assert r["up"][0] > r["up"][1] > 0  # masked replies and reveals weigh more
