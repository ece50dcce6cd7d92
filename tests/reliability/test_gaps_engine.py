"""The engine's gaps in issue 11, item 3: every reply of a round is screened the same way.

A malformed reply (a block missing, a wrong shape, NaN/inf, not a number) is left out and
recorded in ``history_.rejected`` like a lie (or stops the run with ``on_invalid="raise"``);
the ``evaluate`` exchange of ``track_h`` is caught and checked like the E-step; a Flower node's
error in a round makes it missing with its text, as in-process; under control variates a
refused reply enters neither ``S_hat``, ``V`` nor the server's mirror of ``V_c`` (the client is
sent back to the mirrored ``V_c``), and the mirror is in the checkpoint.
"""

import json
import warnings

import numpy as np
import pytest

import fedlatent as fl
from federations import make_blobs_federation
from fedlatent.engine import InProcessRuntime
from fedlatent.engine.fedem.checkpoint import load_arrays_json
from fedlatent.engine.rounds.loop import FederatedFitError
from tolerance import assert_close, assert_same

FD = make_blobs_federation(n_clients=8)
VICTIM = FD.client_ids[2]
W = {c: FD[c].n_samples / sum(FD.sizes().values()) for c in FD.client_ids}


class Tamper(InProcessRuntime):
    """In-process clients; ``edit`` rewrites the ``victim``'s ``method`` replies in ``rounds``
    (``None``: every round)."""

    def __init__(self, fd, victim, edit, rounds=None, method="estep"):
        super().__init__(fd)
        self.victim, self.edit, self.rounds, self.method = victim, edit, rounds, method
        self.sent: dict[int, dict] = {}

    def call(self, client_ids, method, messages):
        out = super().call(client_ids, method, messages)
        if method == "estep" and self.victim in messages:
            self.sent[int(messages[self.victim]["round"])] = dict(messages[self.victim])
        if method != self.method or self.victim not in out:
            return out
        if self.rounds is None or int(messages[self.victim]["round"]) in self.rounds:
            out[self.victim] = self.edit(dict(out[self.victim]))
        return out


class Dropping(InProcessRuntime):
    """The victim's E-step replies from round 2 on never arrive."""

    def call(self, client_ids, method, messages):
        out = super().call(client_ids, method, messages)
        if method == "estep" and VICTIM in out and int(messages[VICTIM]["round"]) >= 2:
            out.pop(VICTIM)
        return out


def gmm(federation=None, rounds=6, **kw):
    return fl.FederatedGaussianMixture(3, max_rounds=rounds, tol=0.0, random_state=0,
                                       federation=federation, **kw)


def fit(est, fd=FD, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        return est.fit(fd, **kw)


def edit_block(key, fn):
    def edit(r):
        r[key] = fn(r[key])
        return r
    return edit


def drop_sxx(r):
    r.pop("delta/sxx")
    return r


MALFORMED = [
    (drop_sxx, "missing statistic(s) ['sxx']"),
    (edit_block("delta/sx", lambda v: v[:, :2]),
     "statistic 'sx' has shape (3, 2), expected (3, 4)"),
    (edit_block("delta/nk", lambda v: np.full_like(v, np.nan)),
     "statistic 'nk' has non-finite values"),
    (edit_block("delta/sxx", lambda v: v * np.inf), "statistic 'sxx' has non-finite values"),
    (edit_block("delta/nk", lambda v: v.astype(str)), "statistic 'nk' is not numeric (<U"),
    (edit_block("n", lambda v: "many"), "scalar 'n' is not a number ('many')"),
]


# ---- gap 1: a malformed reply follows the rule of the invariants ------------------------------
@pytest.mark.parametrize("edit, reason", MALFORMED)
def test_a_malformed_round_reply_is_left_out_and_recorded(edit, reason):
    """Without control variates a left-out client weighs nothing: the fit is the one where its
    replies never arrive, and the reason is in ``rejected`` (not ``missing``)."""
    fed = fl.Federation(control_variates=False)
    est = fit(gmm(fed), runtime=Tamper(FD, VICTIM, edit, rounds=range(3, 99)))
    assert [r.rejected for r in est.history_[:2]] == [{}, {}]
    for rec in est.history_[2:]:
        assert list(rec.rejected) == [VICTIM] and rec.rejected[VICTIM].startswith(reason)
        assert rec.missing == [] and rec.participants == 7
    assert np.all(np.isfinite(est.means_))


def test_a_left_out_malformed_reply_equals_a_lost_one():
    fed = fl.Federation(control_variates=False)
    nan = edit_block("delta/nk", lambda v: np.full_like(v, np.nan))
    est = fit(gmm(fed), runtime=Tamper(FD, VICTIM, nan, rounds=range(2, 99)))
    lost = fit(gmm(fed), runtime=Dropping(FD))
    # exact: both runs call the clients one by one and aggregate the same replies in the same
    # order (a refused reply is dropped before aggregation, as a lost one): the same operations
    assert_same(est.means_, lost.means_)
    assert_same(est.covariances_, lost.covariances_)
    assert [r.missing for r in lost.history_[1:]] == [[VICTIM]] * 5


def test_a_malformed_reply_with_on_invalid_raise_names_client_and_round(tmp_path):
    fed = fl.Federation(on_invalid="raise")
    nan = edit_block("delta/nk", lambda v: np.full_like(v, np.nan))
    ck = tmp_path / "ck"
    with pytest.raises(FederatedFitError, match=rf"^round 3: client '{VICTIM}' sent an invalid "
                       r"reply: statistic 'nk' has non-finite values; stopped "
                       r"\(on_invalid='raise'\), kept the parameters of round 2$") as err:
        fit(gmm(fed), runtime=Tamper(FD, VICTIM, nan, rounds={3}), checkpoint=ck)
    assert err.value.round_ == 3
    good = fit(gmm(fed, rounds=2))
    assert_close(err.value.last_good["means"], good.means_)  # per-client vs batched clients
    arrays, meta = load_arrays_json(ck)
    assert meta["round"] == 2


def test_a_malformed_initialization_reply_stops_like_a_lie_naming_the_client():
    nan = edit_block("delta/nk", lambda v: np.full_like(v, np.nan))
    with pytest.raises(FederatedFitError, match=rf"^clients \['{VICTIM}'\] did not answer the "
                       r"initialization round validly \(every client must\): client "
                       rf"'{VICTIM}': statistic 'nk' has non-finite values$"):
        fit(gmm(), runtime=Tamper(FD, VICTIM, nan, rounds={1}))


# ---- gap 2: the evaluate exchange of track_h --------------------------------------------------
class BadEvaluate(InProcessRuntime):
    """``raiser``'s node raises in ``evaluate`` (it gets parameters it cannot use); ``liar``'s
    evaluation reply claims a negative count."""

    def __init__(self, fd, raiser, liar):
        super().__init__(fd)
        self.raiser, self.liar = raiser, liar

    def call(self, client_ids, method, messages):
        if method == "evaluate":
            messages = dict(messages)
            messages[self.raiser] = {**messages[self.raiser], "params/means": np.zeros(1)}
        out = super().call(client_ids, method, messages)
        if method == "evaluate":
            out[self.liar] = {**out[self.liar], "delta/nk": out[self.liar]["delta/nk"] - 2.0}
        return out


def test_evaluate_failures_are_recorded_and_leave_the_fit_unchanged():
    raiser, liar = FD.client_ids[1], FD.client_ids[4]
    fed = fl.Federation(track_h=True, control_variates=False)
    est = fit(gmm(fed, rounds=3), runtime=BadEvaluate(FD, raiser, liar))
    ref = fit(gmm(fl.Federation(control_variates=False), rounds=3))
    assert_close(est.means_, ref.means_)  # evaluating changes nothing (batched reference)
    for rec in est.history_:
        assert rec.missing == [raiser] and rec.participants == 8
        assert rec.errors[raiser].startswith("evaluate: ")
        assert rec.rejected == {liar: rec.rejected[liar]}
        assert rec.rejected[liar].startswith("evaluate: count 'nk' is negative")
        assert np.isfinite(rec.h_norm2)


def test_evaluate_lie_with_on_invalid_raise_names_the_client():
    raiser, liar = FD.client_ids[1], FD.client_ids[4]
    fed = fl.Federation(track_h=True, on_invalid="raise")
    with pytest.raises(FederatedFitError, match=rf"^round 1: client '{liar}' sent an evaluation "
                       r"that cannot be true: count 'nk' is negative"):
        fit(gmm(fed, rounds=3), runtime=BadEvaluate(FD, raiser, liar))


# ---- gap 3: a Flower node's error in a round is absence, as in-process ------------------------
class FakeGrid:
    """A Flower Grid answering in-process with the node code of the Flower ClientApp: a node's
    exception becomes an error reply, as ``make_client_app`` sends it."""

    def __init__(self, fd, fail_node_from_round):
        from flwr.app import RecordDict

        self.fd, self.fail = fd, fail_node_from_round
        self.states = {i + 1: RecordDict() for i in range(fd.n_clients)}
        self.replies: dict[str, object] = {}
        self.n = 0

    def get_node_ids(self):
        return list(self.states)

    def push_messages(self, msgs):
        from types import SimpleNamespace

        from fedlatent.runtime import flower as fw

        ids = []
        for m in msgs:
            nid = int(m.metadata.dst_node_id)
            d = fw.decode(m.content)
            method = str(d.pop(fw._METHOD))
            cid = self.fd.client_ids[nid - 1]
            try:
                if (method == "estep" and nid in self.fail
                        and int(d["round"]) >= self.fail[nid]):
                    raise FileNotFoundError(f"data file of {cid} is gone")
                reply = fw.serve(self.fd.subset([cid]), self.states[nid], method, d)
            except Exception as err:  # noqa: BLE001 - as the ClientApp does
                reply = {fw._ERROR: str(err), fw._ERROR_TYPE: type(err).__name__}
            self.n += 1
            rid = f"m{self.n}"
            self.replies[rid] = SimpleNamespace(
                metadata=SimpleNamespace(reply_to_message_id=rid, src_node_id=nid),
                has_error=lambda: False, content=fw.encode(reply))
            ids.append(rid)
        return ids

    def pull_messages(self, ids):
        return [self.replies.pop(i) for i in ids if i in self.replies]


@pytest.fixture
def flower_task(monkeypatch):
    """Flower's Message needs the id of a run (a ServerApp's); this test's run is 1."""
    from flwr.supercore.task_identity import TaskIdentity

    monkeypatch.setattr(TaskIdentity, "_run_id", 1)
    monkeypatch.setattr(TaskIdentity, "_node_id", 1)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)


def test_a_flower_nodes_error_in_a_round_is_missing_with_its_text(flower_task):
    from fedlatent.data.remote import RemoteDataset
    from fedlatent.engine.contract.registry import describe_message
    from fedlatent.runtime.flower import FlowerRuntime

    fed = fl.Federation(control_variates=False)
    est = gmm(fed, rounds=4)
    rt = FlowerRuntime(FakeGrid(FD, {3: 3}), describe_message(est), round_timeout=60)
    fit(est, RemoteDataset.from_replies(rt.describe_replies), runtime=rt)
    who = FD.client_ids[2]
    assert [r.missing for r in est.history_] == [[], [], [who], [who]]
    assert est.history_[2].errors == {who: f"FileNotFoundError: data file of {who} is gone"}
    # in-process, the same client raising in the same rounds gives the same fit
    class Raising(InProcessRuntime):
        def call(self, client_ids, method, messages):
            node = self.nodes[who]
            if method == "estep" and int(messages[client_ids[0]]["round"]) >= 3:
                def boom(*a, **k):
                    raise FileNotFoundError(f"data file of {who} is gone")
                node._local_stats = boom
            return super().call(client_ids, method, messages)

    ref = fit(gmm(fed, rounds=4), runtime=Raising(FD))
    assert_close(est.means_, ref.means_)  # Flower messages vs in-process: to rounding
    assert [r.errors for r in est.history_] == [r.errors for r in ref.history_]


def test_a_flower_nodes_error_at_setup_still_stops_the_run_naming_it(flower_task):
    from fedlatent.data.remote import RemoteDataset
    from fedlatent.engine.contract.registry import describe_message
    from fedlatent.engine.protocol.messages import ClientReplyError
    from fedlatent.runtime.flower import FlowerRuntime

    est = gmm(rounds=2)
    grid = FakeGrid(FD, {})
    rt = FlowerRuntime(grid, describe_message(est), round_timeout=60)
    real = grid.push_messages

    def failing_setup(msgs):
        from fedlatent.runtime import flower as fw

        ids = real(msgs)
        for rid in ids:
            rep = grid.replies[rid]
            if rep.metadata.src_node_id == 3 and "n_units" in fw.decode(rep.content):
                rep.content = fw.encode({fw._ERROR: "disk gone", fw._ERROR_TYPE: "OSError"})
        return ids

    grid.push_messages = failing_setup
    with pytest.raises(ClientReplyError, match=rf"client '{FD.client_ids[2]}'"
                       r" sent an invalid reply: disk gone"):
        fit(est, RemoteDataset.from_replies(rt.describe_replies), runtime=rt)


# ---- gap 4: control variates and refused replies ----------------------------------------------
def negative_count(r):  # a count of -2 per unit: no data give it
    r["delta/nk"] = r["delta/nk"] - np.array([2.0, 0.0, 0.0])
    return r


def cv_identity_gap(est_rt, ck, refused=None):
    """max |V - sum_c w_c V_c|: the server's mean control variate against the clients' own
    (for a client ``refused`` in the last round, the V_c it will be sent back to, the
    checkpoint's mirror, since it updated its own with the refused reply)."""
    arrays, _ = load_arrays_json(ck)
    states = est_rt.get_client_states()
    worst = 0.0
    for k in ("nk", "sx", "sxx"):
        V_c = {c: states[c][f"V/{k}"] for c in FD.client_ids}
        if refused is not None:
            i = FD.client_ids.index(refused)
            assert not np.allclose(V_c[refused], arrays[f"mirror/{i}/{k}"], rtol=0, atol=1e-12)
            V_c[refused] = arrays[f"mirror/{i}/{k}"]
        mean = sum(W[c] * V_c[c] for c in FD.client_ids)
        worst = max(worst, float(np.max(np.abs(arrays[f"V/{k}"] - mean))))
    return worst


def test_a_reply_corrupted_once_in_transit_is_accepted_again_and_the_fit_recovers(tmp_path):
    rt = Tamper(FD, VICTIM, negative_count, rounds={3})
    est = fit(gmm(rounds=25), runtime=rt, checkpoint=tmp_path / "ck")
    assert [list(r.rejected) for r in est.history_] == [[]] * 2 + [[VICTIM]] + [[]] * 22
    # the client was sent back to the V_c the server holds, once
    assert "V_reset/nk" in rt.sent[4] and not any("V_reset/nk" in rt.sent[k] for k in (3, 5))
    # the refused reply entered neither S_hat nor V: V = sum_c w_c V_c as in a clean run
    assert cv_identity_gap(rt, tmp_path / "ck") < 1e-12
    clean = fit(gmm(rounds=25))
    order = lambda m: m[np.argsort(m[:, 0])]  # noqa: E731
    np.testing.assert_allclose(order(est.means_), order(clean.means_), rtol=0.01)
    np.testing.assert_allclose(np.sort(est.weights_), np.sort(clean.weights_), rtol=0.01)


def test_a_persistent_liar_is_refused_every_round_and_never_aggregated(tmp_path):
    rt = Tamper(FD, VICTIM, negative_count, rounds=range(2, 99))
    est = fit(gmm(rounds=8), runtime=rt, checkpoint=tmp_path / "ck")
    assert [list(r.rejected) for r in est.history_] == [[]] + [[VICTIM]] * 7
    assert all(r.participants == 7 for r in est.history_[1:])
    assert cv_identity_gap(rt, tmp_path / "ck", refused=VICTIM) < 1e-12


# ---- gap 5: the mirror of V_c is in the checkpoint --------------------------------------------
def shifted_sum_x(r):  # caught only where the server rebuilds S_c (it needs the mirrored V_c)
    r["delta/sx"] = r["delta/sx"] + 1e6 / r["n"]
    return r


def test_a_resumed_run_checks_as_much_as_the_uninterrupted_one(tmp_path):
    full = fit(gmm(rounds=7), runtime=Tamper(FD, VICTIM, shifted_sum_x, rounds={3, 5, 6, 7}))
    ck = tmp_path / "ck"
    fit(gmm(rounds=3), runtime=Tamper(FD, VICTIM, shifted_sum_x, rounds={3}), checkpoint=ck,
        checkpoint_every=1)
    with np.load(f"{ck}.npz") as z:
        meta = json.loads(z["meta.json"].tobytes())
        assert meta["mirror"] == {"known": list(range(8)), "resync": [2]}
        assert z["mirror/2/sxx"].shape == (3, 4, 4)
    resumed = fit(gmm(rounds=7), runtime=Tamper(FD, VICTIM, shifted_sum_x, rounds={5, 6, 7}),
                  checkpoint=ck, resume=True)
    assert [list(r.rejected) for r in resumed.history_] == [[], [], [VICTIM], [], [VICTIM],
                                                            [VICTIM], [VICTIM]]
    # exact: the resumed rounds repeat the uninterrupted run's operations in the same order,
    # from the checkpoint's float64 bits, on one machine
    assert_same(resumed.means_, full.means_)
    assert_same(resumed.covariances_, full.covariances_)
