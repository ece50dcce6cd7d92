"""Issue 23 item 3 (the 100,000-client whole fit): once numba's compiler runs in the process
(the GMM start's client kernels), the replies' PSD screen of bordered moment matrices runs
compiled. It is the NumPy screen's test, matrix by matrix: the same answer on every kind of
matrix, with and without slack; it is used only when numba is already set up (a process that
compiled nothing stays on NumPy and never imports numba for it); a lying client's non-PSD
block is still refused and named on that path."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import fedlatent as fl
import fedlatent.engine.protocol.psd_screen as ps
import fedlatent.models.gmm.batched as gb
from fedlatent.engine.protocol.psd_kernel import bordered_kernel
from fedlatent.engine.transport.inprocess import InProcessRuntime
from tolerance import assert_same

ROOT = Path(__file__).resolve().parents[2]


def _warm():
    """numba's compiler set up in this process (as the GMM start leaves it)."""
    x = np.ones(2)
    bordered_kernel(x, np.zeros((2, 1)), np.ones((2, 1, 1)), x, np.zeros((2, 1)),
                    np.ones((2, 1, 1)), False, 1e-8)
    assert ps._kernel_ready()


def _bordered_stack(rng, N, q):
    """Parts of honest moment matrices [[n, s^T], [s, S]] of 1 to q + 3 weighted rows (rank
    deficient ones, tiny ones), rounding noise on some, and each kind of lie or malformation."""
    rows = rng.integers(1, q + 4, size=N)
    c, b, A = np.zeros(N), np.zeros((N, q)), np.zeros((N, q, q))
    for r in np.unique(rows):
        at = np.flatnonzero(rows == r)
        w = rng.random((at.size, r)) * 10.0 ** rng.uniform(-14, 0, size=(at.size, 1))
        X = rng.normal(size=(at.size, r, q))
        c[at], b[at] = w.sum(1), np.einsum("nr,nri->ni", w, X)
        A[at] = np.einsum("nr,nri,nrj->nij", w, X, X)
    A[::5] += rng.normal(size=(N, q, q))[::5] * 1e-16  # rounding noise (not symmetric)
    b[1::11, 0] += 30.0  # a lying border
    A[2::11, -1, -1] = -1e-3  # a negative diagonal
    A[3::11, 1, 0] = np.nan
    c[4::11] = np.inf
    A[5::11, 0, 1] += 1e-2  # not symmetric: the symmetric part is what counts
    c[6::11] = -1e-300  # a negative count
    A[7::11] -= 1e-9 * np.eye(q)  # just outside the cone
    return c, b, A


@pytest.mark.parametrize("with_slack", [False, True])
def test_the_compiled_screen_gives_the_numpy_screens_answer_matrix_by_matrix(with_slack):
    rng = np.random.default_rng(7 + with_slack)
    N, q = 3000, 8
    parts = _bordered_stack(rng, N, q)
    eparts = None
    if with_slack:
        eparts = tuple(np.where(np.isfinite(v), np.abs(v), 0.0) * 10.0 ** rng.uniform(
            -16, -6, size=(N,) + (1,) * (v.ndim - 1)) for v in parts)
        eparts[1][8::11] = np.inf  # a slack bound not finite: never certified
    with np.errstate(all="ignore"):  # (as bordered_certified calls it)
        numpy_way = ps._screen(N, ps._Bordered(list(parts), None if eparts is None else
                                               list(eparts)), 1e-8, with_slack)
    got = bordered_kernel(*parts, *(parts if eparts is None else eparts), with_slack, 1e-8)
    assert 0.05 * N < (~numpy_way).sum() < 0.95 * N  # both answers occur, often
    assert_same(got, numpy_way)  # booleans: which matrices pass


def test_bordered_certified_runs_compiled_once_numba_is_set_up(monkeypatch):
    _warm()
    calls = []
    real = ps._bordered_compiled
    monkeypatch.setattr(ps, "_bordered_compiled", lambda *a: calls.append(1) or real(*a))
    parts = _bordered_stack(np.random.default_rng(3), 200, 4)
    want = ps._screen(200, ps._Bordered(list(parts), None), 1e-8, False)
    assert_same(ps.bordered_certified(*parts), want)  # booleans
    assert calls == [1]
    assert_same(ps.bordered_certified(*(v[:5] for v in parts)), want[:5])
    assert calls == [1]  # a few matrices: LAPACK, as before
    with pytest.raises(ValueError, match="broadcast"):  # parts that do not fit: not compiled
        ps.bordered_certified(parts[0][:-1], parts[1], parts[2])
    assert calls == [1]


def test_a_process_that_compiled_nothing_screens_with_numpy_and_no_numba():
    code = ("import sys, numpy as np\n"
            "import fedlatent.engine.protocol.psd_screen as ps\n"
            "m = 40; A = np.repeat(np.eye(3)[None], m, 0); A[7, 0, 0] = -1.0\n"
            "ok = ps.bordered_certified(np.ones(m), np.zeros((m, 3)), A)\n"
            "print(np.flatnonzero(~ok).tolist(), ps._kernel_ready(), 'numba' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    assert out.stdout.split("\n")[0] == "[7] False False"


class _Tamper(InProcessRuntime):
    """Lowers one entry of the victim's second moments in the batched E-step replies from
    round 3 on: a block no rows can give."""

    def __init__(self, fd, victim):
        super().__init__(fd)
        self.victim = fd.client_ids.index(victim)
        self.calls = 0

    def call_batched(self, method, idx, msg, resets=None):
        rep = super().call_batched(method, idx, msg, resets)
        if method == "estep" and int(msg["round"]) >= 3 and self.victim in idx:
            r = int(np.flatnonzero(idx == self.victim)[0])
            rep.Q[r, 2 + 2 * 3] -= 1e3  # sxx[0, 0, 0] (after nk (2,) and sx (2, 3))
        return rep


@pytest.mark.usefixtures("saturation_rule_off")
def test_a_lying_clients_non_psd_block_is_refused_and_named_on_the_compiled_path(monkeypatch):
    _warm()
    calls = []
    real = gb.gaussian_row_suspects  # the rounds' compiled screen, reading the reply rows
    monkeypatch.setattr(gb, "gaussian_row_suspects", lambda *a: calls.append(1) or real(*a))
    rng = np.random.default_rng(5)
    fd = fl.FederatedDataset.from_arrays(
        {f"c{i:02d}": rng.normal(size=(int(rng.integers(8, 30)), 3)) + 3.0 * (i % 3)
         for i in range(20)})  # 20 clients, K = 2: 40 moment matrices a round
    victim = fd.client_ids[13]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = fl.FederatedGaussianMixture(2, max_rounds=5, tol=0.0, random_state=0).fit(
            fd, runtime=_Tamper(fd, victim))
    assert calls  # the rounds' screen ran compiled
    rejected = [r.rejected for r in est.history_]
    assert not rejected[0] and not rejected[1]
    assert all(list(r) == [victim] for r in rejected[2:])
    assert all("not positive semi-definite" in r[victim] for r in rejected[2:])
