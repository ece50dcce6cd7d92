"""One gather step (issue 20, item 1): a round plan, one aggregate type from every collector,
the reply screen and the control-variate mirror written once, one FedEM client update for one
client and a batch, one fit setup."""


import numpy as np
import pytest

import fedlatent as fl
from fedlatent.engine.fedem.streams import quantize_flat
from fedlatent.engine.fedem.update import select_active, stat_bytes
from fedlatent.engine.node.batched import BatchReply
from fedlatent.engine.node.clientstep import fedem_rows
from fedlatent.engine.privacy.dp import planned_releases
from fedlatent.engine.rounds import Aggregate
from fedlatent.engine.rounds.aggregate import Accepted
from fedlatent.engine.rounds.collectors import Batched, OneByOne
from fedlatent.engine.rounds.fitsetup import setup_fit
from fedlatent.engine.rounds.plan import draw_positions
from fedlatent.engine.rounds.screen import Mirror
from fedlatent.engine.rounds.secure_round import SecureCollector
from fedlatent.engine.secagg.secure import default_threshold
from fedlatent.engine.stats import Stats
from fedlatent.engine.transport.inprocess import InProcessRuntime
from started_loop import started_loop
from tolerance import assert_close, assert_same

FEDEM = fl.Federation(participation=0.5, quantizer=fl.Quantizer(4), control_variates=True,
                      step_size=0.5)


def _fd(n_clients=9, seed=0):
    rng = np.random.default_rng(seed)
    return fl.FederatedDataset.from_arrays(
        {f"c{i}": rng.normal(size=(int(rng.integers(8, 20)), 2)) + 3.0 * (i % 3)
         for i in range(n_clients)})


def _rounds(fd, fed, batched=True, record=False):
    """The loop of a GMM fit on ``fd``, set up and started (no round run)."""
    return started_loop(fl.FederatedGaussianMixture(3, random_state=0, federation=fed), fd,
                        InProcessRuntime(fd, batched=batched, record=record))


@pytest.mark.parametrize("k", [2, 3, 7])
def test_a_plan_draws_the_clients_select_active_draws(k):
    ids = [f"c{i}" for i in range(40)]
    idx = draw_positions(len(ids), 0.3, 11, k, init_round=False)
    assert [ids[i] for i in idx] == select_active(ids, 0.3, 11, k, False)
    assert_same(draw_positions(len(ids), 0.3, 11, k, init_round=True), np.arange(40))


@pytest.mark.usefixtures("saturation_rule_off")
def test_the_plan_of_the_initialization_round_sends_raw_statistics():
    rd = _rounds(_fd(), FEDEM, batched=False)
    raw, quant = stat_bytes(FEDEM, rd.shapes)
    assert quant < raw
    first = rd.plan(1)
    assert first.init_round and first.gamma == 1.0 and first.reply_bytes == raw
    assert first.mode == "full" and first.msg["quant_levels"] == 0
    assert_same(first.idx, np.arange(9))


@pytest.mark.usefixtures("saturation_rule_off")
def test_the_loop_chooses_its_collector_by_the_runtime_and_the_federation():
    fd = _fd()
    assert type(_rounds(fd, fl.Federation()).collector) is Batched
    assert type(_rounds(fd, fl.Federation(), record=True).collector) is OneByOne
    secure = _rounds(fd, fl.Federation(secure_aggregation=True))
    assert type(secure.collector) is SecureCollector


@pytest.mark.usefixtures("saturation_rule_off")
@pytest.mark.parametrize("fed", [fl.Federation(), fl.Federation(secure_aggregation=True)],
                         ids=["plain", "secure"])
def test_every_collector_returns_the_same_aggregate(fed):
    """The initialization round through the batched collector, one by one, and (secure)
    through the secure sum: one Aggregate type, the same sum (to rounding: the batched step
    and secure aggregation's fixed point group the sums differently)."""
    fd = _fd()
    ones, many = _rounds(fd, fl.Federation(), batched=False), _rounds(fd, fl.Federation())
    a, b = OneByOne(ones).gather(ones.plan(1)), Batched(many).gather(many.plan(1))
    assert type(a) is type(b) is Aggregate
    assert (a.participants, a.units, a.bytes_up, a.bytes_down) == \
        (b.participants, b.units, b.bytes_up, b.bytes_down)
    assert a.bytes_up == 9 * stat_bytes(fl.Federation(), ones.shapes)[0]
    assert a.participants == 9 and a.units == sum(fd[c].n_samples for c in fd.client_ids)
    for key in a.total:
        assert_close(b.total[key], a.total[key])
    assert_close(b.objective_sum, a.objective_sum)
    if fed.secure_aggregation:
        sec = _rounds(fd, fed)
        s = sec.collector.gather(sec.plan(1))
        assert type(s) is Aggregate and s.accepted is None and s.participants == 9
        for key in a.total:
            assert_close(s.total[key], a.total[key], rtol=1e-9)
    else:
        assert a.accepted is not None and a.accepted.mask.all()


@pytest.mark.usefixtures("saturation_rule_off")
def test_a_lying_client_is_refused_with_the_same_reason_by_both_collectors():
    """One screen for every collector: client c4's rows made impossible (negative counts)."""
    fd = _fd()
    out = []
    for rd in (_rounds(fd, fl.Federation(), batched=False), _rounds(fd, fl.Federation())):
        plan = rd.plan(1)
        real = rd.collector.gather  # tamper with what crosses: the replies, after the step
        if isinstance(rd.collector, Batched):
            call = rd.runtime.call_batched

            def lying(method, idx, msg, resets=None, call=call):
                rep = call(method, idx, msg, resets)
                rep.Q[4, 0] = -5.0  # component 0's weight sum of client c4
                return rep
            rd.runtime.call_batched = lying
        else:
            call = rd.runtime.call

            def lying(ids, method, msgs, call=call):
                reps = call(ids, method, msgs)
                key = next(k for k in reps["c4"] if k.startswith("delta/"))
                reps["c4"][key] = np.array(reps["c4"][key], dtype=float)
                reps["c4"][key].flat[0] = -5.0
                return reps
            rd.runtime.call = lying
        with pytest.raises(fl.engine.FederatedFitError, match=(
                r"clients \['c4'\] did not answer the initialization round validly "
                r"\(every client must\): client 'c4': count 'nk' is negative")) as err:
            real(plan)
        out.append(str(err.value))
    assert out[0] == out[1]


def _rows(Q, clients, n=None):
    Q = np.asarray(Q, dtype=float)
    n = np.full(len(clients), 5.0) if n is None else n
    return BatchReply(np.asarray(clients), Q, n, np.zeros(len(clients)),
                      Stats({"s": np.zeros(Q.shape[1])}))


def test_the_mirror_follows_accepted_refused_and_absent_clients():
    ids = ["a", "b", "c", "d"]
    m = Mirror(ids, active=True)
    S0 = Stats({"s": np.array([1.0, 2.0])})
    init = Accepted(_rows([[2, 2], [3, 3], [4, 4], [5, 5]], [0, 1, 2, 3]),
                    np.ones(4, bool), np.zeros(0, int), np.zeros(0, int), ids, np.ones(4))
    m.follow(True, init, S0, 0.5)
    assert_same(m.arr, np.array([[1, 0], [2, 1], [3, 2], [4, 3]], dtype=float))
    # round 2: a accepted (V += 0.5 Q), b refused (resync), c absent (unknown), d raised
    rnd = Accepted(_rows([[2, 4], [9, 9]], [0, 1]), np.array([True, False]), np.array([1]),
                   np.array([2]), ids, np.ones(4))
    m.follow(False, rnd, S0, 0.5)
    assert_same(m.arr[0], np.array([2.0, 2.0]))
    assert_same(m.arr[1], np.array([2.0, 1.0]))  # the last accepted V_b, kept
    assert m.known.tolist() == [True, True, False, True]
    assert m.resync.tolist() == [False, True, False, False]
    resets = m.resets(np.arange(4))
    assert list(resets) == [1] and resets[1].tolist() == [2.0, 1.0]
    assert m.reset_blocks(1)["V_reset/s"].tolist() == [2.0, 1.0]
    assert m.reset_bytes(1) == len("V_reset/s") + 16
    mirror, resync = m.checkpointed()
    assert mirror["c"] is None and resync == {"b"} and mirror["d"]["s"].tolist() == [4.0, 3.0]
    assert Mirror(ids, active=False).checkpointed() is None


@pytest.mark.parametrize("levels", [0, 4])
def test_the_client_update_of_a_batch_is_each_clients_update(levels):
    """``fedem_rows`` on six clients equals it on each client alone (a batch of one, what a
    ClientNode computes): the same operations on the same values, so the same bits."""
    rng = np.random.default_rng(levels)
    d = rng.normal(size=(6, 7)) * 10
    n = rng.integers(1, 9, size=6).astype(float)
    S_flat = rng.normal(size=(1, 7))
    V = rng.normal(size=(6, 7))
    had = np.array([True, False, True, True, False, True])
    u = rng.random((6, 7))
    kw = dict(levels=levels, sizes=[3, 4], alpha=0.25, cv=True)
    batch = d.copy()
    V_batch = fedem_rows(batch, n, S_flat, V, had, uniforms=u, **kw)
    for i in range(6):
        one = d[i:i + 1].copy()
        V_one = fedem_rows(one, n[i:i + 1], S_flat, V[i:i + 1], had[i:i + 1],
                           uniforms=u[i:i + 1], **kw)
        assert_same(one, batch[i:i + 1])
        assert_same(V_one, V_batch[i:i + 1])
    # by hand: (sums / n - S_hat - V_c), quantized; V_c (0 when it had none) + alpha Q_c
    want = d / n[:, None] - S_flat - np.where(had[:, None], V, 0.0)
    if levels:
        want = quantize_flat(want, [3, 4], levels, u)
    assert_close(batch, want)
    assert_close(V_batch, np.where(had[:, None], V, 0.0) + 0.25 * want)


@pytest.mark.usefixtures("saturation_rule_off")
def test_one_fit_setup_plans_the_budget_and_opens_the_channel():
    fd = _fd()
    rt = InProcessRuntime(fd)
    model = fl.FederatedGaussianMixture(2)._make_model(fd)
    dp = fl.DifferentialPrivacy(epsilon=2.0, delta=1e-5, clip=3.0)
    fed = fl.Federation(privacy=dp, secure_aggregation=True)
    setup = setup_fit(rt, model, fed, 4, init_releases=2)
    assert setup.n_units == {c: fd[c].n_samples for c in fd.client_ids}
    assert setup.privacy.calibration.releases == planned_releases(4, 1, 2) == 6
    assert setup.secure.config.threshold == default_threshold(9)
    # 4 rounds, 8 initialization exchanges and the 8 group tests that locate a liar
    assert setup.secure.config.n_slots == 4 + 8 + 8
    plain = setup_fit(InProcessRuntime(fd), model, fl.Federation(), 4)
    assert plain.secure is None and plain.privacy is None
