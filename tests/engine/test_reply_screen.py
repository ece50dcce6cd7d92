"""Issue 40 item 1: the reply screen at the speed of the E-step's own arithmetic.

The Gaussian mixture's replies are screened where they are (the compiled
``reply_bordered_kernel`` reads each moment matrix from the reply rows, rebuilt as the server
rebuilds them, ``((Q_c + S_hat) + V_c) n_c``, with their rounding slack), instead of building
the round's statistics and their slack first. The refusals must be the same: the certificate
is sound (what it certifies passes the exact test), it gives the answer of the parts' kernel
matrix by matrix, and on adversarial rows (near-singular, slightly indefinite, huge and tiny
scales, malformed) the compiled check flags exactly the rows the chunked NumPy check flagged,
a superset of what the exact check refuses."""

from __future__ import annotations

import numpy as np
import pytest

import fedlatent.models.gmm.batched as gb
from fedlatent.engine.contract.model import FederatedModel
from fedlatent.engine.protocol.psd_kernel import bordered_kernel, reply_bordered_kernel
from fedlatent.engine.protocol.reply_rows import ReplyRows
from fedlatent.engine.rounds.screen import REBUILD_EPS
from fedlatent.engine.stats import Stats
from fedlatent.models.gmm.model import GMMModel
from tolerance import assert_close, assert_same

K, D = 3, 4


def _template():
    return Stats({"nk": np.zeros(K), "sx": np.zeros((K, D)), "sxx": np.zeros((K, D, D))})


def _adversarial_rows(rng, C, scale):
    """Per-client mean statistics ``S_c / n_c`` of 1 to 7 weighted rows (singular moment
    matrices among them) whose features are of the order of ``scale``, with lies:
    slightly and clearly indefinite blocks, a border too long for its count, counts that do
    not add up, NaN. Row ``c`` is of kind ``c % 11`` (0, 7-10: honest; 2: honest up to
    rounding)."""
    m = rng.integers(1, 8, size=C)
    nk, sx, sxx = np.zeros((C, K)), np.zeros((C, K, D)), np.zeros((C, K, D, D))
    for c in range(C):
        X = rng.normal(size=(m[c], D)) * scale * 10.0 ** rng.uniform(-1, 1)
        q = rng.dirichlet(np.ones(K), size=m[c]) ** rng.choice([1.0, 8.0, 40.0])  # tiny ones
        q /= q.sum(1, keepdims=True)
        nk[c], sx[c] = q.sum(0), q.T @ X
        sxx[c] = np.einsum("mk,ma,mb->kab", q, X, X)
    n = m.astype(float)
    u = rng.normal(size=(C, D))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    kind = np.arange(C) % 11
    big = nk.argmax(axis=1)  # each lie in the client's largest component
    for c in range(C):
        k = big[c]
        lam = np.linalg.eigvalsh(sxx[c, k]).max()
        if kind[c] == 1:  # slightly indefinite: just beyond the tolerance
            sxx[c, k] -= np.outer(sx[c, k], sx[c, k]) / nk[c, k] + 1e-6 * lam * np.outer(
                u[c], u[c])
        elif kind[c] == 2:  # inside the tolerance: honest rounding
            sxx[c, k] -= 1e-13 * lam * np.outer(u[c], u[c])
        elif kind[c] == 3:  # clearly indefinite
            sxx[c, k] -= 0.5 * lam * np.eye(D)
        elif kind[c] == 4:  # a border longer than its count and moments allow
            sx[c, k] += 3.0 * np.sqrt(nk[c, k] * lam) * u[c]
    nk[kind == 5, 0] += 0.5  # counts not adding up to n
    sxx[kind == 6, 2, 1, 1] = np.nan
    flat = np.concatenate([nk, sx.reshape(C, -1), sxx.reshape(C, -1)], axis=1)
    return flat / n[:, None], n


def _reply(rng, C, with_v, rebuilt=True, scale=1.0):
    """Reply rows ``Q_c = S_c - S_hat - V_c`` of the adversarial statistics (``V_c`` of the
    size of the client's own statistic, in a row of its own of the mirror); not ``rebuilt``:
    ``Q_c = S_c`` (the initialization round's)."""
    S_c, n = _adversarial_rows(rng, C, scale)
    S = S_c[np.isfinite(S_c).all(axis=1)].mean(axis=0)
    V = vrow = None
    if with_v:
        vrow = rng.permutation(C + 5)[:C]
        V = np.zeros((C + 5, S_c.shape[1]))
        V[vrow] = rng.normal(size=S_c.shape) * np.abs(np.nan_to_num(S_c))
    Q = S_c - S[None, :] - (V[vrow] if with_v else 0.0) if rebuilt else S_c
    return Q, n, S, V, vrow


@pytest.mark.parametrize("scale", [1e-100, 1.0, 1e100])
@pytest.mark.parametrize("rebuilt, with_v", [(False, False), (True, False), (True, True)])
def test_the_compiled_reply_check_flags_what_the_numpy_check_flagged(rebuilt, with_v, scale):
    rng = np.random.default_rng(3 + 2 * rebuilt + with_v)
    C = 660
    Q, n, S, V, vrow = _reply(rng, C, with_v, rebuilt, scale)
    rows = rng.permutation(C)[: C - 60]
    view = ReplyRows(Q, rows, n[rows], S if rebuilt else None, V,
                     None if vrow is None else vrow[rows], _template(), REBUILD_EPS)
    model = GMMModel(K)
    with np.errstate(all="ignore"):
        compiled = gb.gaussian_row_suspects(view)
        numpy_way = FederatedModel.check_rows(model, view)  # the chunked blocks, as before
        stats = view.stats()
        exact = np.array([
            model.check(Stats({k: v[i] for k, v in stats.items()}, copy=False), view.n[i],
                        Stats({k: v[0] for k, v in view.slack(np.array([i])).items()},
                              copy=False) if rebuilt else None) is not None
            for i in range(len(view))])
    assert_same(compiled, numpy_way)  # booleans: the same rows flagged
    assert not (exact & ~compiled).any()  # every refusal of the exact check is flagged
    kinds = rows % 11
    assert exact[np.isin(kinds, [3, 4, 5])].all()  # the clear lies
    assert compiled[kinds == 6].all()  # NaN (the engine's generic check names it)
    assert exact[kinds == 1].mean() > 0.5  # just beyond the tolerance: most refused
    assert not exact[np.isin(kinds, [0, 2, 7, 8, 9, 10])].any()  # honest rows, any scale


@pytest.mark.parametrize("slack", [False, True])
def test_the_reply_kernel_is_the_parts_kernel_on_the_rebuilt_matrices(slack):
    rng = np.random.default_rng(17 + slack)
    C = 500
    Q, n, S, V, vrow = _reply(rng, C, True)
    rows = np.arange(C)
    view = ReplyRows(Q, rows, n, S, V, vrow, _template(), REBUILD_EPS)
    st = view.stats()
    f = REBUILD_EPS * (1.0 - 1e-9) * n
    with np.errstate(all="ignore"):
        got = reply_bordered_kernel(Q, rows, S, V, vrow, n, f, np.array([0, K, K + K * D]),
                                    K, D, slack, 1e-8, np.zeros(0), np.zeros(0),
                                    np.zeros(0, dtype=bool))
        parts = (st["nk"].reshape(-1), st["sx"].reshape(-1, D), st["sxx"].reshape(-1, D, D))
        plain = bordered_kernel(*parts, *parts, False, 1e-8).reshape(C, K)
        want = plain
        if slack:  # certified without the slack, or with it
            sl = view.slack(rows)
            eparts = (sl["nk"].reshape(-1), sl["sx"].reshape(-1, D), sl["sxx"].reshape(-1, D, D))
            want = plain | bordered_kernel(*parts, *eparts, True, 1e-8).reshape(C, K)
    assert 0.05 < (~got).mean() < 0.95  # both answers, often
    assert_same(got, want)  # booleans
    if slack:
        assert (want & ~plain).any()  # the slack certifies some the plain test leaves


def test_the_compiled_check_runs_where_numba_pays(monkeypatch):
    calls = []
    real = gb.gaussian_row_suspects
    monkeypatch.setattr(gb, "gaussian_row_suspects", lambda *a: calls.append(1) or real(*a))
    rng = np.random.default_rng(0)
    Q, n, S, V, vrow = _reply(rng, 40, True)
    view = ReplyRows(Q, np.arange(40), n, S, V, vrow, _template(), REBUILD_EPS)
    import fedlatent.engine.protocol.compiled as comp

    monkeypatch.setattr(comp, "ready", lambda: False)
    with np.errstate(all="ignore"):
        small = GMMModel(K).check_rows(view)
        assert calls == []  # a few matrices: NumPy
        monkeypatch.setattr(comp, "MIN_WORK", 40 * K)
        assert_same(GMMModel(K).check_rows(view), small)  # booleans
    assert calls == [1]


def _honest_reply(n_rows, lies):
    """Honest rows (the adversarial rows' honest kinds), and lies at the rows ``lies`` names:
    ``"psd"`` an indefinite moment matrix (kind 3), ``"huge"`` entries of 1e300, ``"nan"``
    one NaN, ``"inf"`` one infinite entry."""
    rng = np.random.default_rng(5)
    S_c, n = _adversarial_rows(rng, 11 * n_rows, 1.0)
    kind = np.arange(11 * n_rows) % 11
    take = np.flatnonzero(np.isin(kind, [0, 7, 8, 9, 10]))[:n_rows]
    psd = iter(np.flatnonzero(kind == 3))
    for r, what in lies.items():
        if what == "psd":
            take[r] = next(psd)
    Q, n = np.ascontiguousarray(S_c[take]), n[take]
    for r, what in lies.items():
        if what == "huge":
            Q[r] = 1e300
        elif what in ("nan", "inf"):
            Q[r, 5] = np.nan if what == "nan" else -np.inf
    return Q, n


LIES = [{}, {7: "psd"}, {0: "psd", 299: "psd"}, {3: "huge", 130: "nan", 250: "inf"},
        {200: "huge", 201: "psd"}]


@pytest.mark.parametrize("lies", LIES)
def test_the_screen_adds_the_weighted_sum_only_of_a_reply_it_accepts_whole(monkeypatch, lies):
    """The compiled check adds ``sum_c w_c Q_c`` and tests each row's size as it reads the
    rows (from the second span of rows on, the rows reach it untested); the screen hands the
    sum on only when every row was read and accepted. The refusals are the NumPy screen's,
    word for word (sizes, NaN, infinities, indefinite matrices, in any span); with a refused
    row there is no sum, and the collector's sum over the accepted rows leaves the liar out;
    the NumPy check never sums."""
    import fedlatent.engine.protocol.compiled as comp
    import fedlatent.engine.rounds.screen as scr
    from fedlatent.engine.fedem.federation import Federation
    from fedlatent.engine.node.batched import BatchReply
    from fedlatent.engine.rounds.batched_round import weighted_rows

    monkeypatch.setattr(scr, "_CHECK_SPAN", 64)  # five spans of rows
    monkeypatch.setattr(comp, "ready", lambda: False)
    Q, n = _honest_reply(300, lies)
    ids = [f"c{i:03d}" for i in range(len(n))]
    w = np.random.default_rng(1).uniform(0.5, 2.0, size=len(n))
    rep = BatchReply(np.arange(len(n)), Q, n, np.zeros(len(n)), _template())
    got = {}
    for compiled in (True, False):
        monkeypatch.setattr(comp, "MIN_WORK", 1 if compiled else 10**12)
        screen = scr.Screen(GMMModel(K), dict(zip(ids, n)), Federation(), ids)
        with np.errstate(all="ignore"):
            accepted, reasons = screen.screen(rep, "full", None, None, w)
        got[compiled] = reasons
        assert sorted(reasons) == sorted(lies)
        assert_same(accepted, ~np.isin(np.arange(len(n)), list(lies)))  # booleans
        if compiled and not lies:
            # the same products added in the same order (row after row, from the first row)
            assert_same(screen.total, weighted_rows(Q, w, accepted))
        else:
            assert screen.total is None  # (the collector then sums the accepted rows apart)
    assert got[True] == got[False]  # the same reasons, word for word
    honest = ~np.isin(np.arange(len(n)), list(lies))
    with np.errstate(all="ignore"):
        kept = weighted_rows(Q, w, accepted)
    assert np.isfinite(kept).all()  # no lie reached it
    assert_close(kept, weighted_rows(Q[honest], w[honest], np.ones(honest.sum(), dtype=bool)))
