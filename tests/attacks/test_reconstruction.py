"""Issue 22, item 2: the automated attacker against every registered model.

For each model (the registry's list: a new model without an adapter fails here, named):

(a) positive control: ``DisclosurePolicy.off()``, no secure aggregation, a client of 3 rows
    (SEC: 4, its minimum; HLCR: 4 entities of one event): the attacker recovers every row of
    it to 1e-6;
(b) the library's defaults (no federation argument at all), the same data: no row within 1e-3;
(c) secure aggregation (``Federation(secure_aggregation=True)``), a client of one row: no row
    within 1e-3;
(d) secure aggregation with partial participation and ``control_variates=False`` (the issue's
    differencing case), a client of one row: no row within 1e-3.

A fit that stops (a refusal) is attacked on what crossed before it stopped. Nothing is xfail:
a failure of (b)-(d) is a disclosure the rules must close.
"""

from __future__ import annotations

import numpy as np
import pytest

import fedlatent as fl
from attacks.attacker import (
    attack,
    client_statistics,
    full_recovery_error,
    nonlinear_least_squares,
    recovery_errors,
)
from attacks.models import ADAPTERS, adapter_for
from attacks.transcript import record_fit
from fedlatent.engine.contract.registry import estimator_names

MODELS = estimator_names()
#: models that take secure aggregation (the others refuse it before any message)
SECURE = [m for m in MODELS if m in ADAPTERS and ADAPTERS[m].secure]
ROUNDS = {"off": 3, "defaults": 3, "secure": 3, "partial": 24}


def _federation(setting: str):
    if setting == "off":
        return fl.Federation(disclosure=fl.DisclosurePolicy.off())
    if setting == "defaults":
        return None  # the estimator's own default Federation(): nothing weakened
    if setting == "secure":
        return fl.Federation(secure_aggregation=True)
    return fl.Federation(secure_aggregation=True, participation=0.5, control_variates=False,
                         random_state=1)


def run_attack(name: str, setting: str):
    """``(case, transcript, attack)`` of model ``name`` under ``setting``."""
    ad = adapter_for(name)
    case = ad.case(ad.small_rows if setting in ("off", "defaults") else 1)
    tr = record_fit(ad.estimator(_federation(setting), ROUNDS[setting]), case.fd)
    return case, tr, attack(tr, ad, target=case.target)


def _described(att, errs) -> str:
    best = int(np.argmin(errs))
    methods = "; ".join(g.method for g in att.guesses[:6])
    return (f"row {best} within {errs[best]:.1e}; guesses: {methods or 'none'}; "
            f"notes: {'; '.join(att.notes)}")


def test_every_registered_model_has_an_adapter():
    assert MODELS, "no registered model"
    for name in MODELS:
        assert adapter_for(name).name == name
    with pytest.raises(LookupError, match="registered model 'newmodel' has no reconstruction-"
                                          "attack adapter: add one to tests/attacks/models.py"):
        adapter_for("newmodel")
    assert set(ADAPTERS) == set(MODELS), sorted(set(ADAPTERS) ^ set(MODELS))


@pytest.mark.parametrize("name", MODELS)
def test_positive_control_policy_off_recovers_every_row(name):
    case, tr, att = run_attack(name, "off")
    assert tr.error is None, f"{name}: the fit stopped: {tr.error}"
    err = full_recovery_error(att.guesses, case.truth)
    assert err < 1e-6, f"{name}: best guess off by {err:.1e}; {_described(att, [err])}"


def _assert_nothing_recovered(name, setting):
    case, tr, att = run_attack(name, setting)
    assert tr.error is None or isinstance(tr.error, ValueError | RuntimeError), repr(tr.error)
    errs = recovery_errors(att.guesses, case.truth)
    assert errs.min() > 1e-3, (f"{name} ({setting}): the attacker recovered "
                               f"{int((errs <= 1e-3).sum())} of {len(errs)} row(s): "
                               f"{_described(att, errs)}; fit: {tr.error or 'completed'}")
    return tr


@pytest.mark.parametrize("name", MODELS)
def test_defaults_recover_no_row(name):
    _assert_nothing_recovered(name, "defaults")


@pytest.mark.parametrize("name", MODELS)
def test_secure_aggregation_recovers_no_row(name):
    tr = _assert_nothing_recovered(name, "secure")
    if not adapter_for(name).secure:  # refused before any message: nothing crossed
        assert "secure_aggregation" in str(tr.error) and not tr.secure


@pytest.mark.parametrize("name", MODELS)
def test_partial_participation_under_secure_aggregation_recovers_no_row(name):
    tr = _assert_nothing_recovered(name, "partial")
    if not adapter_for(name).secure:
        assert "secure_aggregation" in str(tr.error) and not tr.secure


@pytest.mark.parametrize("name", SECURE)
def test_positive_control_differencing_of_secure_sums(name):
    """The differencing attacker works: policy off, secure aggregation, partial participation
    without control variates, a client of one row: the least squares over the cohorts' sums
    gives its row back (so (c) and (d) test the rules, not a blind attacker)."""
    ad = adapter_for(name)
    case = ad.case(1)
    fed = fl.Federation(secure_aggregation=True, participation=0.5, control_variates=False,
                        random_state=1, disclosure=fl.DisclosurePolicy.off())
    tr = record_fit(ad.estimator(fed, ROUNDS["partial"], **ad.control_params), case.fd)
    att = attack(tr, ad, target=case.target)
    assert tr.error is None, f"{name}: the fit stopped: {tr.error}"
    err = full_recovery_error(att.guesses, case.truth)
    assert err < 1e-6, f"{name}: best guess off by {err:.1e}; {_described(att, [err])}"


def test_nonlinear_least_squares_alone_recovers_a_three_row_regression_client():
    """The least squares over the rounds, on its own: candidate rows replayed through the
    recorded messages, started from the client's released mean (LCR, policy off)."""
    ad = adapter_for("lcr")
    case = ad.case(3)
    tr = record_fit(ad.estimator(_federation("off"), 3), case.fd)
    kind, fields, msg = next(c for c in client_statistics(tr, case.target) if c[0] == "estep")
    T = ad.total(kind, fields, msg)
    n, mean = round(T[0, 0]), T[1:, 0] / T[0, 0]
    assert n == 3 and np.abs(mean - case.truth.mean(axis=0)).max() < 1e-9
    spread = np.sqrt(np.diag(T[1:, 1:]) / n - mean**2)
    guesses = nonlinear_least_squares(ad, tr, case.target, np.tile(mean, (n, 1)), spread)
    assert full_recovery_error(guesses, case.truth) < 1e-6, [g.method for g in guesses]
