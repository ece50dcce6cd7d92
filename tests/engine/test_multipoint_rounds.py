"""Multi-point rounds (issue 23, rounds to tolerance): a round carries extra points ``x_j``
beside ``S_hat`` and every drawn client returns its mean statistic and objective at each
``T(x_j)`` in the same exchange; the collectors sum them over the clients accepted for
``total`` (``Aggregate.points``)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import fedlatent as fl
import fedlatent.engine.rounds.collectors as collectors
from fedlatent.engine.protocol.messages import pack
from fedlatent.engine.rounds.collectors import Batched, OneByOne
from fedlatent.engine.rounds.plan import make_plan
from fedlatent.engine.rounds.secure_round import SecureCollector
from fedlatent.engine.transport.inprocess import InProcessRuntime
from started_loop import started_loop
from tolerance import assert_close, assert_same

OFF = fl.DisclosurePolicy.off()


def _gmm_fd(n_clients=6, seed=0, rows=(30, 45)):
    rng = np.random.default_rng(seed)
    return fl.FederatedDataset.from_arrays(
        {f"c{i}": rng.normal(size=(int(rng.integers(*rows)), 2)) + 2.0 * (i % 3)
         for i in range(n_clients)})


def _lcr_fd(n_clients=6, seed=1):
    rng = np.random.default_rng(seed)
    parts = {}
    for i in range(n_clients):
        n = int(rng.integers(40, 60))
        X = rng.normal(size=(n, 2))
        z = rng.random(n) < 0.5
        y = np.where(z, X @ [1.0, -2.0] + 1.0, X @ [-1.0, 0.5] - 2.0) + 0.3 * rng.normal(size=n)
        parts[f"c{i}"] = (X, y)
    return fl.FederatedDataset.from_arrays(parts)


def _fedgmm_fd(n_clients=6, seed=2):
    rng = np.random.default_rng(seed)
    parts = {}
    for i in range(n_clients):
        n = int(rng.integers(40, 60))
        X = rng.normal(size=(n, 2)) + 1.5 * (i % 2)
        parts[f"c{i}"] = (X, (X[:, 0] + 0.5 * rng.normal(size=n) > 0.75).astype(int))
    return fl.FederatedDataset.from_arrays(parts)


def _estimator(kind, fed):
    if kind == "fedgmm":
        return fl.FedGMM(2, 2, random_state=0, federation=fed)
    if kind.startswith("gmm"):
        return fl.FederatedGaussianMixture(int(kind[3:] or 2), random_state=0, federation=fed)
    return fl.LatentClassRegression(2, random_state=0, federation=fed)


def _rounds(fd, kind, fed, batched=True, policies=None):
    """A fit's loop, set up and started, no round run."""
    return started_loop(_estimator(kind, fed), fd,
                        InProcessRuntime(fd, batched=batched, policies=policies))


def _advance(rd, rounds=3):
    """Run ``rounds`` rounds; the statistics ``S_hat`` after each (earlier rounds' points)."""
    out = []
    for k in range(1, rounds + 1):
        rd.round(k)
        out.append(rd.state.S_hat.copy())
    return out


def _plan(rd, k, xs):
    pts = [(x, rd.model.server_step(x, rd.params, rd.n_total)) for x in xs]
    return make_plan(rd.fed, k, int(rd.opt.seed), rd.state, rd.params, len(rd.cids), rd.shapes,
                     rd.alpha, rd.sizes, points=pts)


def _evaluated(rd, k, theta):
    """``(sum_c w_c S_c(theta), sum_c objective_c)`` from each client's own ``evaluate``."""
    msg = {"seed": int(rd.opt.seed), "round": k, **pack("params", theta)}
    reps = rd.runtime.call(rd.cids, "evaluate", {c: msg for c in rd.cids})
    keys = [k for k in reps[rd.cids[0]] if k.startswith("delta/")]
    total = {key[6:]: sum(rd.weights[c] * reps[c][key] for c in rd.cids) for key in keys}
    return total, sum(float(reps[c]["objective"]) for c in rd.cids)


COLLECTORS = {"one-by-one": (OneByOne, False, {}), "batched": (Batched, True, {})}
SECURE = {**COLLECTORS, "secure": (SecureCollector, True, {"secure_aggregation": True,
                                                      "verified": False})}  # (points)


@pytest.mark.parametrize("kind", ["gmm", "lcr"])
@pytest.mark.parametrize("name", list(SECURE))
def test_points_are_the_weighted_sums_of_each_clients_evaluation(kind, name):
    """Each collector's sums of the points are those of the clients' own evaluations (to the
    fixed point's rounding under secure aggregation) and its ``total`` that of the round
    without points."""
    cls, batched, extra = SECURE[name]
    rtol = 1e-9 if name == "secure" else 1e-12
    fed = fl.Federation(disclosure=OFF, **extra)
    fd = _gmm_fd() if kind == "gmm" else _lcr_fd()
    rd, plain = _rounds(fd, kind, fed, batched), _rounds(fd, kind, fed, batched)
    xs = _advance(rd)[:2]
    _advance(plain)
    assert type(rd.collector) is cls and type(plain.collector) is cls
    plan = _plan(rd, 4, xs)
    agg = rd.collector.gather(plan)
    ref = plain.collector.gather(plain.plan(4))
    assert plan.msg["points"] == 2 and agg.participants == ref.participants == 6
    for key in ref.total:  # the round's own statistic as without points
        assert_close(agg.total[key], ref.total[key])
    assert_close(agg.objective_sum, ref.objective_sum)
    assert len(agg.points) == 2
    for (S_j, obj_j), x in zip(agg.points, xs):
        want, obj = _evaluated(rd, 4, rd.model.server_step(x, rd.params, rd.n_total))
        assert set(S_j) == set(want)
        for key in want:
            assert_close(S_j[key], want[key], rtol=rtol)
        assert_close(obj_j, obj, rtol=rtol)
    assert ref.points == []


@pytest.mark.parametrize("name", list(COLLECTORS))
def test_bytes_up_count_the_points(name):
    cls, batched, extra = COLLECTORS[name]
    fed = fl.Federation(disclosure=OFF, **extra)
    rd, plain = _rounds(_gmm_fd(), "gmm", fed, batched), _rounds(_gmm_fd(), "gmm", fed, batched)
    xs = _advance(rd, 2)
    _advance(plain, 2)
    agg = rd.collector.gather(_plan(rd, 3, xs))
    ref = plain.collector.gather(plain.plan(3))
    per_point = 8 * (2 + 2 * 2 + 2 * 2 * 2) + 8  # nk (K), sx (K, d), sxx (K, d, d); objective
    assert collectors.point_bytes(rd.shapes) == per_point
    assert agg.bytes_up - ref.bytes_up == 6 * 2 * per_point


def _fixed_fd(rows, d=2, n_clients=6, seed=0):
    rng = np.random.default_rng(seed)
    return fl.FederatedDataset.from_arrays(
        {f"c{i}": rng.normal(size=(rows, d)) + 2.0 * (i % 3) for i in range(n_clients)})


def _points_of(rd, k, m):
    """A plan for round ``k`` with ``m`` extra points (the current statistic, repeated)."""
    x = rd.state.S_hat if rd.state.S_hat is not None else None
    if x is None:  # the initialization round: any point will do, the clients refuse it
        return make_plan(rd.fed, k, int(rd.opt.seed), rd.state, rd.params, len(rd.cids),
                         rd.shapes, rd.alpha, rd.sizes, points=[(None, rd.params)] * m)
    return _plan(rd, k, [x] * m)


def test_points_are_refused_under_differential_privacy():
    dp = fl.DifferentialPrivacy(2.0, 1e-5, clip=4.0, noise_seed=0)
    rd = _rounds(_gmm_fd(), "gmm", fl.Federation(privacy=dp), batched=True)
    assert type(rd.collector) is OneByOne
    _advance(rd, 1)
    agg = rd.gather(_points_of(rd, 2, 2))
    assert agg.participants == 0 and agg.missing == rd.cids and agg.points == []
    assert agg.errors["c3"] == (
        "ValueError: client 'c3': a round with 2 extra point(s) is not available under "
        "differential privacy: each point is a release the privacy budget did not plan; use "
        "Federation(acceleration=None) or a single point a round")


def test_points_are_refused_with_mini_batches_by_both_collectors():
    fed = fl.Federation(disclosure=OFF, step_size=0.5, batch_size=7, random_state=1)
    rd = _rounds(_gmm_fd(), "gmm", fed, batched=True)
    _advance(rd, 1)
    plan = _points_of(rd, 2, 1)
    with pytest.raises(NotImplementedError, match="full passes after the initialization"):
        Batched(rd).gather(plan)
    agg = rd.gather(plan)  # the loop hands over to the clients one by one: each says why
    assert type(rd.collector) is OneByOne
    assert agg.participants == 0 and sorted(agg.errors) == rd.cids
    assert agg.errors["c0"] == (
        "ValueError: client 'c0': a round with 1 extra point(s) needs full passes (E-step mode "
        "'full', got 'batch'): a mini-batch or SPIDER statistic is not the EM map at a point; "
        "drop batch_size/variance_reduction or the extra points")


@pytest.mark.parametrize("batched", [False, True], ids=["one-by-one", "batched"])
def test_points_are_refused_in_the_initialization_round(batched):
    rd = _rounds(_gmm_fd(), "gmm", fl.Federation(disclosure=OFF), batched=batched)
    with pytest.raises(fl.engine.FederatedFitError, match=re.escape(
            "clients ['c0', 'c1', 'c2', 'c3', 'c4', 'c5'] did not answer the initialization "
            "round validly (every client must): client "
            "'c0': ValueError: client 'c0': a round with 1 extra point(s) is not available in "
            "the initialization round (no S_hat yet, the statistics are sent as they are): "
            "send points from the next round on; client 'c1': ValueError: client 'c1'")):
        rd.gather(_points_of(rd, 1, 1))


def test_a_sites_saturation_floor_counts_every_point_whatever_the_server_sets():
    """GMM K = 2, d = 2: 12 free numbers a statistic; 40 rows of 2 values admit 26.4 under the
    site's default rule: 2 statistics a reply pass, 3 do not, whatever the round message asks
    (a server that sends a looser rule has the sites' announced floor adopted at setup)."""
    from fedlatent.engine.site.policy import SitePolicy

    looser = fl.Federation(disclosure=fl.DisclosurePolicy(max_parameters_per_record=1.0))
    rd = _rounds(_fixed_fd(40), "gmm", looser, policies=SitePolicy())
    assert rd.runtime.nodes["c0"].disclosure.max_parameters_per_record == 0.33
    assert type(rd.collector) is OneByOne  # the sites' own policies: one by one
    _advance(rd, 2)
    one = rd.gather(_points_of(rd, 3, 1))
    assert one.participants == 6 and len(one.points) == 1 and not one.errors
    two = rd.gather(_points_of(rd, 4, 2))
    assert two.participants == 0 and two.points == [] and sorted(two.errors) == rd.cids
    assert two.errors["c2"] == (
        "DisclosureRefused: client 'c2': a reply of 3 statistics (the round's and 2 extra "
        "points) carries 36 free numbers about 40 record(s) of 2 value(s), more than "
        "max_parameters_per_record=0.33 per value (DataSHIELD nfilter.glm): the records could "
        "be solved for, so it is not sent. Merge sites to at least 55 records, use "
        "Federation(secure_aggregation=True) (the rule then covers a cohort's records) or "
        "differential privacy (Federation(privacy=...)), or fit fewer numbers (fewer "
        "components or features, covariance_type='diag'); DisclosurePolicy.off() disables "
        "every rule. Each extra point is one more statistic of 12 numbers; this client admits "
        "2 a reply: ask at most 1 extra point(s) a round (Federation(acceleration=None): none)")


def test_the_benchmarks_smallest_clients_take_three_points_under_the_default_rule():
    """GMM K = 4, d = 5: 84 free numbers a statistic; 161 rows of 5 values admit 265.65: 3
    statistics (252) pass, 4 (336) do not, in the batched path as in the clients' own."""
    rd = _rounds(_fixed_fd(161, d=5, n_clients=3), "gmm4", fl.Federation())
    assert type(rd.collector) is Batched
    _advance(rd, 2)
    agg = rd.gather(_points_of(rd, 3, 2))
    assert type(rd.collector) is Batched and agg.participants == 3 and len(agg.points) == 2
    with pytest.raises(NotImplementedError, match=re.escape(
            "client 'c0': a reply of 4 statistics carries 336 free numbers about 161 record(s) "
            "of 5 value(s)")):
        Batched(rd).gather(_points_of(rd, 4, 3))
    agg = rd.gather(_points_of(rd, 4, 3))
    assert type(rd.collector) is OneByOne and agg.participants == 0
    assert agg.errors["c1"].startswith(
        "DisclosureRefused: client 'c1': a reply of 4 statistics (the round's and 3 extra "
        "points) carries 336 free numbers about 161 record(s) of 5 value(s)")
    assert agg.errors["c1"].endswith("this client admits 3 a reply: ask at most 2 extra "
                                     "point(s) a round (Federation(acceleration=None): none)")


def _set(rep_or_rows, template, block, index, value, row):
    """Entry ``index`` of block ``block`` in row ``row`` of flattened statistics."""
    lo = 0
    for key, v in template.items():
        if key == block:
            rep_or_rows[row, lo + int(np.ravel_multi_index(index, v.shape))] = value
            return
        lo += v.size
    raise KeyError(block)


REASONS = {  # the same words from either collector (one screen)
    "negative count": "extra point 1: count 'nk' is negative (-170 at index 0)",
    "non-PSD moment": "extra point 2: the moment matrix [[sum q, sum q x], [sum q x, sum q x "
                      "x^T]] of component 0 is not positive semi-definite (second moments "
                      "inconsistent with the first: no data give these sums)"}
LIES = {  # (point, block, entry, value): a negative count, a non-PSD second moment
    "negative count": (1, "nk", (0,), -5.0),
    "non-PSD moment": (2, "sxx", (0, 0, 1), 1e3),
}


def _lie(rd, point, block, index, value, victim="c3"):
    """The victim's reply at extra point ``point`` made impossible, after its step."""
    if isinstance(rd.collector, Batched):
        call = rd.runtime.call_batched

        def lying(method, idx, msg, resets=None):
            rep = call(method, idx, msg, resets)
            row = int(np.flatnonzero(rep.clients == rd.cids.index(victim))[0])
            for ix in {index, index[:-2] + index[-2:][::-1]} if block == "sxx" else {index}:
                _set(rep.points[point - 1][0], rep.template, block, ix, value, row)
            return rep
        rd.runtime.call_batched = lying
        return
    call = rd.runtime.call

    def lying(ids, method, msgs):
        reps = call(ids, method, msgs)
        if method != "estep":
            return reps
        key = f"point{point}/{block}"
        if value is None:
            del reps[victim][key]
            return reps
        a = np.array(reps[victim][key], dtype=float)
        a[index] = value
        if block == "sxx":
            a[index[:-2] + index[-2:][::-1]] = value
        reps[victim][key] = a
        return reps
    rd.runtime.call = lying


@pytest.mark.parametrize("lie", list(LIES))
@pytest.mark.parametrize("name", list(COLLECTORS))
def test_a_client_lying_in_one_point_is_refused_whole(name, lie):
    cls, batched, extra = COLLECTORS[name]
    fed = fl.Federation(disclosure=OFF, **extra)
    rd = _rounds(_gmm_fd(), "gmm", fed, batched)
    xs = _advance(rd, 3)[:2]
    _lie(rd, *LIES[lie])
    agg = rd.collector.gather(_plan(rd, 4, xs))
    assert list(agg.rejected) == ["c3"] and agg.participants == 5
    assert agg.rejected["c3"] == REASONS[lie]
    kept = [c for c in rd.cids if c != "c3"]
    assert_close(agg.accepted.mask, np.array([c != "c3" for c in rd.cids]))
    for (S_j, _), x in zip(agg.points, xs):
        theta = rd.model.server_step(x, rd.params, rd.n_total)
        msg = {"seed": int(rd.opt.seed), "round": 4, **pack("params", theta)}
        reps = rd.runtime.call(kept, "evaluate", {c: msg for c in kept})
        for key in S_j:
            assert_close(S_j[key], sum(rd.weights[c] * reps[c][f"delta/{key}"] for c in kept))


def test_a_reply_missing_a_point_block_is_refused_whole():
    rd = _rounds(_gmm_fd(), "gmm", fl.Federation(disclosure=OFF), batched=False)
    xs = _advance(rd, 3)[:2]
    _lie(rd, 2, "sxx", (), None)
    agg = rd.collector.gather(_plan(rd, 4, xs))
    assert list(agg.rejected) == ["c3"] and agg.participants == 5
    assert agg.rejected["c3"] == "extra point 2: missing statistic(s) ['sxx']"


@pytest.mark.parametrize("batched", [False, True], ids=["one-by-one", "batched"])
def test_a_client_state_follows_the_rounds_own_statistic_not_the_points(batched):
    """FedGMM's clients keep their own mixing weights, which a step advances: each point is
    evaluated from the state the round started from, and the state after the round is the
    one a round without points leaves."""
    fed = fl.Federation(disclosure=OFF)
    rd = _rounds(_fedgmm_fd(), "fedgmm", fed, batched)
    plain = _rounds(_fedgmm_fd(), "fedgmm", fed, batched)
    xs = _advance(rd, 3)[:2]
    _advance(plain, 3)
    thetas = [rd.model.server_step(x, rd.params, rd.n_total) for x in xs]
    before = [_evaluated(rd, 4, theta) for theta in thetas]  # no state change
    pi0 = rd.runtime.get_client_states()["c0"]["model/pi"]
    agg = rd.collector.gather(_plan(rd, 4, xs))
    ref = plain.collector.gather(plain.plan(4))
    for key in ref.total:
        assert_close(agg.total[key], ref.total[key])
    assert len(agg.points) == 2
    for (S_j, obj_j), (want, obj) in zip(agg.points, before):
        for key in want:
            assert_close(S_j[key], want[key])
        assert_close(obj_j, obj)
    after, ref_after = rd.runtime.get_client_states(), plain.runtime.get_client_states()
    assert not np.allclose(after["c0"]["model/pi"], pi0)  # the round moved it
    for c in rd.cids:
        assert set(after[c]) == set(ref_after[c])
        for key in after[c]:
            assert_close(after[c][key], ref_after[c][key])


def test_secure_aggregation_checks_each_points_sum_and_names_the_liar():
    """Under secure aggregation one masked vector carries the points: a client whose point 1
    holds a negative count makes the aggregate impossible; the round is discarded and group
    testing (the clients replay their reply, points included) names it."""
    fed = fl.Federation(disclosure=OFF, secure_aggregation=True, verified=False)
    rd = _rounds(_gmm_fd(n_clients=9), "gmm", fed)
    xs = _advance(rd, 3)[:2]
    node = rd.runtime.nodes["c3"]
    answer = node._answer

    def lying(method, msg):
        reply = answer(method, msg)
        if method == "estep" and "point1/nk" in reply:
            reply["point1/nk"] = reply["point1/nk"] - 5.0
        return reply
    node._answer = lying
    agg = rd.collector.gather(_plan(rd, 4, xs))
    assert agg.total is None and agg.points == []
    assert agg.skipped == (
        "round 4: the aggregate of clients ['c0', 'c1', 'c2', 'c3', 'c4', 'c5', 'c6', 'c7', "
        "'c8'] breaks the model's invariants at extra point 1: count 'nk' is negative "
        "(-0.999878 at index 1); client 'c3' sent it (located by 4 group tests over "
        "sub-cohorts of at least 5 clients); excluded from now on; discarded, the parameters "
        "of round 3 kept")
    assert rd.secure.excluded == {"c3": "round 4 (its reply broke the checks)"}


def test_secure_bytes_up_carry_the_points():
    """Each point adds its statistic and its objective's two limbs to every masked reply (one
    exchange: the reveal's bytes are the same)."""
    fed = fl.Federation(disclosure=OFF, secure_aggregation=True, verified=False)
    rd, plain = _rounds(_gmm_fd(), "gmm", fed), _rounds(_gmm_fd(), "gmm", fed)
    xs = _advance(rd, 2)
    _advance(plain, 2)
    agg = rd.collector.gather(_plan(rd, 3, xs))
    ref = plain.collector.gather(plain.plan(3))
    assert agg.participants == ref.participants == 6
    keys = ["point1/nk", "point1/sx", "point1/sxx", "objective1/hi", "objective1/lo"]
    per_point = 8 * (2 + 4 + 8 + 1 + 1) + sum(map(len, keys))  # masked entries, their keys
    assert agg.bytes_up - ref.bytes_up == 6 * 2 * per_point


@pytest.mark.flower
def test_the_round_message_and_reply_with_points_cross_flowers_records():
    """What a Flower runtime carries: the round message's ``points`` and ``params{j}/``, the
    reply's ``point{j}/`` and ``objective{j}``, unchanged through the records' codec."""
    pytest.importorskip("flwr")
    from fedlatent.runtime.flower_records import decode, encode

    rd = _rounds(_gmm_fd(), "gmm", fl.Federation(disclosure=OFF), batched=False)
    xs = _advance(rd, 2)
    plan = _plan(rd, 3, xs)
    msg = decode(encode(plan.msg))
    reply = rd.runtime.nodes["c0"].handle("estep", msg)
    back = decode(encode(reply))
    assert msg["points"] == 2 and {k for k in msg if k.startswith("params2/")}
    assert {k for k in back if k.startswith("point")} == {
        f"point{j}/{b}" for j in (1, 2) for b in ("nk", "sx", "sxx")}
    for sent, got in ((plan.msg, msg), (reply, back)):
        assert set(got) == set(sent)
        for key, v in sent.items():  # a codec: the same bits, not a computation
            assert_same(np.asarray(got[key]), np.asarray(v))


def test_a_site_may_cap_the_points_of_a_round_by_its_own_policy():
    from fedlatent.engine.site.policy import SitePolicy

    assert SitePolicy.from_dict({"limits": {"max-points": 0}}).max_points == 0
    with pytest.raises(ValueError, match=re.escape(
            "site policy: limits.max-points must be an integer >= 0, got -1")):
        SitePolicy.from_dict({"limits": {"max-points": -1}})
    rd = _rounds(_fixed_fd(100), "gmm", fl.Federation(), policies=SitePolicy(max_points=1))
    _advance(rd, 2)
    one = rd.gather(_points_of(rd, 3, 1))
    assert one.participants == 6 and len(one.points) == 1
    two = rd.gather(_points_of(rd, 4, 2))
    assert two.participants == 0 and sorted(two.errors) == rd.cids
    assert two.errors["c4"] == (
        "site 'c4' refused (limits.max-points): round 4 asks 2 extra point(s), above its "
        "limit 1; fix: ask at most 1 extra point(s) a round (Federation(acceleration=None) "
        "asks none)")


def test_the_batched_and_per_client_points_agree_under_partial_participation():
    """A drawn subset of the clients, control variates and a quantizer on the round's own
    statistic: the points stay raw means, the same from either path."""
    fed = fl.Federation(disclosure=OFF, participation=0.6, step_size=0.5,
                        control_variates=True, quantizer=fl.Quantizer(4))
    ones = _rounds(_gmm_fd(n_clients=8), "gmm", fed, batched=False)
    many = _rounds(_gmm_fd(n_clients=8), "gmm", fed, batched=True)
    xs = _advance(ones, 3)[1:]
    _advance(many, 3)
    a = ones.collector.gather(_plan(ones, 4, xs))
    b = many.collector.gather(_plan(many, 4, xs))
    assert type(many.collector) is Batched and 0 < a.participants == b.participants < 8
    for (Sa, oa), (Sb, ob) in zip(a.points, b.points, strict=True):
        for key in Sa:
            assert_close(Sb[key], Sa[key])
        assert_close(ob, oa)
    drawn = [ones.cids[i] for i in _plan(ones, 4, xs).idx]
    theta = ones.model.server_step(xs[0], ones.params, ones.n_total)
    msg = {"seed": int(ones.opt.seed), "round": 4, **pack("params", theta)}
    reps = ones.runtime.call(drawn, "evaluate", {c: msg for c in drawn})
    for key in a.points[0][0]:
        assert_close(a.points[0][0][key], sum(ones.weights[c] * reps[c][f"delta/{key}"]
                                              for c in drawn))
