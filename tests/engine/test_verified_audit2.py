"""Verified rounds attacked by a server that does not follow the protocol, second audit
(issue 38): each test mounts one deviation against real ``ClientNode`` objects holding a
site's own policy (``SitePolicy()``; ``public_starts=True`` where the start is not what is
attacked) and asserts what the site must do. Each hole found is
closed; where a test has a control, it shows the attack works where nothing stops it.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.engine.faults import FederatedFitError
from fedlatent.engine.protocol.messages import ERROR_KEY, pack
from fedlatent.engine.site.policy import SitePolicy
from fedlatent.engine.transport.inprocess import InProcessRuntime
from verified_doubles import CvInit, probing_start, rows_near, six_sites

pytest.importorskip("cryptography")


def _gmm(federation, max_rounds=3):
    return fl.FederatedGaussianMixture(n_components=3, n_init=1, tol=0.0, max_rounds=max_rounds,
                                       random_state=0, federation=federation)


def _fit(est, fd, runtime):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            est.fit(fd, runtime=runtime)
        except (FederatedFitError, ValueError):  # (a refusal that stops the fit is a defence;
            pass  # what was summed before counts. ValueError: a DP site raises on the honest
            # start's first-moment query, whose reply has no 'sxx' block to add noise to)


# ---- a differential privacy the server declares: the start's checks skipped -----------------
class DeclaresDP(InProcessRuntime):
    """A server whose setup message tells every site the fit is differentially private at an
    epsilon of 1e15 (noise about 1e-7 of a record's bound: none to speak of), over 200
    releases; the server itself goes on as for a fit without DP."""

    def call(self, client_ids, method, messages):
        if method == "setup":
            from fedlatent.engine.privacy.dp import DifferentialPrivacy

            dp = DifferentialPrivacy(epsilon=1e15, delta=0.5, clip=8.0, accountant="rdp")
            messages = {c: {**m, "privacy": json.dumps(dp.to_config()), "privacy_releases": 200}
                        for c, m in messages.items()}
        return super().call(client_ids, method, messages)


def test_a_declared_dp_does_not_stop_the_probing_start_unverified(monkeypatch):
    """The control (``verified=False``): the start's 12 crafted hard-assignment queries are
    summed through the declared noise, and rows of the federation come back to 1e-4."""
    pytest.importorskip("dp_accounting")
    fd = six_sites(3.0)
    rows = probing_start(monkeypatch, 12, moments=True)
    fed = fl.Federation(secure_aggregation=True, verified=False)
    _fit(_gmm(fed), fd, DeclaresDP(fd, policies=SitePolicy()))
    assert len(rows_near(rows, fd, 1e-4)) >= 2


def test_a_verifying_site_does_not_skip_its_start_checks_for_a_declared_dp(monkeypatch):
    """Verified (the default), a site on the library's default policy, a server that declares
    DP at epsilon 1e15 in the setup: on the code before, every site answers the 12 crafted
    queries (they are not the replayed start's: without the declared DP each is refused,
    tests/engine/test_verified_audit.py) and rows come back to 1e-4. A DP the site's policy
    does not bound (no max-epsilon) must not stand in for the start's replay."""
    pytest.importorskip("dp_accounting")
    fd = six_sites(3.0)
    rows = probing_start(monkeypatch, 12, moments=True)
    _fit(_gmm(fl.Federation(secure_aggregation=True)), fd, DeclaresDP(fd, policies=SitePolicy()))
    assert rows_near(rows, fd, 1e-4) == []


# ---- rounds numbered outside the site's max-rounds ------------------------------------------
class _Sender:
    """A server that sends each site of an in-process runtime whatever it likes."""

    def __init__(self, fd, policy):
        self.rt = InProcessRuntime(fd, batched=False, policies=policy)

    def send(self, method, msg):
        ids = list(self.rt.client_ids)
        return self.rt.call(ids, method, {c: dict(msg) for c in ids})

    def at(self, method, rnd, means):
        """``method`` (an E-step or an evaluation pass) of round ``rnd`` at two components
        whose means the server chooses."""
        from fedlatent.models.gmm.math import compute_precision_cholesky

        params = {"weights": np.full(2, 0.5), "means": np.asarray(means, dtype=np.float64),
                  "precisions_cholesky": compute_precision_cholesky(
                      np.repeat(np.eye(2)[None] * 2.0, 2, 0), "full"), "center": np.zeros(2)}
        return self.send(method, {"seed": 0, "round": rnd, "mode": "full",
                                  **pack("params", params)})


def _setup(server):
    from fedlatent.engine.privacy.enforce import policy_to_json
    from fedlatent.models.gmm.model import GMMModel

    replies = server.send("setup", {
        "model": "gmm", "model_config": json.dumps(GMMModel(2, "full", 1e-6).get_config()),
        "disclosure": policy_to_json(fl.DisclosurePolicy()), "run": "r1"})
    assert all(ERROR_KEY not in r for r in replies.values())


@pytest.mark.parametrize(("method", "rnd"), [("estep", 0), ("estep", -7), ("evaluate", 3),
                                             ("evaluate", -1)])
def test_max_rounds_bounds_every_round_a_site_computes(method, rnd):
    """A site whose policy says ``[limits] max-rounds = 2`` answers rounds 1 and 2 at
    parameters the server chose (a fit it does not verify), then nothing more: on the code
    before, an E-step numbered 0 or below, or an evaluation pass of any number (the same
    statistic at the server's parameters), was answered, as many as the server liked (one
    each per round number: the one-answer rule keys on it). Refused naming the rule."""
    fd = six_sites(3.0)
    server = _Sender(fd, SitePolicy(max_rounds=2))
    _setup(server)
    for k in (1, 2):
        assert all(ERROR_KEY not in r for r in server.at("estep", k, [[0, 0], [3, 0]]).values())
    replies = server.at(method, rnd, [[0, 0], [0.5, 3]])
    for c, r in replies.items():
        assert r.get(ERROR_KEY, "").startswith(f"site {c!r} refused (limits.max-rounds): "
                                               f"round {rnd} is "), r.get(ERROR_KEY, sorted(r))


# ---- a stricter disclosure told to every site but one ---------------------------------------
class QuietAllBut(InProcessRuntime):
    """A server whose setup tells every site but ``site`` a stricter disclosure than the
    federation's (``count_scope="client"`` and a per-block floor of 10^9: each of their
    hard-assignment replies puts all its rows in one cell), which each accepts (stricter than
    its floor); ``site`` is told the federation's. Records each query exchange's revealed sum
    and every site's reply (``sums``, ``replies``: by exchange)."""

    def __init__(self, fd, monkeypatch, site="c0", **kw):
        from fedlatent.engine.secagg import secure as secure_mod
        from fedlatent.engine.secagg import secure_checks

        super().__init__(fd, policies=SitePolicy(), **kw)
        self.site, self.sums, self.replies = site, {}, {}
        answer, total, rt = secure_checks.answer_secure, secure_mod.SecureChannel.sum, self

        def answer_secure(node, method, msg):
            out = answer(node, method, msg)
            if method == "query":
                rt.replies.setdefault(msg["secagg/exchange"], {})[node.client_id] = out
            return out

        def summed(channel, method, msgs, *, round, exchange, weights=None):
            res = total(channel, method, msgs, round=round, exchange=exchange, weights=weights)
            if method == "query":
                rt.sums[exchange] = res["sums"]
            return res

        monkeypatch.setattr(secure_checks, "answer_secure", answer_secure)
        monkeypatch.setattr(secure_mod.SecureChannel, "sum", summed)

    def call(self, client_ids, method, messages):
        if method == "setup":
            from dataclasses import replace

            from fedlatent.engine.privacy.enforce import policy_from_json, policy_to_json

            def quiet(m):
                d = replace(policy_from_json(m["disclosure"]), count_scope="client",
                            min_records_per_block=10 ** 9)
                return {**m, "disclosure": policy_to_json(d)}

            messages = {c: m if c == self.site else quiet(m) for c, m in messages.items()}
        return super().call(client_ids, method, messages)


def _alone(rt):
    """The records of ``rt.site`` the server reads alone: in each revealed hard-assignment
    sum, the counts of the cells no other site's reply touches, where that sum's counts and
    first moments are the site's own reply's (checked)."""
    out = 0
    for exch, S in rt.sums.items():
        got = rt.replies.get(exch, {})
        if not exch.startswith("hard_stats") or rt.site not in got:
            continue
        others = sum(np.asarray(r["stat/nk"]) for c, r in got.items() if c != rt.site)
        cells = np.flatnonzero(others == 0)
        mine = got[rt.site]
        for k in ("stat/nk", "stat/sx"):  # (the revealed sum is the site's reply there)
            np.testing.assert_allclose(np.asarray(S[k])[cells], np.asarray(mine[k])[cells],
                                       atol=1e-6)
        out += int(round(float(np.sum(np.asarray(mine["stat/nk"])[cells]))))
    return out


def test_a_stricter_disclosure_told_to_all_sites_but_one_when_nobody_verifies(monkeypatch):
    """The control (``verified=False``): the revealed sums of the start's hard-assignment
    queries are the one site's reply in every cell the others leave empty (135 of its
    records over the three)."""
    fd = six_sites(3.0)
    rt = QuietAllBut(fd, monkeypatch)
    _fit(_gmm(fl.Federation(secure_aggregation=True, verified=False)), fd, rt)
    assert _alone(rt) >= 20


def test_a_verifying_site_binds_the_disclosure_it_was_told(monkeypatch):
    """Verified (the default), the same server: on the code before, every site answers and
    the sums revealed are one site's reply in the cells the others leave empty (135 of its
    records over the start's three hard-assignment sums, cell by cell: counts and sums). The
    disclosure a site was told must be bound as its setup is, so that the sites told another
    one stop the fit's first exchange before anything of it is revealed."""
    fd = six_sites(3.0)
    rt = QuietAllBut(fd, monkeypatch)
    _fit(_gmm(fl.Federation(secure_aggregation=True)), fd, rt)
    assert rt.sums == {}
    assert _alone(rt) == 0


# ---- cv_init twice: the S_hat checked is not the one the control variates started from -------
class CvInitTwice(CvInit):
    """A server that sends ``cv_init`` twice after the initialization round: first with an
    ``S_hat`` whose component 0 ``sx`` is moved by ``-nk_0 move`` (each site's control variate
    starts from it: ``V_c = S_c(theta_0) - S_hat``), then the honest one (a site holds no
    initialization statistic any more, so its control variate stays; the ``S_hat`` the next
    round checks is this one), numbered a round later (a site's ledger answers each question
    of a round once). Every later reply carries ``+nk_0 move`` more, and so do the
    aggregate and the ``S_hat`` each site replays from it: component 0's mean moves by
    ``move`` (the server's own invariant checks off: it is the one cheating)."""

    def __init__(self, fd, move=(3.0, 0.0), **kw):
        super().__init__(fd, move, policies=SitePolicy(public_starts=True), **kw)

    def call(self, client_ids, method, messages):
        if method != "cv_init":
            return super().call(client_ids, method, messages)
        super().call(client_ids, method, messages)  # (moved)
        return InProcessRuntime.call(self, client_ids, method, {  # the honest one, after it
            c: {**m, "round": int(np.ravel(m["round"])[0]) + 1}  # (the one-answer rule
            for c, m in messages.items()})  # keys on the round: another one)


def _round_means(rt, rnd):
    """The means each site was sent in round ``rnd``'s E-step (recorded messages, down)."""
    return [np.asarray(m["params/means"]) for d, c, meth, m in rt.log
            if d == "down" and meth == "estep" and m.get("secagg/exchange") == "estep"
            and "secagg/replay" not in m and int(np.ravel(m["round"])[0]) == rnd]


def _cv_fit(monkeypatch, runtime, verified=None):
    """``(runtime, round 3's means less an honest fit's)``: a fit with control variates (the
    server's own invariant checks off)."""
    from fedlatent.engine.secagg import secure_checks

    monkeypatch.setattr(secure_checks, "_rebuilt", lambda *a, **kw: None)
    fd = six_sites(3.0)
    fed = fl.Federation(secure_aggregation=True, control_variates=True, verified=verified)
    honest = InProcessRuntime(fd, record=True, policies=SitePolicy(public_starts=True))
    _fit(_gmm(fed, max_rounds=4), fd, honest)
    rt = runtime(fd, record=True)
    _fit(_gmm(fed, max_rounds=4), fd, rt)
    got = _round_means(rt, 3)
    return rt, [g - _round_means(honest, 3)[0] for g in got]


def test_cv_init_twice_moves_the_means_when_nobody_verifies(monkeypatch):
    """The control (``verified=False``): round 3's first mean moves by about ``-move``."""
    rt, moved = _cv_fit(monkeypatch, CvInitTwice, verified=False)
    assert moved and np.max(np.abs(moved[0][0] + rt.move)) < 0.05


def test_a_verifying_site_checks_the_s_hat_its_control_variates_started_from(monkeypatch):
    """Verified, the same server: a site checks at round 2 the ``S_hat`` of the ``cv_init``
    that set its control variate, not of a later one that changed nothing (on the code
    before: the second, honest, ``S_hat`` was checked, every site answered, and round 3's
    means moved by 3.01): every site refuses round 2 naming cv_init's moved field, and no
    round 3 is sent."""
    rt, moved = _cv_fit(monkeypatch, CvInitTwice)
    refusals = [str(r[ERROR_KEY]) for d, c, meth, r in rt.log
                if d == "up" and meth == "estep" and ERROR_KEY in r]
    assert len(refusals) == 6 and all("round 2 refused: cv_init's S_hat field 'sx'" in s
                                      for s in refusals), refusals
    assert moved == []


# ---- a round numbered below the last one: the control variate rolled back ---------------------
def _renumbered(monkeypatch, numbers):
    """A server that numbers its rounds by ``numbers`` (``{its round: the number sent}``):
    here round 3 goes out as round 5 and round 4 as round 3 (each (round, exchange) is still
    masked once, and a site's ledger answers each round number once). A site that answered
    round 5 takes a round at or below it for a fit resumed from a checkpoint and rolls its
    control variate back to before that round. Returns ``{its round: the decoded E-step
    sum}``."""
    from fedlatent.engine.secagg import secure as secure_mod

    total, sums = secure_mod.SecureChannel.sum, {}

    def summed(channel, method, msgs, *, round, exchange, weights=None):
        k = int(round)
        if method == "estep" and exchange == "estep" and k in numbers:
            msgs = {c: {**m, "round": numbers[k]} for c, m in msgs.items()}
            round = numbers[k]
        res = total(channel, method, msgs, round=round, exchange=exchange, weights=weights)
        if method == "estep" and exchange == "estep":
            sums[k] = {f: np.asarray(v) for f, v in res["sums"].items()
                       if f.startswith("delta/")}
        return res

    monkeypatch.setattr(secure_mod.SecureChannel, "sum", summed)
    return sums


def test_a_verifying_site_refuses_a_round_numbered_below_the_last(monkeypatch):
    """Verified, control variates on (alpha 1), four rounds numbered 1, 2, 5, 3: on the code
    before, every site answered the last with its control variate rolled back to before the
    round it answered as 5 (its reply ``Q_c`` plus that round's), so the sum revealed was
    the honest round 4's plus round 3's, a reply computed at a control variate the server
    chose, while the sites replay the server's ``V`` as if nothing was rolled back. A
    verified fit is never resumed and skips no round: every site refuses the E-step numbered
    5 after round 2 (a skipped number would draw other mini-batch rows than the replay's)."""
    fd = six_sites(3.0)
    fed = fl.Federation(secure_aggregation=True, control_variates=True)
    honest = _renumbered(monkeypatch, {})
    _fit(_gmm(fed, max_rounds=4), fd, InProcessRuntime(fd, policies=SitePolicy(public_starts=True)))
    honest = dict(honest)
    sums = _renumbered(monkeypatch, {3: 5, 4: 3})
    rt = InProcessRuntime(fd, record=True, policies=SitePolicy(public_starts=True))
    _fit(_gmm(fed, max_rounds=4), fd, rt)
    refusals = [str(r[ERROR_KEY]) for d, c, meth, r in rt.log
                if d == "up" and meth == "estep" and ERROR_KEY in r]
    assert 4 not in sums, {k: float(np.max(np.abs(sums[4][k] - honest[4][k] - honest[3][k])))
                           for k in sums.get(4, {})}  # (the rolled-back reply's sum, if any)
    assert len(refusals) == 6 and all("round 5 refused: it does not follow round 2, the last "
                                      "this site answered" in s for s in refusals), refusals


def test_a_verifying_site_refuses_an_estep_labelled_as_another_exchange(monkeypatch):
    """Verified, round 3's E-step sent as the exchange ``estep-again`` (a label of its own:
    masked afresh, as a second reply to a round would be): every site refuses it, naming the
    label; no sum of it is revealed."""
    from fedlatent.engine.secagg import secure as secure_mod

    total, sums = secure_mod.SecureChannel.sum, []

    def summed(channel, method, msgs, *, round, exchange, weights=None):
        if method == "estep" and exchange == "estep" and int(round) == 3:
            exchange = "estep-again"
        res = total(channel, method, msgs, round=round, exchange=exchange, weights=weights)
        sums.append(exchange)
        return res

    monkeypatch.setattr(secure_mod.SecureChannel, "sum", summed)
    fd = six_sites(3.0)
    rt = InProcessRuntime(fd, record=True, policies=SitePolicy(public_starts=True))
    _fit(_gmm(fl.Federation(secure_aggregation=True), max_rounds=4), fd, rt)
    refusals = [str(r[ERROR_KEY]) for d, c, meth, r in rt.log
                if d == "up" and meth == "estep" and ERROR_KEY in r]
    assert len(refusals) == 6 and all(
        "round 3 refused: its E-step is labelled as the exchange 'estep-again'" in s
        for s in refusals), refusals
    assert "estep-again" not in sums
