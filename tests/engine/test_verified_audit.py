"""Verified rounds attacked by a server that does not follow the protocol (issue 38's audit):
each test mounts one deviation against real ``ClientNode`` objects with the defaults (secure
aggregation, verified rounds) and asserts what a verifying site must do. A test marked
``xfail(strict=True)`` shows a hole still open: it asserts the refusal
the site owes and fails until the hole is closed (then the marker must go). The others document
a defence that holds against a meaningful attack.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.engine.faults import FederatedFitError
from fedlatent.engine.protocol.messages import ERROR_KEY
from fedlatent.engine.secagg import secure as secure_mod
from fedlatent.engine.secagg import secure_checks
from fedlatent.engine.transport.inprocess import InProcessRuntime
from tolerance import assert_close
from verified_doubles import CvInit, claim_failure, probing_start, rows_near, six_sites

pytest.importorskip("cryptography")

AT, ROUNDS = 3, 5  # the round the server deviates in


def _gmm(max_rounds=ROUNDS, **kw):
    fed = kw.pop("federation", None) or fl.Federation(secure_aggregation=True)
    return fl.FederatedGaussianMixture(n_components=3, n_init=1, tol=0.0, max_rounds=max_rounds,
                                       random_state=0, federation=fed, **kw)


def _fit(est, fd, runtime):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return est.fit(fd, runtime=runtime)


def _round_of(msg):
    return int(np.asarray(msg.get("secagg/round", msg.get("round", -1))).reshape(-1)[0])


# ---- group tests on demand: one site's reply unmasked --------------------------------------
class _Recorder:
    """Each client's unmasked reply of round ``at`` (as ``answer_secure`` returns it) and the
    decoded sum of every secure exchange of round ``at`` (``(exchange, survivors, sums)``)."""

    def __init__(self, monkeypatch, at=AT):
        self.replies, self.sums, self.s_hat = {}, [], {}
        answer, total = secure_checks.answer_secure, secure_mod.SecureChannel.sum
        rec = self

        def answer_secure(node, method, msg):
            out = answer(node, method, msg)
            if method == "estep" and int(msg["round"]) == at and "secagg/replay" not in msg:
                rec.s_hat[node.client_id] = {k[6:]: np.array(v) for k, v in msg.items()
                                             if k.startswith("S_hat/")}  # (as subtracted)
                rec.center = np.array(msg["params/center"])  # (GMM's sums are about it)
            if method == "estep" and int(msg["round"]) == at and "secagg/replay" in msg:
                w = float(msg["secagg/weight"])  # (Q_c + V_c, a group test's, as summed)
                rec.replies[node.client_id] = {k: w * np.asarray(v) for k, v in out.items()
                                               if k.startswith("delta/")}
            return out

        def summed(channel, method, msgs, *, round, exchange, weights=None):
            res = total(channel, method, msgs, round=round, exchange=exchange, weights=weights)
            if method == "estep" and int(round) == at:
                rec.sums.append((exchange, list(res["survivors"]), res["sums"]))
            return res

        monkeypatch.setattr(secure_checks, "answer_secure", answer_secure)
        monkeypatch.setattr(secure_mod.SecureChannel, "sum", summed)


def _claims_a_failure(monkeypatch, at=AT):
    """The server says round ``at``'s honest aggregate broke the model's invariants (it did
    not: nothing lets a site tell), then runs the group tests of its choosing: the survivors
    but the first, and but the first two (both at least the threshold), whose sums differ by
    the second survivor's reply."""
    claim_failure(monkeypatch, at)

    def locate(rounds, plan, S):
        secure_checks._test(rounds, plan, list(S[1:]), 1)
        secure_checks._test(rounds, plan, list(S[2:]), 2)
        return None, "two group tests of the server's choosing"

    monkeypatch.setattr(secure_checks, "locate", locate)


def _isolated(rec):
    """``{client: its reply}`` the server rebuilds as the difference of two group tests'
    sums whose cohorts differ by that client alone (none: no exchange of the round summed)."""
    if not rec.sums:
        return {}
    (name, _, _), *tests = rec.sums
    assert name == "estep"
    out = {}
    for _, S1, big in tests:
        for _, S2, small in tests:
            extra = sorted(set(S1) - set(S2))
            if len(extra) == 1 and set(S2) <= set(S1):
                out[extra[0]] = {k: np.asarray(big[k]) - np.asarray(small[k]) for k in big
                                 if k.startswith("delta/")}
    return out


def test_the_server_rebuilds_one_sites_reply_when_it_claims_a_failure(monkeypatch):
    """The harness (unverified secure aggregation): a round whose aggregate the server says
    failed is group-tested over sub-cohorts of its choosing; two of them that differ by one
    client give that client's reply of the round (its statistics, weighted), to the fixed
    point's rounding."""
    fd = six_sites(3.0)
    rec = _Recorder(monkeypatch)
    _claims_a_failure(monkeypatch)
    est = _fit(_gmm(federation=fl.Federation(secure_aggregation=True, verified=False)), fd,
               InProcessRuntime(fd))
    assert est.history_[AT - 1].skipped
    got = _isolated(rec)
    assert got  # at least one client's reply stands alone
    for c, fields in got.items():
        assert fields.keys() == rec.replies[c].keys()
        for k, v in fields.items():  # (to the fixed point's rounding)
            assert_close(v, rec.replies[c][k], rtol=1e-6,  # (each sum to the fixed point's
                         err_msg=f"{c} {k}")  # rounding: the difference is the reply's)


def test_a_server_claiming_a_failure_gets_no_single_sites_reply(monkeypatch):
    """Verified, the same server (on the code before: every site answers both group tests,
    one site's reply comes back whole). A verifying site takes part in a group test only for
    a round whose failure it can check (its transcript): a server that claims an honest
    aggregate failed must not learn one site's reply from two of its sub-cohort sums
    (tests/engine/test_verified_group_tests.py: each refusal's reason)."""
    fd = six_sites(3.0)
    rec = _Recorder(monkeypatch)
    _claims_a_failure(monkeypatch)
    try:
        _fit(_gmm(), fd, InProcessRuntime(fd))
    except FederatedFitError:
        pass  # (a refusal that stops the fit is a defence too)
    assert not _isolated(rec)


# ---- the control variate a server resets: S_hat steered through the replies ----------------
class Steering(InProcessRuntime):
    """A server that adds to round ``at``'s E-step messages ``control_variates=True``,
    ``alpha=0`` and ``V_reset/...`` = ``-shift`` (the same at every site): each site's reply
    becomes ``S_c - S_hat + shift``, so the verified aggregate, and with it the ``S_hat`` every
    site replays, moves by ``shift``. ``shift`` moves component 0's mean by ``move`` (its
    covariance kept), computed from the server's ``S_hat`` of the round."""

    def __init__(self, fd, move=(3.0, 0.0), at=AT, **kw):
        super().__init__(fd, **kw)
        self.move, self.at, self.sent = np.asarray(move, dtype=np.float64), at, []

    def call(self, client_ids, method, messages):
        if method == "estep" and any(m.get("secagg/exchange") == "estep"
                                     and "secagg/replay" not in m
                                     and _round_of(m) == self.at for m in messages.values()):
            messages = {c: self._steer(dict(m)) for c, m in messages.items()}
        return super().call(client_ids, method, messages)

    def _steer(self, msg):
        S = self.server_s_hat
        nk, sx, sxx = S["nk"], S["sx"], S["sxx"]
        m = sx[0] / nk[0]
        m2 = m + self.move
        shift = {"nk": np.zeros_like(nk), "sx": np.zeros_like(sx), "sxx": np.zeros_like(sxx)}
        shift["sx"][0] = nk[0] * self.move
        shift["sxx"][0] = nk[0] * (np.outer(m2, m2) - np.outer(m, m))
        msg.update({"control_variates": True, "alpha": 0.0})
        msg.update({f"V_reset/{k}": -v for k, v in shift.items()})
        self.sent.append(msg)
        return msg


def _server_s_hat(monkeypatch, rt):
    """Give ``rt`` the server's ``S_hat`` as it advances (what the honest server holds)."""
    from fedlatent.engine.fedem.update import FedEMState

    advance = FedEMState.advance

    def spy(self, *a, **kw):
        new = advance(self, *a, **kw)
        rt.server_s_hat = {k: np.array(v) for k, v in new.S_hat.to_dict().items()}
        return new

    monkeypatch.setattr(FedEMState, "advance", spy)


def _means_evaluated(rt, fd, rnd):
    """The means every site evaluated in round ``rnd`` (recorded messages, down)."""
    out = [np.asarray(m["params/means"]) for d, c, meth, m in rt.log
           if d == "down" and meth == "estep" and m.get("secagg/exchange") == "estep"
           and "secagg/replay" not in m and _round_of(m) == rnd]
    assert len(out) == len(fd.client_ids)
    return out


def test_the_steered_aggregate_moves_the_parameters_when_nobody_verifies(monkeypatch):
    """The harness: unverified, the reset control variates move component 0's mean by the
    server's ``move`` in the next round, and the fit goes on."""
    fd = six_sites(3.0)
    honest = InProcessRuntime(fd, record=True)
    _fit(_gmm(federation=fl.Federation(secure_aggregation=True, verified=False)), fd, honest)
    rt = Steering(fd, record=True)
    _server_s_hat(monkeypatch, rt)
    _fit(_gmm(federation=fl.Federation(secure_aggregation=True, verified=False)), fd, rt)
    moved = _means_evaluated(rt, fd, AT + 1)[0] - _means_evaluated(honest, fd, AT + 1)[0]
    assert np.max(np.abs(moved[0] - rt.move)) < 0.3  # (S_c moved on since the round before)


def test_a_verifying_site_refuses_a_reset_control_variate_it_cannot_replay(monkeypatch):
    """Verified, the same server: every site replays ``S_hat`` from the aggregate its own
    steered reply is in, so the moved parameters pass the replay (on the code before: means
    moved by 3.03, every site answering). A site must refuse the round that resets its
    control variate or turns control variates on against the setup's federation: the round
    after evaluates the honest means, or the fit stops at the steered round."""
    fd = six_sites(3.0)
    honest = InProcessRuntime(fd, record=True)
    _fit(_gmm(), fd, honest)
    rt = Steering(fd, record=True)
    _server_s_hat(monkeypatch, rt)
    try:
        _fit(_gmm(), fd, rt)
    except FederatedFitError as err:
        assert err.round == AT, str(err)
        return
    assert rt.sent  # the steered round was sent and answered
    for got in _means_evaluated(rt, fd, AT + 1):
        assert_close(got, _means_evaluated(honest, fd, AT + 1)[0], rtol=1e-8)


# ---- a mini-batch of one in a fit set up with full passes ----------------------------------
class BatchOfOne(InProcessRuntime):
    """A server that sends round ``at``'s E-step as ``mode="batch"``, ``batch_size=1`` (the
    fit was set up with full passes): each site's reply is the statistic of one record."""

    def __init__(self, fd, at=AT, **kw):
        super().__init__(fd, **kw)
        self.at = at

    def call(self, client_ids, method, messages):
        if method == "estep" and any(m.get("secagg/exchange") == "estep"
                                     and _round_of(m) == self.at for m in messages.values()):
            messages = {c: {**m, "mode": "batch", "batch_size": 1} for c, m in messages.items()}
        return super().call(client_ids, method, messages)


def _records_rebuilt(rec, fd):
    """The records the server reads off the isolated replies of a batch-of-one round: each
    isolated reply is ``w_c (S_c - S_hat)`` (no control variates), ``S_c`` one record's
    statistic about the parameters' centre, so the record is the centre plus ``sum_k sx_k /
    sum_k nk_k``; those equal, to 1e-6, to a row of that client's data."""
    out = []
    for c, fields in _isolated(rec).items():
        w, s_hat = 1.0 / len(fd.client_ids), rec.s_hat[c]  # (six sites of 100 rows)
        nk = fields["delta/nk"] / w + s_hat["nk"]
        sx = fields["delta/sx"] / w + s_hat["sx"]
        x = rec.center + sx.sum(axis=0) / nk.sum()
        rows = np.asarray(fd[c].X)
        if np.min(np.max(np.abs(rows - x), axis=1)) < 1e-6:
            out.append((c, x))
    return out


def test_a_batch_of_one_and_a_claimed_failure_rebuild_a_record_unverified(monkeypatch):
    """The harness (unverified secure aggregation): a batch of one, then group tests on a
    claimed failure: one site's one record comes back exactly."""
    fd = six_sites(3.0)
    rec = _Recorder(monkeypatch)
    _claims_a_failure(monkeypatch)
    _fit(_gmm(federation=fl.Federation(secure_aggregation=True, verified=False)), fd,
         BatchOfOne(fd))
    got = _records_rebuilt(rec, fd)
    assert len(got) == 1


def test_a_verifying_site_refuses_a_batch_of_one_in_a_full_pass_fit(monkeypatch):
    """Verified, the same server: a site must refuse an E-step in another mode than its
    setup's federation (full passes) before it computes anything; on the code before, every
    site answers the batch of one and the claimed failure's group tests give one record."""
    fd = six_sites(3.0)
    rec = _Recorder(monkeypatch)
    _claims_a_failure(monkeypatch)
    rt = BatchOfOne(fd, record=True)
    try:
        _fit(_gmm(), fd, rt)
    except FederatedFitError as err:
        assert err.round == AT, str(err)
    assert not _records_rebuilt(rec, fd)


# ---- cv_init: the control variates' start from an S_hat the server chooses -----------------
# (the server: verified_doubles.CvInit)


def _moved_unverified(monkeypatch, runtime, rnd):
    """``(runtime, moved)``: an unverified fit on ``runtime`` (the server's own invariant
    check off: it is the one cheating) and how far its round-``rnd`` means are from an honest
    fit's."""
    monkeypatch.setattr(secure_checks, "_rebuilt", lambda *a, **kw: None)
    fd = six_sites(3.0)
    unverified = fl.Federation(secure_aggregation=True, verified=False)
    honest = InProcessRuntime(fd, record=True)
    _fit(_gmm(federation=unverified), fd, honest)
    rt = runtime(fd, record=True)
    _fit(_gmm(federation=unverified), fd, rt)
    return rt, _means_evaluated(rt, fd, rnd)[0] - _means_evaluated(honest, fd, rnd)[0]


def test_a_crafted_cv_init_moves_the_means_when_nobody_verifies(monkeypatch):
    """The harness (unverified): round 3's means move by the server's ``move``."""
    rt, moved = _moved_unverified(monkeypatch, CvInit, 3)
    assert np.max(np.abs(moved[0] + rt.move)) < 0.05  # (sx moved by -nk_0 move: the mean
    # by -move, give or take the covariance's pull on the round's responsibilities)


def test_a_verifying_site_refuses_a_cv_init_whose_s_hat_is_not_its_replay(monkeypatch):
    """Verified, the same server (on the code before: every site answers, round 3's means
    moved by -3.01, later rounds' by -1e10): every site checks ``cv_init``'s ``S_hat`` against
    the one it replayed from the initialization round's verified aggregate and refuses round
    2, before any reply computed from it leaves, naming cv_init and the field moved."""
    monkeypatch.setattr(secure_checks, "_rebuilt", lambda *a, **kw: None)
    fd = six_sites(3.0)
    rt = CvInit(fd, record=True)
    with pytest.raises(FederatedFitError) as err:
        _fit(_gmm(), fd, rt)
    assert err.value.round == 2, str(err.value)
    refusals = [str(r[ERROR_KEY]) for d, c, meth, r in rt.log
                if d == "up" and meth == "estep" and ERROR_KEY in r]
    assert len(refusals) == len(fd.client_ids)
    assert all("cv_init" in s and "'sx'" in s for s in refusals), refusals


# ---- the start's queries: answered before anything of them can be checked -----------------
def test_a_verifying_site_answers_only_the_replayed_starts_queries(monkeypatch):
    """Every site on the library's default policy (no public starts), verified rounds: 20
    crafted hard-assignment queries before the honest start (on the code before: all
    answered, 5 rows of the federation rebuilt to 1e-9; the fit stops only later). A site
    must answer a start's query only if it is the one the replayed start asks next (the
    committed seed and the verified sums before it), so no crafted query is summed."""
    from fedlatent.engine.site.policy import SitePolicy

    fd = six_sites(3.0)
    rows = probing_start(monkeypatch, 20)
    try:
        _fit(_gmm(max_rounds=30), fd, InProcessRuntime(fd, policies=SitePolicy()))
    except FederatedFitError:
        pass  # (refused: the defence; or stopped after the probes: the hole)
    assert not rows_near(rows, fd, 1e-6)


# ---- an S_hat in the initialization round ---------------------------------------------------
class FirstShat(InProcessRuntime):
    """A server that adds ``S_hat/...`` to the first E-step round's messages (it has none: the
    round's statistic is sent whole): each site replies ``S_c - S_hat``, and the aggregate,
    which every site takes as the round's ``S_hat``, moves by ``-S_hat`` (here component 0's
    ``sx`` by ``-(1, 0)``: its mean by about ``1 / nk_0``)."""

    def __init__(self, fd, **kw):
        super().__init__(fd, **kw)
        self.sent = []

    def call(self, client_ids, method, messages):
        if method == "estep" and any(m.get("secagg/exchange") == "estep"
                                     and _round_of(m) == 1 for m in messages.values()):
            messages = {c: self._add(dict(m)) for c, m in messages.items()}
        return super().call(client_ids, method, messages)

    def _add(self, msg):
        K, d = np.shape(msg["params/means"])
        sx = np.zeros((K, d))
        sx[0, 0] = -1.0
        msg.update({"S_hat/nk": np.zeros(K), "S_hat/sx": sx, "S_hat/sxx": np.zeros((K, d, d))})
        self.sent.append(msg)
        return msg


def test_an_s_hat_in_the_first_round_moves_the_means_when_nobody_verifies(monkeypatch):
    """The harness (unverified): round 2's first mean moves by more than 1."""
    _, moved = _moved_unverified(monkeypatch, FirstShat, 2)
    assert moved[0, 0] > 1.0


def test_a_verifying_site_refuses_an_s_hat_in_the_first_round(monkeypatch):
    """Verified, the same server (on the code before: every site answers, round 2's first
    mean moved by 2.81): the first round must be refused, or round 2 evaluate the honest
    means."""
    monkeypatch.setattr(secure_checks, "_rebuilt", lambda *a, **kw: None)
    fd = six_sites(3.0)
    honest = InProcessRuntime(fd, record=True)
    _fit(_gmm(), fd, honest)
    rt = FirstShat(fd, record=True)
    try:
        _fit(_gmm(), fd, rt)
    except FederatedFitError as err:
        assert err.round == 1, str(err)
        return
    for got in _means_evaluated(rt, fd, 2):
        assert_close(got, _means_evaluated(honest, fd, 2)[0], rtol=1e-8)


def test_a_query_marked_as_a_group_test_is_not_answered_unchecked(monkeypatch):
    """The crafted start queries of the test above, each marked ``secagg/replay`` (a group
    test's mark: only a round's remembered E-step reply is re-sent under it): on the code
    before, every site answers them without any check (no transcript, no seed, no start
    replay) and the differenced cells give rows. A site must refuse a group-test mark on
    anything but an E-step of the round whose reply it holds."""
    from fedlatent.engine.site.policy import SitePolicy
    from fedlatent.models.gmm import init as gmm_init

    fd = six_sites(3.0)
    rows = probing_start(monkeypatch, 20)
    probing = gmm_init._hard_sums

    def marked(ctx, centers, center, ct, what, second=True):
        summed = gmm_init._summed

        def with_mark(ctx, query, payload, *a, **kw):
            return summed(ctx, query, {**payload, "secagg/replay": 1}, *a, **kw)

        gmm_init._summed = with_mark  # (the probes only: the honest call comes after)
        try:
            return probing(ctx, centers, center, ct, what, second)
        finally:
            gmm_init._summed = summed

    monkeypatch.setattr(gmm_init, "_hard_sums", marked)
    try:
        _fit(_gmm(max_rounds=30), fd, InProcessRuntime(fd, policies=SitePolicy()))
    except FederatedFitError:
        pass
    assert not rows_near(rows, fd, 1e-6)
