"""The in-process secure-aggregation set-up with ``n_jobs`` (its X25519 agreements ahead in
forked worker processes, :mod:`fedlatent.engine.secagg.ahead`): the same transcript and the
same pair secrets as one job given the same keys and randomness, an offer used only for the
exact keys it was computed from, and no worker left behind, also when the step fails."""

import hashlib
import os
import time

import joblib
import numpy as np
import pytest

pytest.importorskip("cryptography")

import fedlatent as fl  # noqa: E402
import fedlatent.engine.secagg.ahead as ahead_mod  # noqa: E402
from fedlatent.engine.secagg import _crypto, shamir  # noqa: E402
from fedlatent.engine.secagg.secure import SecureChannel  # noqa: E402
from fedlatent.engine.site.keys import SiteKeys  # noqa: E402
from tolerance import assert_same  # noqa: E402

needs_fork = pytest.mark.skipif(not ahead_mod.can_fork(), reason="workers are forked on Linux")


def _deterministic(monkeypatch):
    """Every random draw of the set-up from a counter: a site's own while it answers a
    message (the sites' order of handling may differ between runs), else the server's."""
    from cryptography.hazmat.primitives.asymmetric import ed25519, x25519

    from fedlatent.engine.node.client import ClientNode

    count, now = {}, [""]

    def draw(n=32):
        out, who = b"", now[0]
        while len(out) < n:
            count[who] = count.get(who, 0) + 1
            out += hashlib.sha256(f"draw/{who}/{count[who]}".encode()).digest()
        return out[:n]

    handle = ClientNode.handle

    def handled(self, method, msg):
        now[0] = self.client_id
        try:
            return handle(self, method, msg)
        finally:
            now[0] = ""

    monkeypatch.setattr(ClientNode, "handle", handled)

    monkeypatch.setattr(_crypto, "random_bytes", draw)
    monkeypatch.setattr(_crypto, "generate_private",
                        lambda: x25519.X25519PrivateKey.from_private_bytes(draw(32)))
    monkeypatch.setattr(shamir.secrets, "token_bytes", draw)
    monkeypatch.setattr(SiteKeys, "generate", classmethod(
        lambda cls: cls(ed25519.Ed25519PrivateKey.from_private_bytes(draw(32)))))


def _set_up(monkeypatch, n_jobs, n=24):
    """The engine's set-up over the in-process runtime (recording every message) on a sparse
    graph of ``n`` clients, degree 6 and neighbourhood threshold 4."""
    import fedlatent.engine.secagg.graph as graph

    monkeypatch.setattr(graph, "plus_parameters", lambda n, p, **kw: (6, 4))
    _deterministic(monkeypatch)
    rng = np.random.default_rng(0)
    fd = fl.FederatedDataset.from_arrays({f"c{i:02d}": rng.normal(size=(5, 2))
                                          for i in range(n)})
    rt = fl.InProcessRuntime(fd, batched=False, record=True, n_jobs=n_jobs)
    rt._to_nodes()
    ch = SecureChannel(rt, {c: 5 for c in rt.client_ids}, threshold=13, bound=100.0, slots=4,
                       run="jobs-test")
    return ch.setup(), rt


def _workers_first(monkeypatch, wait=True):
    """With ``wait``, the runtime waits, at site 0 (the first it takes from the start, none
    being ready; the workers then skip it), until the workers reported every other site:
    their agreements are then the workers' (not a race the test could lose), site 0's too if
    a worker finished it before. The workers' ids and the offers taken are counted."""
    offer, seen = ahead_mod.Ahead.offer, {"taken": 0, "pids": []}

    def waiting_offer(self, i):
        if i == 0 and self._buf is not None:
            seen["pids"] += self.pids
            deadline = time.monotonic() + 30
            while wait and not self._done[1:].all() and time.monotonic() < deadline:
                self._drain()
                time.sleep(0.005)
        offer(self, i)

    monkeypatch.setattr(ahead_mod.Ahead, "offer", waiting_offer)
    from fedlatent.engine.secagg.enrol import Enrolment

    offered_for = Enrolment._offered_for

    def counted(self, keys):
        got = offered_for(self, keys)
        seen["taken"] += got is not None
        return got

    monkeypatch.setattr(Enrolment, "_offered_for", counted)
    return seen


def _by_site(log) -> dict:
    """A runtime's log as ``{(direction, site, method, its n-th such message): message}``."""
    seen: dict = {}
    out = {}
    for d, c, m, msg in log:
        k = seen[(d, c, m)] = seen.get((d, c, m), -1) + 1
        out[(d, c, m, k)] = msg
    return out


def _gone(pid: int) -> bool:
    """Whether process ``pid`` no longer exists (reaped: not even a zombie)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@needs_fork
@pytest.mark.parametrize("jobs, wait", [(2, True), (3, True), (2, False)])
def test_more_jobs_give_one_jobs_transcript_and_secrets(monkeypatch, jobs, wait):
    """Waiting: every site's agreements are the workers'; not waiting: as the race goes."""
    with monkeypatch.context() as m:
        ch1, rt1 = _set_up(m, 1)
        log1 = list(rt1.log)
        pairs1 = {c: dict(rt1._nodes[c].secagg._pair) for c in rt1.client_ids}
    seen = _workers_first(monkeypatch, wait)
    ch2, rt2 = _set_up(monkeypatch, jobs)
    assert len(seen["pids"]) == jobs - 1 and all(_gone(p) for p in seen["pids"])
    assert seen["taken"] == rt2.worker_sites and (not wait or rt2.worker_sites >= 23)
    assert rt2.worker_cpu > 0
    got, want = _by_site(rt2.log), _by_site(log1)  # (the sites may be handled in any order)
    assert got.keys() == want.keys()
    for key, a in want.items():  # every message, byte for byte
        b, cid = got[key], key[1]
        assert a.keys() == b.keys(), cid
        for k in a:
            assert type(a[k]) is type(b[k]), (cid, k)
            # exact: bytes, integers and key material, made by the same operations on the
            # same keys whichever process agreed them (no floating point in the set-up)
            assert_same(a[k], b[k], err_msg=f"{cid} {k}")
    for c in rt2.client_ids:  # and every pair's key block
        assert rt2._nodes[c].secagg._pair == pairs1[c]
        assert rt2._nodes[c].secagg._offered is None  # nothing offered is kept
    assert ch2.server.roster.graph.degree == 6


@needs_fork
def test_an_offer_for_other_keys_is_dropped_and_agreed_here():
    from cryptography.hazmat.primitives.asymmetric import x25519

    from fedlatent.engine.secagg.enrol import Enrolment

    e = Enrolment.__new__(Enrolment)
    keys = [_crypto.public_raw(x25519.X25519PrivateKey.generate()) for _ in range(3)]
    e.offer_agreements(b"".join(keys), bytes(range(96)))
    assert e._offered_for(keys) == [bytes(range(96))[i:i + 32] for i in (0, 32, 64)]
    assert e._offered is None  # taken once
    e.offer_agreements(b"".join(keys), bytes(96))
    assert e._offered_for(keys[::-1]) is None and e._offered is None  # other order: dropped
    e.offer_agreements(b"".join(keys), bytes(64))  # not one secret per key: never kept
    assert e._offered is None


@needs_fork
def test_the_worker_is_gone_when_the_step_fails(monkeypatch):
    pids = []
    start = ahead_mod.Ahead._start

    def spied(self):
        start(self)
        pids.extend(self.pids)

    monkeypatch.setattr(ahead_mod.Ahead, "_start", spied)
    from fedlatent.engine.secagg.enrol import Enrolment

    check = Enrolment.receive_peer_keys

    def failing(self, roster, trust=None):
        if self.id == "c10":  # a ValueError reaches the caller through the runtime
            raise ValueError("site c10 breaks in the middle of the roster step")
        return check(self, roster, trust)

    monkeypatch.setattr(Enrolment, "receive_peer_keys", failing)
    with pytest.raises(ValueError, match="c10 breaks"):
        _set_up(monkeypatch, 2)
    assert len(pids) == 1 and all(_gone(p) for p in pids)


def test_jobs_by_scikit_learns_convention():
    cores = joblib.cpu_count()
    assert [ahead_mod.effective_jobs(j) for j in (None, 1, 2, -1, -2, -9 - cores)] == [
        1, 1, 2, cores, max(1, cores - 1), 1]
    with pytest.raises(ValueError, match="n_jobs == 0"):
        ahead_mod.effective_jobs(0)


def test_elsewhere_one_job_said_plainly(monkeypatch):
    monkeypatch.setattr(ahead_mod, "can_fork", lambda: False)
    fd = fl.FederatedDataset.from_arrays({"a": np.zeros((3, 2)), "b": np.ones((3, 2))})
    with pytest.warns(RuntimeWarning, match="Linux only; here it runs them in this process"):
        rt = fl.InProcessRuntime(fd, n_jobs=2)
    assert rt._jobs == 1


@needs_fork
def test_a_failed_fork_stops_the_started_workers_and_runs_here(monkeypatch, caplog):
    forks, real = [], os.fork

    def second_fails():
        if forks:
            raise OSError("Resource temporarily unavailable")
        pid = real()
        if pid:
            forks.append(pid)
        return pid

    monkeypatch.setattr(ahead_mod.os, "fork", second_fails)
    with caplog.at_level("WARNING", logger="fedlatent.engine.secagg.ahead"):
        ch, rt = _set_up(monkeypatch, 3)  # two workers asked, the second cannot start
    assert "no worker process" in caplog.text and "1 job" in caplog.text
    assert len(forks) == 1 and _gone(forks[0]) and rt.worker_sites == 0
    assert all(len(rt._nodes[c].secagg._pair) == 6 for c in rt.client_ids)  # set up, here
