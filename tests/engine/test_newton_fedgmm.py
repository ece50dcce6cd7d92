"""FedGMM under subspace Newton: each client steps every extra point from the combination of
its own kept mixing weights that the server's coefficients name (``history``, ``accepted``,
``columns``, ``combine{j}``), one by one and batched alike; a message naming a state a client
does not keep is refused; the server's coefficients reproduce its own extra points; a FedGMM
fit under ``acceleration="newton"`` reaches plain EM's log-likelihood in fewer rounds."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from test_multipoint_rounds import OFF, _advance, _fedgmm_fd, _rounds

import fedlatent as fl
from fedlatent.engine.fedem.acceleration import SubspaceNewton
from fedlatent.engine.rounds.newton import NewtonAccelerator
from fedlatent.engine.rounds.plan import make_plan
from fedlatent.engine.stats import Stats
from tolerance import assert_close

#: round 5's fields: accept point 1 of round 4; point 1 combines everything, point 2 is an
#: over-relaxation large enough that some weights hit the floor (0.9 of the weight held)
ROUND5 = {"history": np.array([4, 5]), "accepted": 1, "columns": np.array([[4, 1], [4, 2]]),
          "combine1": np.array([0.5, -0.3, 0.8]), "combine2": np.array([6.0, 0.0, 0.0])}


def _plan(rd, k, xs=(), **fields):
    pts = [(x, rd.model.server_step(x, rd.params, rd.n_total)) for x in xs]
    return make_plan(rd.fed, k, int(rd.opt.seed), rd.state, rd.params, len(rd.cids), rd.shapes,
                     rd.alpha, rd.sizes, points=pts, client_fields=fields)


def _gather(rd, plan):
    """A round's aggregate, the server's mirror of the clients' control variates following it
    as the loop's round does (the statistic itself is not stepped: the tests send each round
    the same ``S_hat``)."""
    agg = rd.gather(plan)
    if agg.accepted is not None:
        rd.mirror.follow(plan.init_round, agg.accepted, rd.state.S_hat, plan.alpha)
    return agg


def _round4(batched):
    """Three plain rounds, then round 4 with two extra points and ``history`` (each point
    stepped from the state the round starts from: ``combine{j} = [0]``)."""
    rd = _rounds(_fedgmm_fd(), "fedgmm", fl.Federation(disclosure=OFF), batched)
    xs = _advance(rd, 3)[:2]
    agg = _gather(rd, _plan(rd, 4, xs, history=np.array([4]), combine1=np.zeros(1),
                            combine2=np.zeros(1)))
    assert len(agg.points) == 2 and not agg.missing and not agg.rejected
    return rd, xs


def _by_hand(model, mid, j):
    """Round 5's start of extra point ``j`` from the states kept after round 4 (ROUND5)."""
    a_out, a_in = mid["pstate4.1/pi"], mid["pinput4.1/pi"]
    coef = ROUND5[f"combine{j}"]
    pi = a_out + coef[0] * (a_out - a_in)
    for b, (r, jj) in zip(coef[1:], ROUND5["columns"], strict=True):
        pi = pi + b * (mid[f"pstate{r}.{jj}/pi"] - mid[f"pstate{r}.0/pi"])
    floor = model.pi_keep * a_out
    return np.maximum(pi, floor) / np.maximum(pi, floor).sum(), int(np.sum(pi < floor))


def _round5(batched):
    rd, xs = _round4(batched)
    mid = rd.runtime.get_client_states()
    agg = _gather(rd, _plan(rd, 5, xs, **ROUND5))
    assert len(agg.points) == 2 and not agg.missing and not agg.rejected
    return rd, xs, mid, rd.runtime.get_client_states()


def test_each_extra_point_steps_from_the_combination_the_message_names():
    """Round 5 accepts point 1 of round 4: each client adopts that point's output, steps point
    j from ``s'_a + gamma (s'_a - s_a) + sum_i beta_i (s'_{r_i,j_i} - s'_{r_i,0})`` floored at
    0.9 of ``s'_a`` and renormalized, and keeps what went in and came out; the rounds' kept
    states follow ``history``; per-client and batched rounds agree."""
    got = {}
    for batched in (False, True):
        rd, xs, mid, after = got[batched] = _round5(batched)
        nodes, floored = rd.runtime.nodes, 0
        for c in rd.cids:
            data = nodes[c]._data
            for j in (1, 2):
                start, cut = _by_hand(rd.model, mid[c], j)
                floored += cut
                assert_close(after[c][f"pinput5.{j}/pi"], start)
                theta = rd.model.server_step(xs[j - 1], rd.params, rd.n_total)
                out = rd.model.client_stats(theta, data, {"pi": start}, None).state["pi"]
                assert_close(after[c][f"pstate5.{j}/pi"], out)
            primary = rd.model.client_stats(rd.params, data, {"pi": mid[c]["pstate4.1/pi"]},
                                            None).state["pi"]
            assert_close(after[c]["model/pi"], primary)
            assert_close(after[c]["pinput5.0/pi"], mid[c]["pstate4.1/pi"])
            assert_close(after[c]["pstate5.0/pi"], primary)
            kept = {k.partition("/")[0] for k in after[c] if k.startswith("p")}
            assert kept == {f"pstate{r}.{j}" for r in (4, 5) for j in range(3)} | \
                {f"pinput5.{j}" for j in range(3)}
        assert floored > 0  # the floor was exercised
    (_, _, _, one), (_, _, _, batch) = got[False], got[True]
    for c in one:
        assert set(one[c]) == set(batch[c])
        for key in one[c]:
            assert_close(one[c][key], batch[c][key])


def test_the_kept_states_are_dropped_when_history_no_longer_names_their_round():
    """A round whose ``history`` names only itself drops round 4's outputs; a message
    without ``history`` (every other fit) drops every kept state."""
    rd, xs = _round4(True)
    assert not _gather(rd, _plan(rd, 5, xs[:1], history=np.array([5]),
                                 combine1=np.zeros(1))).rejected
    kept = {k.partition("/")[0] for k in rd.runtime.get_client_states()["c0"]
            if k.startswith("p")}
    assert kept == {"pstate5.0", "pstate5.1", "pinput5.0", "pinput5.1"}
    assert not _gather(rd, _plan(rd, 6)).rejected
    assert not any(k.startswith("p") for k in rd.runtime.get_client_states()["c0"])


REFUSED = [
    (5, 2, {**ROUND5, "accepted": 3},
     "round 5's message accepts extra point 3 of round 4, but this client keeps no model "
     "state for that point (a deviating server); the server must name one of the points it "
     "sent the round before (accepted = 1..m) or none (the round's own statistic)"),
    (5, 1, {"history": np.array([2, 5]), "accepted": 1, "columns": np.array([[2, 1]]),
            "combine1": np.array([0.0, 1.0])},  # (the accepted state not adopted either)
     "round 5's extra point 1 combines point 1 of round 2, which this client keeps no state "
     "for (a deviating server); a server may combine only the points of the rounds its "
     "'history' named"),
    (4, 1, {"history": np.array([4]), "combine1": np.array([2.0])},
     "round 4's extra point 1 combines the state the point accepted in round 3 was stepped "
     "from, which this client keeps no state for (a deviating server); a server may combine "
     "only the points of the rounds its 'history' named"),
    (4, 1, {"history": np.array([4, 9]), "combine1": np.zeros(1)},
     "round 4's 'history' names 2 round(s) [4, 9]: a client keeps point states of at most 16 "
     "rounds, each this one or before (a deviating server)"),
    (4, 1, {"history": np.arange(-12, 5), "combine1": np.zeros(1)},
     "round 4's 'history' names 17 round(s) [-12, -11, -10, -9, -8, -7, -6, -5, -4, -3]: a "
     "client keeps point states of at most 16 rounds, each this one or before (a deviating "
     "server)"),
]


@pytest.mark.parametrize("batched", [False, True], ids=["one-by-one", "batched"])
@pytest.mark.parametrize("k, m, fields, why", REFUSED, ids=["accepted", "column", "gamma",
                                                              "history-future", "history-long"])
def test_a_message_naming_a_state_the_client_does_not_keep_is_refused(batched, k, m, fields,
                                                                       why):
    """A deviating server: every client refuses the round, naming what it does not keep,
    and keeps its state (batched: the clients one by one, each saying why)."""
    if k == 5:
        rd, xs = _round4(batched)
    else:
        rd = _rounds(_fedgmm_fd(), "fedgmm", fl.Federation(disclosure=OFF), batched)
        xs = _advance(rd, 3)
    before = rd.runtime.get_client_states()
    agg = rd.gather(_plan(rd, k, xs[:m], **fields))
    assert sorted(agg.missing) == sorted(rd.cids)
    assert agg.errors["c0"] == f"ValueError: client 'c0': {why}"
    after = rd.runtime.get_client_states()
    for c in rd.cids:
        assert set(after[c]) == set(before[c])
        for key in before[c]:
            assert_close(after[c][key], before[c][key])


def test_the_servers_coefficients_reproduce_its_own_extra_points():
    """On a linear contraction ``F`` with a domain that halves far points: each extra point
    the accelerator sends equals ``F(a) + gamma (F(a) - a) + sum_i beta_i (F(x_{r_i, j_i}) -
    F(x_{r_i, 0}))`` with the coefficients :meth:`client_fields` sends (the combination the
    clients make of their states), the halvings included; a model without a client state
    gets no fields."""
    rng = np.random.default_rng(0)
    p = 6
    A = 0.9 * np.linalg.qr(rng.normal(size=(p, p)))[0] @ np.diag(np.linspace(0.5, 1, p))
    b, star = rng.normal(size=p), None
    star = np.linalg.solve(np.eye(p) - A, b)
    F = (lambda x: Stats({"s": A @ x["s"] + b}))
    L = (lambda x: -float(np.sum((x["s"] - star) ** 2)))
    valid = (lambda x: float(np.abs(x["s"] - star).max()) < 4.0)
    acc = NewtonAccelerator(SubspaceNewton(), valid, 1e-12, client_state=True)
    assert NewtonAccelerator(SubspaceNewton(), valid, 1e-12).client_fields([], 1) == {}
    x0, seen, checked, halved = Stats({"s": star + 3.0}), {}, 0, acc.out_of_domain
    for k in range(1, 11):
        xs = list(acc.extras)
        fields = acc.client_fields(xs, k)
        assert sorted(fields["history"]) == sorted({k, *acc.columns[:, 0].tolist()})
        a, fa = acc.a, x0["s"]
        for j, x in enumerate(xs, 1):
            coef = fields[f"combine{j}"]
            want = fa + coef[0] * (fa - a)
            for beta, (r, jj) in zip(coef[1:], fields.get("columns", np.zeros((0, 2))),
                                     strict=True):
                want = want + beta * (seen[r, jj] - seen[r, 0])
            assert_close(x["s"], want)
            checked += 1
        seen.update({(k, 0): F(x0)["s"]})
        seen.update({(k, j): F(x)["s"] for j, x in enumerate(xs, 1)})
        x0 = acc.next_point(x0, F(x0), L(x0), [(x, F(x), L(x)) for x in xs], k)
    assert checked >= 12 and acc.out_of_domain > halved, (checked, acc.out_of_domain)


def test_a_newton_fedgmm_fit_reaches_plain_ems_loglik_in_fewer_rounds():
    """Subspace Newton (the clients carrying their mixing weights along the path) ends at
    least at plain EM's log-likelihood (to 1e-6 relative) in fewer rounds."""
    fd = _fedgmm_fd(n_clients=4, seed=1)
    fits = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for acc in (None, "newton"):
            fed = fl.Federation(disclosure=OFF, acceleration=acc)
            fits.append(fl.FedGMM(2, 2, tol=1e-6, max_rounds=2000, random_state=0,
                                  federation=fed, verbose=False).fit(fd))
    plain, newton = fits
    ll_plain = plain.history_[-1].objective
    ll_newton = max(r.objective for r in newton.history_)
    assert newton.n_iter_ < plain.n_iter_, (newton.n_iter_, plain.n_iter_)
    assert ll_newton >= ll_plain - 1e-6 * abs(ll_plain), (ll_newton, ll_plain)


def test_the_servers_memory_stays_within_what_a_client_keeps():
    """``memory + 1`` rounds of history: the largest memory a client accepts, and no more."""
    from fedlatent.engine.node.pointstate import MAX_HISTORY

    assert SubspaceNewton(memory=MAX_HISTORY - 1).memory == MAX_HISTORY - 1
    with pytest.raises(ValueError, match=r"SubspaceNewton\(memory=\.\.\.\) must be at most "
                       r"15 \(a client keeps the states of at most 16 rounds\), got 16"):
        SubspaceNewton(memory=MAX_HISTORY)


def test_a_fit_whose_clients_keep_a_state_ends_on_the_last_plain_point():
    """On a linear contraction, at a round whose accepted point is an extra one: without a
    client state the fit ends on the best ``F`` evaluated; with one (FedGMM's weights), on
    the round's plain point, whose state every client holds, not on a point the clients would
    need another exchange to adopt."""
    from fedlatent.engine.fedem.update import FedEMState

    rng = np.random.default_rng(1)
    p = 5
    A = 0.95 * np.linalg.qr(rng.normal(size=(p, p)))[0] @ np.diag(np.linspace(0.6, 1, p))
    star = np.linalg.solve(np.eye(p) - A, rng.normal(size=p))
    F = (lambda x: Stats({"s": A @ x["s"] + (star - A @ star)}))
    L = (lambda x: -float(np.sum((x["s"] - star) ** 2)))
    accs = [NewtonAccelerator(SubspaceNewton(), lambda x: True, 1e-12, client_state=cs)
            for cs in (False, True)]
    x0, found = Stats({"s": star + 2.0}), 0
    for k in range(1, 8):
        xs = list(accs[0].extras)
        pts = [(x, F(x), L(x)) for x in xs]
        f0 = F(x0)
        nxt = [acc.next_point(x0, f0, L(x0), pts, k) for acc in accs]
        assert_close(nxt[0]["s"], nxt[1]["s"])  # the same path
        if accs[0].accepted:  # an extra point won: the fit could stop here
            plain, new = FedEMState(f0), FedEMState(nxt[0])
            best = accs[0].final(new, plain)
            assert best is None or best.S_hat is accs[0].best[1]
            assert accs[0].best[0] > L(x0)
            assert accs[1].final(new, plain) is plain
            assert accs[1].final(plain, plain) is None
            found += 1
        x0 = nxt[0]
    assert found >= 2, found
