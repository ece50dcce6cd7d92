"""Subspace-Newton accelerated EM (``Federation(acceleration="newton")``, issue 23 done-when 1):
the server's state machine (engine/rounds/newton.py) driven by a centralized EM map, its
settings and its refusals. Whole federated fits are in test_newton_fits.py."""

from __future__ import annotations

import numpy as np
import pytest

import fedlatent as fl
from benchmark_scripts import load_benchmark
from fedlatent.data.fedgmm_data import make_fedgmm_synthetic
from fedlatent.engine.fedem.acceleration import SubspaceNewton
from fedlatent.engine.fedem.update import FedEMState
from fedlatent.engine.rounds.aggregate import Aggregate
from fedlatent.engine.rounds.newton import NewtonAccelerator, newton_state, secant_subspace
from fedlatent.engine.stats import Stats

av = load_benchmark("accel_variants")


def small_gmm(seed=0, n=600):
    """A 2-component 1-d Gaussian mixture with overlapping components (slow plain EM) and a
    poor start: the prototype's EM map on it."""
    rng = np.random.default_rng(seed)
    X = np.where(rng.random(n) < 0.4, -0.6, 0.8)[:, None] + rng.standard_normal((n, 1))
    start = (np.array([0.5, 0.5]), np.array([[-0.1], [0.1]]), np.ones((2, 1, 1)) * 2.0)
    return av.GMMMap(X, 2), start


def drive(em, params0, settings=SubspaceNewton(), tol=1e-8, max_rounds=2000):
    """The server's side of a federation over the pooled rows: round 1 the start's
    statistic, then each round ``F`` and the objective at its statistic and extra points.
    Returns ``(rounds, accelerator, accepted objectives, final statistic)``."""
    acc = NewtonAccelerator(settings, lambda S: av.valid(em, S["s"]), tol)
    s0, _ = em.estep(params0)
    x, rounds, path = Stats({"s": s0}), 1, []
    while rounds < max_rounds:
        rounds += 1
        fx, L = em.estep(em.params(x["s"]))
        pts = [(e, Stats({"s": f}), Le) for e in acc.extras
               for f, Le in [em.estep(em.params(e["s"]))]]
        x = acc.next_point(x, Stats({"s": fx}), L, pts)
        path.append(acc.La)
        if acc.converged:
            break
    return rounds, acc, np.array(path), acc.best[1]


def test_the_accepted_path_never_goes_down_and_beats_plain_em():
    em, start = small_gmm()
    rounds, acc, path, final = drive(em, start)
    plain, _ = av.run_plain(em, start, 1e-8)
    assert acc.converged
    assert np.all(np.diff(path) >= -1e-13)  # EM's monotonicity: the plain point is a candidate
    assert rounds <= plain.rounds / 2, (rounds, plain.rounds)
    ll_plain = em.estep(em.params(av.run_plain(em, start, 1e-8)[1]))[1]
    assert em.estep(em.params(final["s"]))[1] >= ll_plain - 1e-9
    assert acc.kept["newton"] > 0 and acc.kept["over"] > 0  # both extra points do work


def test_it_takes_the_prototypes_rounds_on_the_same_map():
    """The engine's state machine is the prototype's B'' (3 points a round, the last two
    rounds' secants kept): the same round count and final log-likelihood."""
    for em, start in (small_gmm(0), small_gmm(1, n=400)):
        fed, s = av.run_subspace_newton(em, start, 1e-8, secant=True, over=(3.0,), memory=2)
        rounds, _, _, final = drive(em, start)
        assert rounds == fed.rounds and fed.max_points == 3
        assert abs(em.estep(em.params(final["s"]))[1] - em.estep(em.params(s))[1]) < 1e-12


def linear(a=0.9):
    """``F(s) = a s + (1 - a) 10`` (fixed point 10), objective ``-(s - 10)^2``."""
    F = (lambda s: Stats({"s": a * s["s"] + (1 - a) * 10.0}))
    L = (lambda s: -float(np.sum((s["s"] - 10.0) ** 2)))
    return F, L


def test_extra_points_outside_the_domain_are_halved_towards_the_plain_point_or_dropped():
    """After two rounds from 0 the over-relaxed point is ``a + 3 h``; a domain of s <= 2.2
    halves it towards ``F(a) = 1.9`` until it fits (no round spent); s <= 1.92 refuses it
    after 1 + 6 tries (the default backtracks): no extra."""
    F, L = linear()
    for bound, expect in ((2.2, 2.125), (1.92, None)):
        acc = NewtonAccelerator(SubspaceNewton(),
                                lambda S, b=bound: bool(np.all(S["s"] <= b)), 1e-12)
        x0 = Stats({"s": np.array([0.0])})
        x1 = acc.next_point(x0, F(x0), L(x0))  # first round: no extras
        assert acc.extras == []
        x2 = acc.next_point(x1, F(x1), L(x1))  # a = x1 = 1, F(a) = 1.9, a + 3h = 3.7
        assert x2 is not x1 and float(x2["s"][0]) == pytest.approx(1.9)
        if expect is None:
            assert acc.extras == [] and acc.out_of_domain == 7  # 1 + backtracks=6 tries
        else:  # 3.7 -> 2.8 -> 2.35 -> 2.125
            assert [float(e["s"][0]) for e in acc.extras] == pytest.approx([2.125])
            assert acc.out_of_domain == 3


def test_a_round_with_a_missing_reply_restarts_from_its_plain_step():
    """The aggregate of a round with a missing client is not F: the next round is its plain
    step, alone, and a new path starts (no memory, no best point)."""
    F, L = linear()
    acc = NewtonAccelerator(SubspaceNewton(), lambda S: True, 1e-12)
    x = Stats({"s": np.array([0.0])})
    for _ in range(4):
        x = acc.next_point(x, F(x), L(x), [(e, F(e), L(e)) for e in acc.extras])
    assert acc.extras and acc.best is not None
    plain = FedEMState(F(x))

    def agg(missing):
        return Aggregate(total=F(x), participants=3, objective_sum=3 * L(x), units=3,
                         bytes_down=0, bytes_up=0, missing=missing, rejected={}, errors={})

    plan = type("Plan", (), {"points": (), "k": 6})()
    assert newton_state(acc, FedEMState(x), plain, agg(["c2"]), plan) is plain
    assert acc.extras == [] and acc.best is None and acc.older == [] and not acc.converged
    # the next complete round starts the path again: no extras yet, no stopping test
    assert newton_state(acc, plain, FedEMState(F(F(x))), agg([]), plan).S_hat is not None
    assert acc.extras == [] and not acc.converged


def test_extra_points_a_round_did_not_return_count_as_a_plain_round():
    """A transport that ignores ``params{j}`` (no ``Aggregate.points``): the plain step."""
    F, L = linear()
    acc = NewtonAccelerator(SubspaceNewton(), lambda S: True, 1e-12)
    x = Stats({"s": np.array([0.0])})
    for _ in range(3):
        x = acc.next_point(x, F(x), L(x), [(e, F(e), L(e)) for e in acc.extras])
    sent = tuple(acc.extras)
    assert len(sent) == 2
    plan = type("Plan", (), {"points": sent, "k": 5})()
    agg = Aggregate(total=F(x), participants=2, objective_sum=2 * L(x), units=2, bytes_down=0,
                    bytes_up=0, missing=[], rejected={}, errors={})
    nxt = newton_state(acc, FedEMState(x), FedEMState(F(x)), agg, plan)
    assert float(nxt.S_hat["s"][0]) == pytest.approx(float(F(x)["s"][0]))
    assert acc.kept["plain"] >= 1


def test_secant_subspace_drops_older_secants_nearly_in_the_span():
    """An older secant within 10% of the newer one's direction is dropped; the kept ones give
    ``J D = G`` exactly."""
    rng = np.random.default_rng(0)
    J = rng.normal(size=(4, 4))
    d1 = np.array([[1.0], [0.0], [0.0], [0.0]])
    d2 = np.array([[1.0], [0.05], [0.0], [0.0]])  # 5% outside the span of d1
    d3 = np.array([[0.0], [1.0], [1.0], [0.0]])
    U, JU = secant_subspace([(d1, J @ d1), (d2, J @ d2), (d3, J @ d3)], drop=0.1)
    assert U.shape == (4, 2)
    np.testing.assert_allclose(U.T @ U, np.eye(2), atol=1e-12)
    np.testing.assert_allclose(JU, J @ U, rtol=1e-10, atol=1e-12)
    assert secant_subspace([], 0.1) == (None, None)


# ---- settings and refusals ------------------------------------------------------------------
def test_settings_and_config_round_trip():
    fed = fl.Federation(acceleration=fl.SubspaceNewton(over=2.0, memory=1))
    fed.validate()
    assert fed.squarem is None and fl.Federation(acceleration="squarem").newton is None
    assert fed.to_config()["acceleration"] == {"method": "newton", "over": 2.0, "memory": 1,
                                               "drop": 0.1, "backtracks": 6}
    assert fl.Federation.from_config(fed.to_config()).newton == fed.newton
    assert fl.Federation(acceleration="newton").newton == fl.SubspaceNewton()
    for kwargs, message in ((dict(over=1.0), r"SubspaceNewton\(over=\.\.\.\) must be a number "
                                             r"> 1, got 1\.0"),
                            (dict(memory=-1), r"SubspaceNewton\(memory=\.\.\.\) must be an "
                                              r"integer >= 0, got -1"),
                            (dict(drop=1.5), r"SubspaceNewton\(drop=\.\.\.\) must be in "
                                             r"\(0, 1\), got 1\.5")):
        with pytest.raises(ValueError, match=message):
            fl.SubspaceNewton(**kwargs)


def test_a_model_declaring_a_client_state_refusal_is_refused_naming_it(monkeypatch):
    """The hook (``multipoint_refusal``) stays for models whose client state Newton cannot
    carry; FedGMM itself no longer declares it (its clients carry their mixing weights along
    the path: tests/engine/test_newton_fedgmm.py), so it is set here."""
    from fedlatent.models.fedgmm.model import FedGMMModel

    monkeypatch.setattr(FedGMMModel, "multipoint_refusal", "its clients' mixing weights "
                        "advance at each E-step (client state)", raising=False)
    fd = make_fedgmm_synthetic(4, 150, n_features=3, random_state=0).train
    est = fl.FedGMM(2, 2, max_rounds=3, random_state=0, verbose=False,
                    federation=fl.Federation(acceleration="newton"))
    with pytest.raises(ValueError, match=r"^Federation\(acceleration='newton'\) is not available "
                                         r"for model 'fedgmm': its clients' mixing weights "
                                         r"advance at each E-step \(client state\), so the EM "
                                         r"map is not a function of the statistic alone and "
                                         r"several points a round would each need a client "
                                         r"state; use acceleration='squarem' or None$"):
        est.fit(fd)


def test_resume_is_refused(tmp_path):
    rng = np.random.default_rng(0)
    fd = fl.FederatedDataset.from_arrays({f"c{c}": rng.normal(size=(30, 2)) for c in range(3)})
    gm = fl.FederatedGaussianMixture(2, max_rounds=5, random_state=0, verbose=False,
                                     weights_init=[0.5, 0.5], means_init=[[0, 0], [1, 1]],
                                     federation=fl.Federation(acceleration="newton"))
    with pytest.raises(ValueError, match=r"resume=True is not available with "
                                         r"Federation\(acceleration=\.\.\.\)"):
        gm.fit(fd, checkpoint=tmp_path / "ck", resume=True)
