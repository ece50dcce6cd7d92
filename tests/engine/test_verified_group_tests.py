"""A verifying site takes part in a group test (a failing round's replies re-summed over a
sub-cohort, to locate a liar) only of a failure it checked itself
(:mod:`fedlatent.engine.node.verify_groups`): each test a server runs otherwise is refused by
every verifying site asked, naming the round and why; a real liar is still located, with the
verifying sites answering; an unverified fit's group tests are unchanged."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.engine.faults import FederatedFitError
from fedlatent.engine.protocol.messages import ERROR_KEY
from fedlatent.engine.secagg import secure as secure_mod
from fedlatent.engine.secagg import secure_checks
from fedlatent.engine.transport.inprocess import InProcessRuntime
from verified_doubles import Rebuilt, claim_failure, six_sites

pytest.importorskip("cryptography")

AT, LIAR = 3, "c1"  # the round the server runs group tests of; the lying site


class Sites(InProcessRuntime):
    """Six sites; ``liar`` (if any) adds 500 to every entry of its round-``AT`` statistic (a
    real failure: the aggregate breaks the model's invariants); every refusal of a group test
    kept, ``{(exchange, site): text}``."""

    def __init__(self, fd, liar=None, **kw):
        super().__init__(fd, **kw)
        self.refused: dict[tuple[str, str], str] = {}
        self.liar, self.lies = liar, (AT,)  # (the rounds it lies in)

    def _lie(self, client_ids):
        node = self.nodes[self.liar] if self.liar in client_ids else None
        if node is None or getattr(node, "_lying", False):
            return
        honest, node._lying = node._estep, True

        def lying(msg):
            reply = honest(msg)
            if int(msg["round"]) not in self.lies:
                return reply
            return {k: v + 500.0 if k.startswith("delta/") else v for k, v in reply.items()}
        node._estep = lying

    def call(self, client_ids, method, messages):
        self._lie(client_ids)
        replies = super().call(client_ids, method, messages)
        for c, r in replies.items():
            if method == "estep" and "secagg/replay" in messages[c] and ERROR_KEY in r:
                self.refused[(str(messages[c]["secagg/exchange"]), c)] = str(r[ERROR_KEY])
        return replies


def _fit(rt, fd, verified=None, stops=False, max_rounds=5):
    fed = fl.Federation(secure_aggregation=True, **({} if verified is None
                                                     else {"verified": verified}))
    est = fl.FederatedGaussianMixture(n_components=3, n_init=1, tol=0.0, max_rounds=max_rounds,
                                      random_state=0, federation=fed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if stops:
            with pytest.raises(FederatedFitError) as got:
                est.fit(fd, runtime=rt)
            return got.value
        return est.fit(fd, runtime=rt)


def _skipped(est):
    return [r.skipped for r in est.history_ if r.skipped]


def _refused_by_all(rt, exchange, cohort, text):
    """Every site of ``cohort`` refused group test ``exchange`` with ``text`` in its reason,
    naming itself and the round."""
    for c in cohort:
        why = rt.refused.get((exchange, c), "")
        assert why.startswith(f"client {c!r}: round {AT} refused: group test {exchange!r} of "
                              f"round {AT}: "), (c, why)
        assert text in why, (c, why)


def _tests(monkeypatch, cohorts, *, threshold=None):
    """The server's search replaced: group tests 0, 1, ... of round ``AT`` over
    ``cohorts(S)`` (lists of the survivors ``S``), the threshold lowered to ``threshold`` at
    the server first (if given)."""
    def locate(rounds, plan, S):
        if threshold is not None:
            srv = rounds.secure.server
            srv.config = dataclasses.replace(srv.config, threshold=threshold)
        for j, cohort in enumerate(cohorts(list(S))):
            secure_checks._test(rounds, plan, cohort, j)
        return None, "group tests of the server's choosing"

    monkeypatch.setattr(secure_checks, "locate", locate)


def test_a_group_test_without_the_rounds_transcript_is_refused(monkeypatch):
    """The server shows no transcript with a group test (as before this check): every
    verifying site asked refuses it, though the round's aggregate really failed."""
    show = secure_mod.SecureChannel._show_transcript
    monkeypatch.setattr(secure_mod.SecureChannel, "_show_transcript",
                        lambda self, out, test=None: 0 if test else show(self, out))
    fd = six_sites(3.0)
    rt = Sites(fd, LIAR)
    est = _fit(rt, fd)
    assert len(_skipped(est)) == 1
    assert "group test 0, over every survivor, could not be completed" in _skipped(est)[0]
    asked = sorted(c for (e, c) in rt.refused if e == "estep/check0")
    assert asked == fd.client_ids
    _refused_by_all(rt, "estep/check0", asked, f"it carries no transcript of round {AT}'s sum, "
                    "so this site cannot check that the round's aggregate failed")


def test_a_group_test_with_another_rounds_transcript_is_refused(monkeypatch):
    """The server shows, with round 3's group test, round 2's transcript (each site's own
    leaf is in it, but of another round): refused by every site asked."""
    keep, show = secure_mod.SecureChannel._keep_tree, secure_mod.SecureChannel._show_transcript
    old = {}

    def kept(self, round, exchange):
        keep(self, round, exchange)
        old[(round, exchange)] = self.trees[(round, exchange)]

    def shown(self, out, test=None):
        if test is None:
            return show(self, out)
        self.trees[(AT - 1, "estep")] = old[(AT - 1, "estep")]
        return show(self, out, (AT - 1, "estep"))

    monkeypatch.setattr(secure_mod.SecureChannel, "_keep_tree", kept)
    monkeypatch.setattr(secure_mod.SecureChannel, "_show_transcript", shown)
    fd = six_sites(3.0)
    rt = Sites(fd, LIAR)
    _fit(rt, fd)
    asked = sorted(c for (e, c) in rt.refused if e == "estep/check0")
    assert asked == fd.client_ids
    _refused_by_all(rt, "estep/check0", asked, f"the transcript it shows is not that of round "
                    f"{AT}'s sum with this site's contribution (site ")


def _claim_failure(monkeypatch):
    """The server says round ``AT``'s honest aggregate broke the model's invariants."""
    claim_failure(monkeypatch, AT)


def test_a_group_test_of_an_aggregate_that_passes_is_refused_and_so_is_its_undo(monkeypatch):
    """The server claims round 3's honest aggregate failed and runs two group tests (the
    survivors but the first, and but the first two: their sums would differ by one site's
    reply): every site refuses both, the aggregate rebuilt from its transcript passing every
    check; the round after, listing round 3 as discarded, is refused by every site too."""
    _claim_failure(monkeypatch)
    _tests(monkeypatch, lambda S: [S[1:], S[2:]])
    fd = six_sites(3.0)
    rt = Sites(fd)
    err = _fit(rt, fd, stops=True)
    passes = (f"round {AT}'s aggregate, rebuilt from its verified transcript, passes every "
              "check the server runs on it (ring range, units, the model's invariants): a "
              "group test of an aggregate that did not fail is refused")
    _refused_by_all(rt, "estep/check0", fd.client_ids[1:], passes)
    _refused_by_all(rt, "estep/check1", fd.client_ids[2:], passes)
    assert err.round == AT + 1
    for c in fd.client_ids:
        assert (f"client {c!r}: round {AT + 1} refused: round {AT}, which the server says it "
                "discarded: its aggregate, rebuilt from its verified transcript, passes every "
                "check the server runs on it") in str(err)


def test_a_false_discard_alone_is_refused_at_the_next_round(monkeypatch):
    """No group test: the server only says round 3's honest aggregate failed and lists it
    as discarded in round 4; every site refuses round 4 (nothing of one site was summed
    apart: no exchange but the rounds')."""
    _claim_failure(monkeypatch)
    _tests(monkeypatch, lambda S: [])
    fd = six_sites(3.0)
    rt = Sites(fd, record=True)
    err = _fit(rt, fd, stops=True)
    assert err.round == AT + 1 and "which the server says it discarded: its aggregate" in str(err)
    exchanges = {m.get("secagg/exchange") for d, _, meth, m in rt.log
                 if d == "down" and meth == "estep"}
    assert exchanges == {"estep"}


def test_a_cohort_leaving_out_more_than_a_search_needs_is_refused(monkeypatch):
    """A real failure; after the first test over every site, the server (its threshold
    lowered to 3) tests the survivors but the first three: it leaves out 3 of 6, more than
    the 6 - 4 a search above the threshold leaves out; every site asked refuses."""
    _tests(monkeypatch, lambda S: [S, S[3:]], threshold=3)
    fd = six_sites(3.0)
    rt = Sites(fd, LIAR)
    try:
        _fit(rt, fd)
    except FederatedFitError:
        pass  # (the server's lowered threshold may stop a later round: not this test's point)
    _refused_by_all(rt, "estep/check1", fd.client_ids[3:], f"its cohort leaves out 3 of round "
                    f"{AT}'s 6 sites (of those this site masks with), more than the 2 a "
                    "search above the threshold 4 leaves out")


def test_one_group_test_more_than_a_search_runs_is_refused(monkeypatch):
    """A real failure; after the first test over every site, the server runs six more over
    six sites (a search runs at most ceil(log2 6) + 2 = 5): five are answered, the sixth
    refused by every site asked."""
    assert secure_checks.group_test_limit(6) == 5
    _tests(monkeypatch, lambda S: [S] + [S[1:]] * 6)
    fd = six_sites(3.0)
    rt = Sites(fd, LIAR)
    _fit(rt, fd)
    assert not [k for k in rt.refused if k[0] != "estep/check6"]
    _refused_by_all(rt, "estep/check6", fd.client_ids[1:], f"this site answered 5 group tests "
                    f"of round {AT} after its first already, the most a search over 6 sites "
                    "runs (5)")


def test_no_more_group_tests_in_a_fit_than_a_server_reserves_for_them(monkeypatch):
    """A site lies (as if for the server) in rounds 3 to 7, each aggregate failing; the
    server runs two tests of each failing round (every site, then all but the first),
    excludes no one and never stops: five searches, ten tests. Each site in both tests of
    rounds 3 to 6 answers those CHECK_SLOTS = 8 and refuses round 7's first test naming the
    fit's limit (and its second, whose transcript no first test confirmed); the first site
    (left out of every second test) answers its fifth; without the limit, searches without
    end (each sub-cohort sum the difference of one site's reply with the full one)."""
    assert secure_checks.CHECK_SLOTS == 8
    _tests(monkeypatch, lambda S: [S, S[1:]])
    monkeypatch.setattr(secure_checks, "UNEXPLAINED_STOP", 100)  # (it does not stop)
    fd = six_sites(3.0)
    rt = Sites(fd, LIAR)
    rt.lies = range(AT, AT + 5)
    est = _fit(rt, fd, max_rounds=9)
    assert [r.round for r in est.history_ if r.skipped] == list(range(AT, AT + 5))
    asked = fd.client_ids[1:]  # (the first site, left out of every second test, answered
    assert sorted(rt.refused) == sorted([("estep/check0", c) for c in asked]  # 4 + 1 tests)
                                        + [("estep/check1", c) for c in asked])
    for c in asked:
        assert rt.refused[("estep/check0", c)] == (
            f"client {c!r}: round {AT + 4} refused: group test 'estep/check0' of round "
            f"{AT + 4}: this site answered 8 group tests in this fit already, the most a "
            "server runs in a fit (the 8 exchanges it reserves for them at set-up)")


def test_a_sub_cohort_before_every_site_confirmed_the_transcript_is_refused(monkeypatch):
    """A real failure; the server's first test leaves out one site (whose leaf, unchecked by
    the others, it could have altered in the tree it shows them): every site asked refuses,
    until a test over every site of the round confirmed the transcript."""
    _tests(monkeypatch, lambda S: [S[1:], S, S[1:]])
    fd = six_sites(3.0)
    rt = Sites(fd, LIAR)
    _fit(rt, fd)
    assert sorted(rt.refused) == [("estep/check0", c) for c in fd.client_ids[1:]]
    _refused_by_all(rt, "estep/check0", fd.client_ids[1:], f"it leaves out 1 of round {AT}'s "
                    "sites, and no group test of the round over every site of its sum has "
                    "confirmed the round's transcript yet")


class RebuiltSites(Rebuilt, Sites):
    """:class:`Sites` on nodes rebuilt for each message from their saved state (the liar's
    lie set on each rebuilt node)."""


@pytest.mark.parametrize("verified,runtime", [(True, Sites), (False, Sites),
                                              (True, RebuiltSites)],
                         ids=["verified", "unverified", "verified-rebuilt"])
def test_a_real_liar_is_located_with_the_transcript_shown_to_verifying_sites_only(verified,
                                                                                  runtime):
    """A real liar: located and excluded, verified or not (and on nodes rebuilt for each
    message, as on Flower); a verified fit's group tests carry the round's transcript, an
    unverified fit's none (its messages as before)."""
    fd = six_sites(3.0)
    rt = runtime(fd, LIAR, record=True)
    est = _fit(rt, fd, verified=verified)
    (why,) = _skipped(est)
    assert why.startswith(f"round {AT}: ") and f"client {LIAR!r} sent it (located by " in why
    assert not rt.refused
    tests = [m for d, _, meth, m in rt.log if d == "down" and meth == "estep"
             and "secagg/replay" in m]
    assert len(tests) >= 4
    shown = [sorted(k for k in m if k.startswith("verify/")) for m in tests]
    assert all(s == (["verify/A", "verify/path"] if verified else []) for s in shown), shown
    assert np.all(np.isfinite(est.means_))


def test_a_later_test_showing_a_tree_with_a_left_out_sites_leaf_altered_is_refused(monkeypatch):
    """A real failure; the first test over every site confirms round 3's transcript; the
    second leaves out c0 and shows a tree in which c0's leaf is altered (every site of its
    cohort still finds its own leaf: only the sites left out could tell): every site asked
    refuses it, its transcript not the one the first test confirmed."""
    from fedlatent.engine.secagg.sumtree import SumTree, shared_fields

    keep, show = secure_mod.SecureChannel._keep_tree, secure_mod.SecureChannel._show_transcript
    leaves, shown = {}, []

    def kept(self, round, exchange):
        leaves[(round, exchange)] = self.server.leaves
        keep(self, round, exchange)

    def forged(self, out, test=None):
        if test is None:
            return show(self, out)
        shown.append(test)
        if len(shown) == 1:
            return show(self, out, test)
        label, S, rows = leaves[test]
        assert list(S) == list(self.server.roster.ids)  # (every site in the sum)
        rows = rows.copy()
        rows[0, 0] += np.uint64(1)  # c0's leaf, which the test leaves out
        real = self.trees[test]
        tree = SumTree(label, S, rows)
        self.trees[test] = (tree, shared_fields(tree), *real[2:])
        try:
            return show(self, out, test)
        finally:
            self.trees[test] = real

    monkeypatch.setattr(secure_mod.SecureChannel, "_keep_tree", kept)
    monkeypatch.setattr(secure_mod.SecureChannel, "_show_transcript", forged)
    _tests(monkeypatch, lambda S: [S, S[1:]])
    fd = six_sites(3.0)
    rt = Sites(fd, LIAR)
    _fit(rt, fd)
    assert sorted(rt.refused) == [("estep/check1", c) for c in fd.client_ids[1:]]
    _refused_by_all(rt, "estep/check1", fd.client_ids[1:], f"its transcript is not the one "
                    f"every site of round {AT}'s sum confirmed in the round's first group test")


def test_after_an_exclusion_a_claimed_failure_gets_no_test_and_the_fit_goes_on(monkeypatch):
    """A real liar located and excluded in round 3; the server then claims round 4's honest
    aggregate failed: no site can rebuild a sum without the excluded site, so every site
    refuses its first group test naming it; round 4 is discarded, the fit goes on."""
    claim_failure(monkeypatch, AT + 1)
    fd = six_sites(3.0)
    rt = Sites(fd, LIAR)
    est = _fit(rt, fd)
    first, second = _skipped(est)
    assert f"client {LIAR!r} sent it (located by " in first
    assert "group test 0, over every survivor, could not be completed" in second
    others = [c for c in fd.client_ids if c != LIAR]
    assert sorted(rt.refused) == [("estep/check0", c) for c in others]
    for c in others:
        assert rt.refused[("estep/check0", c)] == (
            f"client {c!r}: round {AT + 1} refused: group test 'estep/check0' of round "
            f"{AT + 1}: [{LIAR!r}] of this site's neighbourhood were not in round {AT + 1}'s "
            "sum, so it cannot rebuild the round's statistic to check a failure")
    assert est.history_.to_frame()["participants"].tolist()[-1] == len(others)
