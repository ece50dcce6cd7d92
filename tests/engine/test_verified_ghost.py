"""Verified rounds against a ghost leaf (issue 38): a server that adds a vector ``delta`` to an
exchange's sum, evaluates the parameters of the forged sum itself, and hides ``delta`` in a leaf
of the sum tree that no honest site checks:

- (a) a leaf outside the set-up's roster (the tree's ``n`` one more than the roster's);
- (b) the slot of a site it declared dropped in that exchange (its masks were recovered, so
  ``delta`` needs no masks to cancel);
- (c) the leaf of a site that was in the sum and is silent in the next exchange (so never
  checks its leaf).

Every honest site refuses, before anything of the round computed on the forged parameters is
revealed: (a) and (b) at the transcript check (the tree's leaves are the roster's, a site's
leaf its rank; the neighbours of a site not in the sum check its leaf is zero), (c) at the
next exchange's consistency round (a neighbour that was in the sum must confirm it, its tokens
carrying the digest it checked). Each attack's positive control turns off the check that stops
it and shows the forged round accepted and its parameters evaluated.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.engine.contract import registry
from fedlatent.engine.faults import FederatedFitError
from fedlatent.engine.node import verify_transcript
from fedlatent.engine.protocol.messages import ERROR_KEY
from fedlatent.engine.secagg import SecAggClient, SecAggServer
from fedlatent.engine.secagg import secure as secure_mod
from fedlatent.engine.secagg.sumtree import PROJECTIONS, SumTree, shared_fields, verify_leaf
from fedlatent.engine.transport.inprocess import InProcessRuntime
from verified_doubles import six_sites

pytest.importorskip("cryptography")

AT, ROUNDS = 3, 6  # the exchange whose sum is forged: round AT's E-step
GHOST = "zzzz-ghost"
MODELS = ["gmm", "lcr"]  # (the forged word: the first statistic after the counts)


def _data(name="gmm"):
    """Three 2-d Gaussians over six sites (GMM), or the registry's example (LCR)."""
    if name != "gmm":
        return registry.estimator_entries()[name].load_example().case().data()
    return six_sites(3.0)


def _fit(runtime, name="gmm", **fed):
    federation = fl.Federation(secure_aggregation=True, **fed)
    if name == "gmm":
        est = fl.FederatedGaussianMixture(n_components=3, n_init=1, tol=0.0,
                                          max_rounds=ROUNDS, random_state=0,
                                          federation=federation)
    else:
        est = registry.estimator_entries()[name].load_example().case().make()
        est.set_params(tol=0.0, max_rounds=ROUNDS, federation=federation)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return est.fit(runtime._fd, runtime=runtime)


def _round_of(msg):
    if msg.get("secagg/exchange") != "estep" or "secagg/replay" in msg:
        return None
    return int(np.asarray(msg["secagg/round"]).reshape(-1)[0])


class Dropping(InProcessRuntime):
    """Site ``site``'s round-``at`` E-step reply never arrives (it computed it)."""

    def __init__(self, fd, site=None, at=AT, **kw):
        super().__init__(fd, record=True, **kw)
        self.site, self.at = site, at

    def call(self, client_ids, method, messages):
        replies = super().call(client_ids, method, messages)
        if method == "estep" and any(_round_of(m) == self.at for m in messages.values()):
            replies = {c: r for c, r in replies.items() if c != self.site}
        return replies



class Forger:
    """A server that adds ``delta`` (one word of the first statistic field after the
    counts, ``value`` in its units) to round ``at``'s sum, evaluates the forged sum's
    parameters, and shows the sites a tree whose extra ``delta`` sits where ``where`` says:
    ``"outside"`` (a leaf past the roster, id ``GHOST``), ``"dropped"`` (the slot of a site
    not in the sum) or a site's id (added to that site's leaf)."""

    def __init__(self, monkeypatch, where, at=AT, value=1e-3):
        self.where, self.at, self.value, self.shown = where, at, value, []
        self.true_A = self.forged_A = None
        orig = SecAggServer.unmask
        forger = self

        def unmask(server, revealed):
            pend = server._pending
            if (pend["round"], pend["exchange"]) == (forger.at, "estep"):
                layout = pend["layout"]
                delta = np.zeros(layout.size, dtype=np.uint64)
                off = 0
                for name, shape in layout.shapes:
                    if name.startswith("delta/") and name != "delta/nk":  # (the counts'
                        break  # sum is checked: a mean's sum is not)
                    off += int(np.prod(shape))
                scale = server.config.encoding.scale
                delta[off] = np.int64(round(forger.value * scale)).astype(np.uint64)
                forger.delta = delta
                pend["total"] = pend["total"] + delta  # (the server's sum: what it evaluates)
            out = orig(server, revealed)
            if (pend["round"], pend["exchange"]) == (forger.at, "estep") and server.leaves:
                forger.S = list(server.leaves[1])
            return out

        keep = secure_mod.SecureChannel._keep_tree

        def keep_tree(channel, round, exchange):
            keep(channel, round, exchange)
            if (round, exchange) != (forger.at, "estep"):
                return
            entry = channel.trees[(round, exchange)]
            ids = list(channel.server.roster.ids)
            at = {u: i for i, u in enumerate(ids)}
            leaves = forger._leaves(channel, ids, at)
            forged = SumTree(entry[0].label, ids + ([GHOST] if forger.where == "outside"
                                                    else []), leaves)
            forger.true_A, forger.forged_A, forger.tree = entry[0].A, forged.A, forged
            forger.leaves = leaves
            channel.trees[(round, exchange)] = (forged, shared_fields(forged), at, *entry[3:])

        monkeypatch.setattr(SecAggServer, "unmask", unmask)
        monkeypatch.setattr(secure_mod.SecureChannel, "_keep_tree", keep_tree)

    def _leaves(self, channel, ids, at):
        """The honest leaves at their roster ranks, zeros elsewhere, with ``delta`` placed."""
        label, S, leaves = channel.server.leaves
        full = np.zeros((len(ids), leaves.shape[1]), dtype=np.uint64)
        full[[at[u] for u in S]] = leaves
        if self.where == "outside":
            return np.vstack([full, self.delta[None]])
        if self.where == "dropped":
            gone = sorted(set(ids) - set(S))
            full[at[gone[0]]] += self.delta
            return full
        full[at[self.where]] += self.delta
        return full


def _estep_replies(rt, rnd):
    """``{client: reply}`` of round ``rnd``'s E-step."""
    down = {}
    out = {}
    for d, c, meth, m in rt.log:
        if meth != "estep":
            continue
        if d == "down":
            down[c] = _round_of(m)
        elif down.get(c) == rnd:
            out[c] = m
    return out


def _secagg_replies(rt, rnd, step):
    down, out = {}, {}
    for d, c, meth, m in rt.log:
        if meth != "secagg":
            continue
        if d == "down":
            down[c] = (m.get("step"), int(np.asarray(m.get("round", -1)).reshape(-1)[0]))
        elif down.get(c) == (step, rnd):
            out[c] = m
    return out


def _old_check_passes(forger) -> bool:
    """The check before this change, each honest survivor's own leaf against the forged
    tree (its index and ``n`` as the tree says): every one of them passes."""
    tree, ids = forger.tree, forger.tree.ids
    return all(verify_leaf(tree.label, i, len(ids), ids[i], forger.leaves[i], tree.A, tree.c,
                           None, tree.path(i)) for i in range(len(ids)) if ids[i] in forger.S)


def _refused_by_all(rt, sites, rnd, what):
    """Every one of ``sites`` answered round ``rnd``'s E-step with a refusal matching
    ``what``, and none of them masked a reply of it."""
    got = _estep_replies(rt, rnd)
    assert sorted(got) == sorted(sites)
    for c in sites:
        assert ERROR_KEY in got[c], c
        assert what in got[c][ERROR_KEY], got[c][ERROR_KEY]


def _no_reveal(rt, rnd):
    assert not [r for r in _secagg_replies(rt, rnd, "reveal").values() if ERROR_KEY not in r]


def test_the_forger_changes_the_parameters_when_the_sites_do_not_check(monkeypatch):
    """The harness itself: without verification the forged round's sum moves the fit."""
    fd = _data()
    honest = _fit(InProcessRuntime(fd), verified=False)
    Forger(monkeypatch, "outside")
    forged = _fit(InProcessRuntime(fd), verified=False)
    assert np.max(np.abs(forged.means_ - honest.means_)) > 1e-4


# ---- (a) a leaf outside the roster ------------------------------------------------------------
@pytest.mark.parametrize("name", MODELS)
def test_a_ghost_leaf_outside_the_roster_is_refused_by_every_site(monkeypatch, name):
    fd = _data(name)
    forger = Forger(monkeypatch, "outside")
    rt = InProcessRuntime(fd, record=True)
    with pytest.raises(FederatedFitError, match=rf"^round {AT + 1}"):
        _fit(rt, name)
    assert _old_check_passes(forger)  # each site's own leaf is in the forged tree
    assert not np.array_equal(forger.forged_A, forger.true_A)
    _refused_by_all(rt, fd.client_ids, AT + 1, f"its transcript's tree has {len(fd.client_ids) + 1}"
                    " leaves")
    _no_reveal(rt, AT + 1)


def test_positive_control_a_ghost_outside_the_roster_passes_without_the_roster_check(
        monkeypatch):
    fd = _data()
    Forger(monkeypatch, "outside")
    monkeypatch.setattr(verify_transcript, "roster_place", lambda *a: None)
    rt = InProcessRuntime(fd, record=True)
    est = _fit(rt)
    assert not any(r.errors for r in est.history_)  # every forged round evaluated, answered
    revealed = _secagg_replies(rt, AT + 1, "reveal")
    assert len(revealed) == len(fd.client_ids)
    assert all(ERROR_KEY not in r for r in revealed.values())


# ---- (b) the slot of a site declared dropped -------------------------------------------------
def _no_confirm_rule(monkeypatch):
    """P3 off, so that the dropped-site forgery reaches the transcript check (P3 alone stops
    a round after a dropout at its consistency round: a site of the sum before is missing)."""
    monkeypatch.setattr(SecAggClient, "_confirmed_before", lambda *a: None, raising=False)


@pytest.mark.parametrize("name", MODELS)
def test_a_ghost_in_a_dropped_sites_slot_is_refused_by_its_neighbours(monkeypatch, name):
    fd = _data(name)
    gone = fd.client_ids[2]
    _no_confirm_rule(monkeypatch)
    forger = Forger(monkeypatch, "dropped")
    rt = Dropping(fd, gone)
    with pytest.raises(FederatedFitError, match=rf"^round {AT + 1}"):
        _fit(rt, name)
    assert _old_check_passes(forger)
    others = [c for c in fd.client_ids if c != gone]
    _refused_by_all(rt, others, AT + 1, f"{gone!r} was not in the sum of the exchange before")
    _no_reveal(rt, AT + 1)


def test_positive_control_a_ghost_in_a_dropped_slot_passes_without_the_zero_check(
        monkeypatch):
    fd = _data()
    _no_confirm_rule(monkeypatch)
    Forger(monkeypatch, "dropped")
    monkeypatch.setattr(verify_transcript, "zeros", lambda *a: None)
    rt = Dropping(fd, fd.client_ids[2])
    est = _fit(rt)
    assert len(est.history_) == ROUNDS
    revealed = _secagg_replies(rt, AT + 1, "reveal")  # the round on forged parameters unmasked
    assert len(revealed) == len(fd.client_ids) - 1
    assert all(ERROR_KEY not in r for r in revealed.values())


def test_with_every_check_a_dropout_stops_the_round_at_its_consistency(monkeypatch):
    """With P3 on, the forgery never gets shown: the dropped site was in the sum of the round
    before, so its neighbours reveal nothing in the round it dropped from."""
    fd = _data()
    gone = fd.client_ids[2]
    Forger(monkeypatch, "dropped")
    rt = Dropping(fd, gone)
    with pytest.raises(FederatedFitError, match=rf"^round {AT}, exchange 'estep': .*\[{gone!r}\]"
                       r" took part in the sum of the exchange before but are not survivors"):
        _fit(rt)
    _no_reveal(rt, AT)


# ---- (c) the leaf of a survivor silent in the next exchange ----------------------------------
@pytest.mark.parametrize("name", MODELS)
def test_a_ghost_in_a_silent_survivors_leaf_is_refused_before_any_reveal(monkeypatch, name):
    fd = _data(name)
    quiet = fd.client_ids[4]
    forger = Forger(monkeypatch, quiet)
    rt = Dropping(fd, quiet, at=AT + 1)  # its round AT + 1 reply never arrives
    with pytest.raises(FederatedFitError, match=rf"^round {AT + 1}, exchange 'estep': .*"
                       rf"\[{quiet!r}\] took part in the sum of the exchange before") as got:
        _fit(rt, name)
    assert _old_check_passes(forger)
    others = [c for c in fd.client_ids if c != quiet]
    said = _secagg_replies(rt, AT + 1, "consistency")
    assert sorted(said) == others and all(ERROR_KEY in said[c] for c in others)
    _no_reveal(rt, AT + 1)
    assert got.value.round == AT + 1


def test_positive_control_a_ghost_in_a_silent_leaf_passes_without_the_confirm_rule(
        monkeypatch):
    fd = _data()
    quiet = fd.client_ids[4]
    _no_confirm_rule(monkeypatch)
    Forger(monkeypatch, quiet)
    rt = Dropping(fd, quiet, at=AT + 1)
    est = _fit(rt)
    revealed = _secagg_replies(rt, AT + 1, "reveal")
    assert len(revealed) == len(fd.client_ids) - 1  # the forged round's sum unmasked
    assert all(ERROR_KEY not in r for r in revealed.values())
    assert len(est.history_) == ROUNDS


def test_verified_equals_unverified_when_nobody_cheats():
    fd = _data()
    a, b = _fit(InProcessRuntime(fd)), _fit(InProcessRuntime(fd), verified=False)
    for k in ("means_", "covariances_", "weights_"):
        assert np.allclose(getattr(a, k), getattr(b, k), rtol=1e-10, atol=1e-10)


def _lying(fd, liar, at=2):
    """A recording runtime on which ``liar`` adds 500 to every statistic it sends from round
    ``at`` on (the aggregate breaks the model's invariants: the round is discarded, the liar
    located by the group tests and left out)."""
    rt = InProcessRuntime(fd, record=True)
    node = rt.nodes[liar]
    honest = node._estep

    def lie(msg):
        reply = honest(msg)
        if int(msg["round"]) < at:
            return reply
        return {k: (v + 500.0 if k.startswith("delta/") else v) for k, v in reply.items()}

    node._estep = lie
    return rt


def test_a_located_liar_is_left_out_and_its_neighbours_check_its_zero_leaf():
    """The honest counterpart of the dropped-slot check: after a discarded round whose liar
    the group tests located, the liar is absent from every later sum; each later round shows
    the others its zero leaf's path, and they accept it (the fit the unverified one)."""
    fd = _data()
    liar = fd.client_ids[3]
    rt = _lying(fd, liar)
    est = _fit(rt)
    n = len(fd.client_ids)
    assert est.history_.to_frame()["participants"].tolist()[2:] == [n - 1] * (ROUNDS - 2)
    later = [m for d, c, meth, m in rt.log if d == "down" and meth == "estep"
             and (_round_of(m) or 0) >= 4]
    assert len(later) == (n - 1) * (ROUNDS - 3)
    assert all(m["verify/zero"].size == 8 + (32 + 4 * PROJECTIONS) * 3 for m in later)  # 3 levels
    assert not [r for d, c, meth, r in rt.log if d == "up" and ERROR_KEY in r and c != liar]
    plain = _fit(_lying(fd, liar), verified=False)
    for k in ("means_", "covariances_", "weights_"):
        assert np.allclose(getattr(est, k), getattr(plain, k), rtol=1e-10, atol=1e-10)
