"""The forward M-step check's compiled kernel against the NumPy check it stands in for
(``full_step_holds(..., compiled=False)``, the check as it was): the same decision wherever the
decision does not hang on the last bits, the same quantities within what the check's
argument allows, False on every NaN, infinity, broken structure or shape, and no input
compiling another specialization. The check takes the kernel only where numba is set up in
the process already (the tests that compare force it: ``compiled``)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedlatent.engine.node.replay import REPLAY_RTOL, params_refusal
from fedlatent.engine.stats import Stats
from fedlatent.models.gmm import _check_kernel, check_step
from fedlatent.models.gmm._check_kernel import factor_parts, factor_step_holds
from fedlatent.models.gmm.check_step import full_step_holds
from fedlatent.models.gmm.math import gmm_full_parts
from fedlatent.models.gmm.model import GMMModel
from fresh_process import in_fresh_process
from tolerance import assert_close

_U = np.finfo(np.float64).eps / 2


@pytest.fixture
def compiled(monkeypatch):
    """``full_step_holds`` through the kernel, whether or not numba is set up already."""
    monkeypatch.setattr(check_step, "worth", lambda work: True)


def _stats(rng, K: int, d: int, flat: float | None) -> Stats:
    """Mean statistics of K clusters of correlated features (scales spread over e^{+-2} per
    feature: condition numbers up to ~1e4), component 0 flattened to ``flat`` times its
    largest eigenvalue when given (the server's floor then acts or comes close)."""
    n = 40 * K * (d + 1)
    mix = rng.normal(size=(d, d)) * np.exp(rng.uniform(-2, 2, d))
    X = rng.normal(0, 3, (K, d))[rng.integers(0, K, n)] + rng.normal(size=(n, d)) @ mix
    r = rng.dirichlet(np.full(K, rng.uniform(0.3, 3)), n)
    nk, sx, sxx = r.mean(0), r.T @ X / n, np.einsum("nk,ni,nj->kij", r, X, X) / n
    if flat is not None:
        mc = sx[0] / nk[0]
        vals, vecs = np.linalg.eigh(sxx[0] / nk[0] - np.outer(mc, mc))
        vals[0] = flat * vals[-1]
        sxx[0] = ((vecs * vals) @ vecs.T + np.outer(mc, mc)) * nk[0]
    return Stats({"nk": nk, "sx": sx, "sxx": sxx})


def _cases(seed: int, count: int = 60):
    """(S, sent, centre, reg) of random shapes and conditions: the honest server's
    parameters, or with its factors moved by 1e-16 to 1e-5 of their largest entry."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        K, d = int(rng.integers(1, 6)), int(rng.integers(1, 7))
        flat = 10 ** rng.uniform(-9, -2) if rng.random() < 0.3 else None
        S = _stats(rng, K, d, flat)
        model, centre = GMMModel(K), rng.normal(size=d)
        sent = model.server_step(S, {"center": centre}, 500.0)
        if rng.random() < 0.6:
            U = sent["precisions_cholesky"]
            move = 10 ** rng.uniform(-16, -5) * np.abs(U).max()
            sent["precisions_cholesky"] = U + move * np.triu(rng.normal(size=U.shape))
        yield S, sent, centre, model.reg


def _decide(parts, d: int, rtol: float) -> bool:
    """The check's acceptance test on ``(e, u2, top, g, t_diagonal, t_columns)``."""
    e, u2, top, _, t1, t2 = parts
    if not (4 * (d + 1) * e <= 1 and e * math.sqrt(d * u2) <= 0.2 * rtol * top):
        return False
    low = (1 - e) / u2
    return bool(low > t1 or low > t2)


def _rounding(parts, d: int) -> float:
    """How far two computations of ``e`` may be apart: each computed ``||U^T G U - I||_F`` is
    within ``2 gamma_d ||U||_F^2 ||G||_F`` of the exact one (two products of d terms, any
    order), less than ``e``'s rounding term ``2 (d + 2) u ||U||_F^2 ||G||_F``; twice that,
    and 1e-12 of ``e`` for the norm's own rounding."""
    e, u2, _, g = parts[:4]
    return 2 * (2 * (d + 2) * _U * u2 * g) + 1e-12 * e


def _parts(S, sent, centre, reg):
    G = gmm_full_parts(S, centre, reg)[2]
    U = sent["precisions_cholesky"]
    ours = factor_parts(U, G, S["sxx"], S["sx"], float(sum(S["nk"].tolist())))
    return ours, _numpy_parts(S, U, G), U.shape[1]


def _numpy_parts(S, U: np.ndarray, G: np.ndarray) -> tuple[float, ...]:
    """``(e, u2, top, g, t_diagonal, t_columns)`` as the NumPy check computes them (NaN where
    ``U`` is not upper triangular with a positive diagonal)."""
    K, d = S["sx"].shape
    fixed = check_step._fixed(K, d)
    e, u2, top, g = check_step._factor_error(U, G, fixed)
    if math.isnan(e):
        return e, u2, top, g, math.nan, math.nan
    n = sum(S["nk"].tolist())
    return (e, u2, top, g, *(check_step._floor(S, n, g, U, fixed, pooled_diagonal=p)
                             for p in (True, False)))


@pytest.mark.parametrize("seed", range(6))
def test_the_kernels_decision_is_the_numpy_checks_away_from_the_threshold(seed, compiled):
    """Where moving ``e`` by what the two computations may differ in, and each floor by 1e-12,
    cannot change the decision, the kernel's decision is the NumPy check's; both decisions
    occur, and few cases are that close. Whatever the kernel accepts, the replay accepts."""
    decided, close = [], 0
    for S, sent, centre, reg in _cases(seed):
        ours, ref, d = _parts(S, sent, centre, reg)
        new = full_step_holds(S, sent, centre, reg, REPLAY_RTOL)
        old = full_step_holds(S, sent, centre, reg, REPLAY_RTOL, compiled=False)
        assert type(new) is bool
        if new:
            replayed = GMMModel(len(S["nk"])).server_step(S, {"center": centre}, 500.0)
            assert params_refusal(sent, replayed, 2, "c") is None
        if not math.isnan(ref[0]):
            slack, e, t = _rounding(ref, d), ref[0], np.array(ref[4:])
            lo = _decide((max(e - slack, 0.0), *ref[1:4], *(t * (1 - 1e-12))), d, REPLAY_RTOL)
            hi = _decide((e + slack, *ref[1:4], *(t * (1 + 1e-12))), d, REPLAY_RTOL)
            if lo != hi:
                close += 1
                continue
        assert new == old, (seed, len(decided))
        decided.append(new)
    assert close <= 12 and 10 <= sum(decided) <= len(decided) - 10


@pytest.mark.parametrize("seed", range(6))
def test_the_kernels_quantities_are_the_numpy_checks(seed, compiled):
    """``u2``, ``top``, ``g`` and both floors to 1e-12; ``e`` within the two computations'
    rounding bound (for honest factors ``U^T G U - I`` is rounding alone: no relative
    agreement is promised there)."""
    for S, sent, centre, reg in _cases(seed):
        ours, ref, d = _parts(S, sent, centre, reg)
        if math.isnan(ref[0]):  # (a move put a negative entry on a diagonal)
            assert all(math.isnan(v) for v in ours)
            continue
        assert abs(ours[0] - ref[0]) <= _rounding(ref, d)
        assert ours[0] >= 2 * (d + 2) * _U * ours[1] * ours[3]  # (its rounding term)
        assert_close(np.array(ours[1:]), np.array(ref[1:]), err_msg=f"seed {seed}")


@pytest.mark.parametrize("scale, column", [(1e155, 2), (1e160, 0), (1e160, 3), (1e300, 1)])
def test_an_overflowing_column_gives_the_numpy_checks_quantities(scale, column, compiled):
    """A factor's column so large that its Rayleigh quotient overflows (inf - inf): ``e``
    and ``u2`` infinite, the columns' floor NaN (no bound), the axes' floor as it was."""
    S, sent, centre, reg = _honest()
    sent = {**sent, "precisions_cholesky": sent["precisions_cholesky"].copy()}
    sent["precisions_cholesky"][0, :, column] *= scale
    with np.errstate(all="ignore"):
        ours, ref, _ = _parts(S, sent, centre, reg)
    assert math.isinf(ours[0]) and math.isnan(ours[5])
    assert_close(np.array(ours), np.array(ref))
    assert full_step_holds(S, sent, centre, reg, REPLAY_RTOL) is False


def _honest(seed: int = 3, K: int = 3, d: int = 4):
    rng = np.random.default_rng(seed)
    S = _stats(rng, K, d, None)
    centre = rng.normal(size=d)
    model = GMMModel(K)
    return S, model.server_step(S, {"center": centre}, 500.0), centre, model.reg


def _factor(sent, at, value):
    out = {k: v.copy() for k, v in sent.items()}
    out["precisions_cholesky"][at] = value
    return out


@pytest.mark.parametrize("at, value", [
    ((0, 0, 0), np.nan), ((1, 2, 3), np.nan), ((2, 3, 1), np.nan), ((1, 1, 1), np.inf),
    ((0, 0, 3), np.inf), ((2, 1, 2), -np.inf), ((1, 2, 2), -0.5), ((0, 3, 3), 0.0),
    ((2, 0, 0), -0.0), ((1, 3, 0), 1e-300), ((0, 1, 0), -1e-300), ((2, 2, 3), 1e200),
    ((0, 0, 1), "moved"), ((2, 3, 3), "moved")])
def test_nan_inf_a_broken_structure_or_a_1e6_move_never_hold(at, value, compiled):
    """A factor entry NaN or infinite, a diagonal entry not positive, a lower entry not
    exactly 0, an overflow, a 1e-6 move: False from both (the replay then refuses)."""
    S, honest, centre, reg = _honest()
    assert full_step_holds(S, honest, centre, reg, REPLAY_RTOL) is True
    if value == "moved":
        value = honest["precisions_cholesky"][at] + 1e-6 * np.abs(
            honest["precisions_cholesky"]).max()
    sent = _factor(honest, at, value)
    assert full_step_holds(S, sent, centre, reg, REPLAY_RTOL) is False
    with np.errstate(all="ignore"):
        assert full_step_holds(S, sent, centre, reg, REPLAY_RTOL, compiled=False) is False


@pytest.mark.parametrize("name, at, value", [
    ("sxx", (0, 1, 1), np.nan), ("sxx", (1, 0, 2), np.inf), ("sxx", (2, 3, 0), np.nan),
    ("sx", (1, 2), np.nan), ("sx", (0, 0), -np.inf), ("nk", (2,), 0.0), ("nk", (0,), np.nan),
    ("nk", (1,), -0.1)])
def test_statistics_nan_inf_or_a_zero_count_never_hold(name, at, value, compiled):
    """The honest parameters checked against statistics with an entry NaN or infinite, or a
    count not positive: False from both."""
    S, sent, centre, reg = _honest()
    bad = {k: v.copy() for k, v in S.items()}
    bad[name][at] = value
    with np.errstate(all="ignore"):
        assert full_step_holds(Stats(bad), sent, centre, reg, REPLAY_RTOL) is False
        assert full_step_holds(Stats(bad), sent, centre, reg, REPLAY_RTOL,
                               compiled=False) is False


@pytest.mark.parametrize("name, at, value", [
    ("sxx", (0, 1, 1), np.nan), ("sxx", (1, 0, 2), np.inf), ("sx", (2, 3), np.nan),
    ("sx", (0, 1), np.inf), ("n", None, np.nan), ("n", None, np.inf), ("n", None, 0.0),
    ("rtol", None, np.nan)])
def test_the_kernel_holds_nothing_from_a_statistic_nan_or_infinite(name, at, value):
    """Called on the honest factors and covariances, with one statistic NaN or infinite (a
    cross-product the axes' floor alone would not read), ``n`` not a positive number or the
    tolerance NaN: False."""
    S, sent, centre, reg = _honest()
    G = gmm_full_parts(S, centre, reg)[2]
    args = {"sxx": S["sxx"].copy(), "sx": S["sx"].copy(), "n": float(sum(S["nk"].tolist())),
            "rtol": check_step._SHARE * REPLAY_RTOL}
    U = sent["precisions_cholesky"]
    assert factor_step_holds(U, G, args["sxx"], args["sx"], args["n"], args["rtol"]) is True
    if at is None:
        args[name] = value
    else:
        args[name][at] = value
    assert factor_step_holds(U, G, args["sxx"], args["sx"], args["n"], args["rtol"]) is False


def test_other_shapes_fail_closed_in_the_kernel():
    """Shapes that do not match (numba does not check bounds): False and NaN, nothing read
    out of an array."""
    S, sent, centre, reg = _honest()
    G = gmm_full_parts(S, centre, reg)[2]
    U, sxx, sx = sent["precisions_cholesky"], S["sxx"], S["sx"]
    n = float(sum(S["nk"].tolist()))
    wrong = [(U[:, :3, :].copy(), G, sxx, sx), (U, G[:2].copy(), sxx, sx),
             (U, G[:, :3, :3].copy(), sxx, sx), (U, G, sxx[:2].copy(), sx),
             (U, G, sxx[:, :3].copy(), sx), (U, G, sxx, sx[:, :3].copy()),
             (U, G, sxx, sx[:2].copy())]
    for args in wrong:
        assert factor_step_holds(*args, n, check_step._SHARE * REPLAY_RTOL) is False
        parts = factor_parts(*args, n)
        assert math.isnan(parts[0]) or (math.isnan(parts[4]) and math.isnan(parts[5]))


def test_no_input_compiles_another_specialization(compiled):
    """Read-only statistics and factors (a message's arrays), a view, Fortran order: the same
    decision as the NumPy check, through the one specialization."""
    S, sent, centre, reg = _honest()
    frozen = {k: np.frombuffer(v.tobytes()).reshape(v.shape) for k, v in S.items()}
    wide = np.zeros((3, 4, 8))
    wide[:, :, ::2] = sent["precisions_cholesky"]
    variants = [(Stats(frozen), sent),
                (S, {**sent, "precisions_cholesky": wide[:, :, ::2]}),
                (S, {**sent, "precisions_cholesky": np.asfortranarray(
                    sent["precisions_cholesky"])}),
                (S, {**sent, "precisions_cholesky": np.frombuffer(
                    sent["precisions_cholesky"].tobytes()).reshape(3, 4, 4)})]
    for stats, got in variants:
        assert full_step_holds(stats, got, centre, reg, REPLAY_RTOL) is True
        assert full_step_holds(stats, got, centre, reg, REPLAY_RTOL, compiled=False) is True
    assert len(factor_step_holds.signatures) == 1


def test_a_check_takes_the_kernel_once_numba_is_set_up(monkeypatch):
    """Once a compiled call has run in the process, the check is the kernel's decision."""
    S, sent, centre, reg = _honest()
    G = gmm_full_parts(S, centre, reg)[2]
    factor_parts(sent["precisions_cholesky"], G, S["sxx"], S["sx"], 1.0)  # (numba set up)
    calls = []
    kernel = _check_kernel.factor_step_holds
    monkeypatch.setattr(_check_kernel, "factor_step_holds",
                        lambda *a: calls.append(a) or kernel(*a))
    assert full_step_holds(S, sent, centre, reg, REPLAY_RTOL) is True
    assert len(calls) == 1 and calls[0][0] is sent["precisions_cholesky"]


def test_a_process_without_numba_checks_in_numpy():
    """A site's process that has not set numba up (a deployed site's, one per message) checks
    without importing it: its set-up costs more than the checks of a whole fit save."""
    code = """
import numpy as np
from fedlatent.engine.stats import Stats
from fedlatent.models.gmm.check_step import full_step_holds
from fedlatent.models.gmm.model import GMMModel
rng = np.random.default_rng(0)
X = rng.normal(size=(300, 3)) + rng.integers(0, 2, (300, 1)) * 4
r = rng.dirichlet(np.ones(2), 300)
S = Stats({"nk": r.mean(0), "sx": r.T @ X / 300,
           "sxx": np.einsum("nk,ni,nj->kij", r, X, X) / 300})
model, centre = GMMModel(2), np.zeros(3)
sent = model.server_step(S, {"center": centre}, 300.0)
result = full_step_holds(S, sent, centre, model.reg, 1e-9)
"""
    result, imported = in_fresh_process(code, ("numba",))
    assert result is True and imported == []
