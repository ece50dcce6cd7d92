"""Differential privacy: calibration against the accountant's own figures, the budget tracker,
settings validation, and the lazy import of the optional accountant."""

from __future__ import annotations

import math
import sys

import dp_accounting as dpa  # the `privacy` extra, which `make test` installs
import pytest
from dp_accounting.pld.pld_privacy_accountant import PLDAccountant
from dp_accounting.rdp.rdp_privacy_accountant import RdpAccountant

from fedlatent.engine.privacy import (
    Calibration,
    DifferentialPrivacy,
    PrivacyBudget,
    PrivacyBudgetExceeded,
    calibrate_noise_multiplier,
    composed_epsilon,
    planned_releases,
)

DELTA = 1e-5


def _pld(z, k, q=None, vdi=1e-4):
    event = dpa.GaussianDpEvent(z)
    if q is not None:
        event = dpa.PoissonSampledDpEvent(q, event)
    acc = PLDAccountant(value_discretization_interval=vdi)
    acc.compose(event, k)
    return acc.get_epsilon(DELTA)


# ---- the reported epsilon is the accountant's own figure ---------------------------------------
def test_epsilon_after_equals_a_direct_pld_accountant_call():
    cal = DifferentialPrivacy(1.0, DELTA, clip=1.0).calibrate(50)
    for k in (10, 50):
        assert cal.epsilon_after(k) == pytest.approx(_pld(cal.noise_multiplier, k), rel=1e-6)


def test_epsilon_after_with_rdp_equals_a_direct_rdp_accountant_call():
    cal = DifferentialPrivacy(2.0, DELTA, clip=1.0, accountant="rdp").calibrate(40)
    acc = RdpAccountant()
    acc.compose(dpa.GaussianDpEvent(cal.noise_multiplier), 40)
    assert cal.epsilon_after(40) == pytest.approx(acc.get_epsilon(DELTA), rel=1e-12)
    assert cal.epsilon_after(40) <= 2.0


def test_subsampled_epsilon_equals_the_pld_accountant_with_poisson_sampling():
    q, k = 0.3, 8
    cal = DifferentialPrivacy(1.0, DELTA, clip=1.0).calibrate(k, sampling_rate=q)
    direct = _pld(cal.noise_multiplier, k, q=q, vdi=1e-3)
    assert cal.epsilon_after(k) == pytest.approx(direct, rel=1e-9)
    # the coarser discretization is pessimistic: never below the library default's figure
    fine = _pld(cal.noise_multiplier, k, q=q, vdi=1e-4)
    assert fine <= cal.epsilon_after(k) <= fine * 1.01
    assert cal.epsilon_after(k) <= 1.0
    # amplification: the same budget needs less noise than without sampling
    assert cal.noise_multiplier < DifferentialPrivacy(1.0, DELTA, clip=1.0).calibrate(
        k).noise_multiplier


# ---- calibration: within budget, and the smallest such noise ----------------------------------
@pytest.mark.parametrize("epsilon", [0.5, 1.0, 2.0, 4.0, 8.0])
def test_calibration_spends_the_budget_almost_exactly_and_no_more(epsilon):
    cal = DifferentialPrivacy(epsilon, DELTA, clip=1.0).calibrate(50)
    z = cal.noise_multiplier
    assert cal.epsilon_after(50) <= epsilon
    # smallest: 0.1% less noise would overspend
    assert composed_epsilon(z * 0.999, 50, DELTA) > epsilon
    assert cal.epsilon_after(50) > 0.999 * epsilon


def test_calibration_figure_for_one_epsilon_matches_the_gaussian_composition_theorem():
    # k Gaussian releases with multiplier z are one Gaussian release with z / sqrt(k)
    z50 = calibrate_noise_multiplier(1.0, DELTA, 50)
    z1 = calibrate_noise_multiplier(1.0, DELTA, 1)
    assert z50 == pytest.approx(z1 * math.sqrt(50), rel=3e-4)


def test_more_releases_need_more_noise_and_epsilon_grows_with_releases():
    dp = DifferentialPrivacy(1.0, DELTA, clip=1.0)
    z10, z100 = dp.calibrate(10).noise_multiplier, dp.calibrate(100).noise_multiplier
    assert z100 > z10
    cal = dp.calibrate(100)
    eps = [cal.epsilon_after(k) for k in (0, 1, 10, 50, 100)]
    assert eps[0] == 0.0
    assert all(a < b for a, b in zip(eps, eps[1:]))


def test_planned_releases_counts_rounds_per_round_and_initialization():
    assert planned_releases(30, per_round=2, initialization=3) == 63
    assert planned_releases(0, initialization=1) == 1
    with pytest.raises(ValueError, match=r"at least one release"):
        planned_releases(0)
    with pytest.raises(ValueError, match=r"per_round must be an integer >= 1, got 0"):
        planned_releases(5, per_round=0)


# ---- the budget tracker ---------------------------------------------------------------------
def test_budget_stops_before_the_release_that_would_exceed():
    cal = DifferentialPrivacy(1.0, DELTA, clip=1.0).calibrate(5)
    budget = PrivacyBudget(cal)
    assert budget.spent == (0.0, 0.0)
    for k in range(1, 6):
        assert not budget.would_exceed()
        eps, delta = budget.spend()
        assert eps == cal.epsilon_after(k) and delta == DELTA
        assert eps <= 1.0
    assert budget.remaining == 0
    assert budget.would_exceed()
    with pytest.raises(PrivacyBudgetExceeded,
                       match=r"1 more release\(s\) after 5 would spend epsilon=1\.\d+ > budget 1 "
                             r"\(delta=1e-05, 5 releases planned\); stop before this round"):
        budget.spend()
    assert budget.releases == 5  # nothing recorded by the refused release
    assert budget.would_exceed(k=2) and PrivacyBudget(cal, releases=3).would_exceed(k=3)
    assert not PrivacyBudget(cal, releases=3).would_exceed(k=2)


def test_budget_state_round_trips_through_json_and_resumes():
    import json

    cal = DifferentialPrivacy(2.0, DELTA, clip=1.0).calibrate(12)
    budget = PrivacyBudget(cal)
    budget.spend(4)
    again = PrivacyBudget.from_state(json.loads(json.dumps(budget.state())))
    assert again.calibration == cal and again.releases == 4 and again.spent == budget.spent
    bad = budget.state()
    bad["calibration"]["noise_multiplier"] = -1.0
    with pytest.raises(ValueError, match=r"privacy calibration: noise_multiplier must be a "
                                         r"positive finite number, got -1.0"):
        PrivacyBudget.from_state(bad)
    with pytest.raises(ValueError, match=r"needs exactly the fields .* got \['delta'\]; the "
                                         r"checkpoint is damaged"):
        Calibration.from_dict({"delta": 0.1})
    with pytest.raises(ValueError, match=r"privacy calibration: delta must be in \(0, 1\)"):
        Calibration.from_dict({**cal.to_dict(), "delta": 2.0})
    with pytest.raises(ValueError, match=r"budget state needs exactly the fields"):
        PrivacyBudget.from_state({"releases": 3})


def test_noise_std_splits_the_variance_among_parties():
    cal = Calibration(1.0, DELTA, 10, noise_multiplier=4.0)
    assert cal.noise_std(0.5) == 2.0
    assert cal.noise_std(0.5, n_parties=4) == 1.0


# ---- settings validation --------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, message", [
    (dict(epsilon=0.0, delta=1e-5, clip=1.0), r"epsilon must be a positive finite number, got 0"),
    (dict(epsilon=math.inf, delta=1e-5, clip=1.0), r"epsilon must be a positive finite number"),
    (dict(epsilon=1.0, delta=0.0, clip=1.0), r"delta must be in \(0, 1\)"),
    (dict(epsilon=1.0, delta=1.0, clip=1.0), r"delta must be in \(0, 1\) \(typically 1e-5"),
    (dict(epsilon=1.0, delta=1e-5, clip=-2.0), r"clip must be a positive finite number, got -2"),
    (dict(epsilon=1.0, delta=1e-5, clip=1.0, noise="central"),
     r"noise must be one of \('local', 'distributed'\), got 'central'"),
    (dict(epsilon=1.0, delta=1e-5, clip=1.0, accountant="moments"),
     r"accountant must be one of \('pld', 'rdp'\), got 'moments'"),
    (dict(epsilon=1.0, delta=1e-5, clip=1.0, target_range=(2.0, 1.0)),
     r"target_range must be \(lo, hi\) with finite lo < hi, got \(2\.0, 1\.0\)"),
    (dict(epsilon=True, delta=1e-5, clip=1.0), r"epsilon must be a positive finite number"),
])
def test_settings_are_checked_on_construction(kwargs, message):
    with pytest.raises(ValueError, match=r"DifferentialPrivacy: " + message):
        DifferentialPrivacy(**kwargs)


def test_settings_are_frozen_and_target_range_normalized():
    dp = DifferentialPrivacy(1, 1e-5, clip=2, target_range=[-1, 1])
    assert dp.target_range == (-1.0, 1.0)
    with pytest.raises(AttributeError):
        dp.epsilon = 3.0


def test_numpy_scalars_become_plain_floats():
    import numpy as np

    dp = DifferentialPrivacy(np.int64(2), np.float64(1e-5), clip=np.float32(1.5))
    assert [type(v) for v in (dp.epsilon, dp.delta, dp.clip)] == [float, float, float]
    assert (dp.epsilon, dp.delta, dp.clip) == (2.0, 1e-5, 1.5)


def test_distributed_noise_requires_secure_aggregation():
    dp = DifferentialPrivacy(1.0, DELTA, clip=1.0, noise="distributed")
    assert dp.requires_secure_aggregation
    dp.check_secure_aggregation(True)
    with pytest.raises(ValueError, match=r"noise='distributed'\) is private only with secure "
                                         r"aggregation: set Federation\(secure_aggregation=True\)"):
        dp.check_secure_aggregation(False)
    DifferentialPrivacy(1.0, DELTA, clip=1.0).check_secure_aggregation(False)


@pytest.mark.parametrize("call, message", [
    (lambda: composed_epsilon(0.0, 5, DELTA), r"noise_multiplier must be a positive finite"),
    (lambda: composed_epsilon(1.0, -1, DELTA), r"releases must be a non-negative integer"),
    (lambda: composed_epsilon(1.0, 5, DELTA, sampling_rate=0.0), r"sampling_rate must be in"),
    (lambda: calibrate_noise_multiplier(1.0, DELTA, 0), r"releases must be a positive integer"),
    (lambda: DifferentialPrivacy(1.0, DELTA, clip=1.0).calibrate(0),
     r"releases must be an integer >= 1, got 0"),
])
def test_accountant_arguments_are_checked(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_without_the_extra_calibration_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "dp_accounting", None)  # `import dp_accounting` fails
    dp = DifferentialPrivacy(1.0, DELTA, clip=1.0)  # settings need no accountant
    with pytest.raises(ImportError, match=r"pip install 'fedlatent\[privacy\]'"):
        dp.calibrate(10)


def test_importing_the_privacy_package_does_not_import_the_accountant():
    import subprocess

    code = ("import sys, fedlatent, fedlatent.engine.privacy; "
            "print('dp_accounting' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"
