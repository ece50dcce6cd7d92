"""The batched path at scale (issue 13): the compiled PSD screen of the replies' moment
matrices, and the chunked client step and server screen, which must change the result by no
more than rounding (relative 1e-12, tests/tolerance.py) and no word of a refusal."""

import warnings

import numpy as np
import pytest
from test_batched import (
    FEDEM,
    TamperBatched,
    TamperOne,
    _fitted_arrays,
    _ragged,
    _shift_batched,
    _shift_one,
)

import fedlatent as fl
import fedlatent.engine.node.batched as eb
import fedlatent.engine.rounds.batched_round as ebr
import fedlatent.models.gmm.batched as gb
from fedlatent.engine.fedem.update import _weighted_sum
from fedlatent.engine.protocol.messages import psd_failures
from fedlatent.engine.protocol.psd_screen import bordered_certified, psd_certified
from fedlatent.engine.rounds.batched_round import weighted_rows
from fedlatent.engine.transport.inprocess import InProcessRuntime
from fedlatent.models.gmm.batched import gaussian_moments, gaussian_suspects
from fedlatent.models.gmm.model import gaussian_problem
from tolerance import assert_close, assert_same


def _moments(rng, N, p, rows):
    """N moment matrices ``sum_r q_r [1, u_r][1, u_r]^T`` of ``rows`` rows in dimension p,
    with weights from 1 down to 1e-30 (nearly singular ones among them)."""
    U = rng.normal(size=(N, rows, p))
    U[:, :, 0] = 1.0
    q = 10.0 ** rng.uniform(-30, 0, size=(N, rows))
    return np.einsum("nr,nri,nrj->nij", q, U, U)


def _near_boundary(rng, N, p, rtol=1e-8):
    """Unit-diagonal matrices whose smallest eigenvalue is within a few tolerances of the
    limit ``-rtol p`` of ``psd_failures``, on both sides."""
    A = rng.normal(size=(N, p, p))
    Qm, _ = np.linalg.qr(A)
    lam = rng.uniform(0.5, 2.0, size=(N, p))
    lam[:, 0] = -rtol * p * rng.uniform(0.0, 3.0, size=N)
    M = np.einsum("nij,nj,nkj->nik", Qm, lam, Qm)
    s = np.sqrt(np.diagonal(M, axis1=1, axis2=2))
    return M / (s[:, :, None] * s[:, None, :]) * rng.uniform(0.1, 1e3, size=(N, 1, 1))


@pytest.mark.parametrize("p", [2, 5, 9])
def test_a_certified_matrix_passes_the_exact_test(p):
    rng = np.random.default_rng(p)
    M = np.concatenate([_moments(rng, 3000, p, 12), _moments(rng, 500, p, p - 1),
                        _near_boundary(rng, 3000, p)])
    ok = psd_certified(M)
    failed = np.zeros(len(M), dtype=bool)
    failed[psd_failures(M)] = True
    assert not (ok & failed).any()  # a certificate is never wrong
    assert ok[:3500].all()  # honest sums of rows are certified (however singular)
    # near the boundary both answers occur, and the screen certifies every matrix whose
    # scaled smallest eigenvalue is above -0.4 rtol p (it certifies down to -0.5 rtol p)
    assert failed[3500:].sum() > 300 and (~failed[3500:]).sum() > 300
    s = np.sqrt(np.diagonal(M, axis1=1, axis2=2))
    lam = np.linalg.eigvalsh(M / (s[:, :, None] * s[:, None, :]))[:, 0]
    clear = lam > -0.4e-8 * p
    assert clear[3500:].sum() > 50 and ok[clear].all()


@pytest.mark.parametrize("with_slack", [False, True])
def test_psd_failures_screened_first_gives_the_answer_of_the_eigenvalue_test(with_slack):
    from fedlatent.engine.protocol.messages import _psd_failures

    rng = np.random.default_rng(5)
    M = np.concatenate([_moments(rng, 300, 4, 6), _near_boundary(rng, 2000, 4)])
    M[::11, 0, 0] *= -1.0
    M[7, 1, 2] = np.nan
    E = np.nan_to_num(np.abs(M)) * 1e-8 * rng.uniform(0, 2, size=M.shape) if with_slack else None
    with np.errstate(all="ignore"):
        want = _psd_failures(M, E, 1e-8)
    got = psd_failures(M, E)
    assert_same(got, want)  # indices of the refused matrices
    assert 100 < got.size < len(M) - 300 and 7 in got


def test_the_certificate_widens_by_the_slack_as_the_exact_test_does():
    rng = np.random.default_rng(7)
    M = _near_boundary(rng, 4000, 6)
    E = np.abs(M) * 1e-8 * rng.uniform(0, 2, size=M.shape)
    ok, ok_e = psd_certified(M), psd_certified(M, E)
    failed = np.zeros(len(M), dtype=bool)
    failed[psd_failures(M, E)] = True
    assert not (ok_e & failed).any()
    assert ok_e.sum() > ok.sum()  # the slack lets more through, as in psd_failures
    assert (ok_e | ~ok).all()


def test_the_screen_refuses_non_finite_values_a_negative_diagonal_and_a_lying_triangle():
    M = np.repeat(np.eye(3)[None], 5, axis=0)
    M[1, 0, 2] = np.nan
    M[2, 2, 1] = np.inf
    M[3, 1, 1] = -1e-300
    M[4, 2, 0], M[4, 0, 2] = 0.5, 3.0  # the lower triangle is PSD; the matrix is not
    assert psd_certified(M).tolist() == [True, False, False, False, False]
    assert psd_failures(M[4:]).tolist() == [0]
    assert psd_certified(np.zeros((0, 4, 4))).shape == (0,)


def test_the_bordered_certificate_reads_each_matrix_from_its_parts():
    rng = np.random.default_rng(3)
    M = np.concatenate([_moments(rng, 500, 5, 8), _near_boundary(rng, 1500, 5)])
    M[::7, 1:, 1:] *= 0.999  # some lies
    M[3, 2, 0] = np.nan  # a non-finite border entry (the other triangle is not read)
    E = np.abs(M) * 1e-9
    parts = (M[:, 0, 0], M[:, 1:, 0], M[:, 1:, 1:])
    eparts = (E[:, 0, 0], E[:, 1:, 0], E[:, 1:, 1:])
    Msym = M.copy()
    Msym[3, 0, 2] = np.nan
    got, want = bordered_certified(*parts), psd_certified(Msym)
    assert_same(got, want)  # booleans
    assert_same(bordered_certified(*parts, eparts), psd_certified(Msym, E))
    assert 0 < got.sum() < len(M) and not got[3]


def _gmm_stats(rng, C, m, d, K, cov):
    from fedlatent.models.gmm.batched import gmm_batched_stats

    X = rng.normal(size=(C, m, d)) * rng.choice([1e-3, 1.0, 1e3], size=(C, 1, 1))
    prec = {"full": np.repeat(np.eye(d)[None], K, 0) * 0.3, "diag": np.full((K, d), 0.3),
            "tied": np.eye(d) * 0.3}[cov]
    params = {"weights": np.full(K, 1 / K), "means": rng.normal(size=(K, d)),
              "precisions_cholesky": prec, "center": np.zeros(d)}
    st = gmm_batched_stats(params, X, np.ones((C, m)), cov, {}).stats
    return {k: v.copy() for k, v in st.items()}


@pytest.mark.parametrize("cov", ["full", "diag", "tied"])
def test_gaussian_suspects_are_the_clients_gaussian_problem_refuses(cov, monkeypatch):
    monkeypatch.setattr(gb, "_SCREEN_CHUNK", 37)  # many chunks
    rng = np.random.default_rng(11)
    C, m, d, K = 400, 6, 3, 3
    st = _gmm_stats(rng, C, m, d, K, cov)
    lie = rng.random(C) < 0.15
    factor = rng.choice([-1.0, 0.3, 1 - 1e-9], size=lie.sum())
    st["sxx"][lie] *= factor.reshape((-1,) + (1,) * (st["sxx"].ndim - 1))
    negative = np.flatnonzero(lie)[factor < 0]
    S_hat = {k: v.mean(0) for k, v in st.items()}
    S = {k: (st[k] - S_hat[k]) + S_hat[k] for k in st}  # rebuilt: rounding, within slack
    S["sx"][5, 0] = np.nan
    slack = {k: 64 * np.finfo(float).eps * (np.abs(st[k] - S_hat[k]) + np.abs(S_hat[k]))
             for k in st}
    n = np.full(C, float(m))
    asked = []

    def lazy(rows):
        asked.append(np.asarray(rows).copy())
        return {k: v[rows] for k, v in slack.items()}

    for sl in (None, slack, lazy):
        got = gaussian_suspects(S, n, cov, sl)
        truth = np.array([gaussian_problem({k: v[i] for k, v in S.items()}, m, cov,
                                           None if sl is None else
                                           {k: v[i] for k, v in slack.items()}) is not None
                          for i in range(C)])
        assert_same(got, truth)  # booleans
    assert negative.size > 10 and truth[negative].all() and truth[5]
    assert truth.sum() < C // 2
    flagged = np.unique(np.concatenate(asked))
    assert 0 < flagged.size < C  # the slack is asked only for the clients flagged without it


@pytest.mark.parametrize("A", [1, 3, 2048, 2049, 5000])
def test_chunked_weighted_sum_is_the_sum_in_client_order(A):
    rng = np.random.default_rng(A)
    Q = rng.normal(size=(A, 50)) * 10.0 ** rng.uniform(-8, 8, size=(A, 1))
    w = rng.random(A)
    for mask in (np.ones(A, dtype=bool), rng.random(A) < 0.6):
        mask[0] = True
        # exact: both make the same products and add them row after row in client order
        # with elementwise numpy adds (no BLAS, no blocking): the same operations in one order
        assert_same(weighted_rows(Q, w, mask)[0], _weighted_sum(Q[mask], w[mask]))
    assert weighted_rows(Q, w, np.zeros(A, dtype=bool)).shape == (0, 50)


@pytest.fixture
def tiny_chunks(monkeypatch):
    """Chunks of a few clients in every batched stage, so a small federation crosses many
    chunk boundaries."""
    monkeypatch.setattr(eb, "_CHUNK_ROWS", 40)
    monkeypatch.setattr(eb, "_CHUNK", 3)
    monkeypatch.setattr(ebr, "_CHUNK", 4)
    monkeypatch.setattr(gb, "_SCREEN_CHUNK", 2)


@pytest.mark.usefixtures("saturation_rule_off")
@pytest.mark.parametrize("fed", [
    fl.Federation(), FEDEM, fl.Federation(step_size=0.5, batch_size=7, random_state=1),
    fl.Federation(participation=0.6, control_variates=True, step_size=0.5, random_state=3)],
    ids=["plain", "fedem", "mini-batch", "partial-cv"])
@pytest.mark.parametrize("sizes", ["ragged", "equal"])
def test_chunked_batched_path_equals_the_per_client_path_to_1e12(fed, sizes, tiny_chunks):
    """Ragged sizes: many buckets, each reply finished after the step; equal sizes: one
    bucket, each chunk finished (mean, differences, quantizer, V_c) as soon as computed."""
    if sizes == "ragged":
        fd = _ragged(n_clients=17, seed=8)
    else:
        rng = np.random.default_rng(8)
        fd = fl.FederatedDataset.from_arrays(
            {f"c{i:02d}": rng.normal(size=(9, 3)) + 3.0 * (i % 3) for i in range(17)})

    def fit(batched):
        rt = InProcessRuntime(fd, batched=batched)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est = fl.FederatedGaussianMixture(3, max_rounds=6, tol=0.0, random_state=0,
                                              federation=fed).fit(fd, runtime=rt)
        return est, rt

    (one, rt1), (many, rtb) = fit(False), fit(True)
    assert rtb.batched_calls >= many.n_iter_ and rt1.batched_calls == 0
    a, b = _fitted_arrays(one), _fitted_arrays(many)
    assert a.keys() == b.keys() and len(a) >= 3
    for k in a:
        assert_close(a[k], b[k], err_msg=k)
    assert_close(one.history_.to_frame()["objective"], many.history_.to_frame()["objective"])
    sa, sb = rt1.get_client_states(), rtb.get_client_states()
    for c in sa:
        assert sa[c].keys() == sb[c].keys()
        for key in sa[c]:
            assert_close(sa[c][key], sb[c][key], err_msg=f"{c} {key}")


#: partial participation and control variates without a quantizer: the server rebuilds
#: S_c = Q_c + S_hat + V_c exactly and checks it
PARTIAL_CV = fl.Federation(participation=0.6, control_variates=True, step_size=0.5,
                           random_state=3)


@pytest.mark.usefixtures("saturation_rule_off")
def test_a_lie_in_a_later_chunk_is_refused_with_the_per_client_reason(tiny_chunks):
    fd = _ragged(n_clients=12, seed=5)
    victim = fd.client_ids[10]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rt = TamperBatched(fd, victim, _shift_batched)
        many = fl.FederatedGaussianMixture(2, max_rounds=6, tol=0.0, random_state=0,
                                           federation=PARTIAL_CV).fit(fd, runtime=rt)
        one = fl.FederatedGaussianMixture(2, max_rounds=6, tol=0.0, random_state=0,
                                          federation=PARTIAL_CV).fit(
            fd, runtime=TamperOne(fd, victim, _shift_one))
    assert rt.batched_calls > 0
    rej_b, rej_1 = [r.rejected for r in many.history_], [r.rejected for r in one.history_]
    assert rej_b == rej_1
    took_part = [r for r in rej_b[2:] if victim in r]
    assert took_part and all("not positive semi-definite" in r[victim] for r in took_part)
    assert_close(many.means_, one.means_)


def test_moment_matrices_of_every_covariance_type_have_the_documented_layout():
    rng = np.random.default_rng(0)
    st = _gmm_stats(rng, 4, 5, 2, 3, "full")
    M = gaussian_moments(st["nk"], st["sx"], st["sxx"], "full")
    assert M.shape == (12, 3, 3)
    assert_same(M[4, 0, 0], st["nk"][1, 1])  # copies of the entries
    assert_same(M[4, 1:, 1:], st["sxx"][1, 1])
