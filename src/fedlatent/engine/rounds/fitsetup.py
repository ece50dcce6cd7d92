"""One fit setup, for the estimator and the bare round loop alike: the privacy budget planned,
the clients set up, the secure-aggregation channel opened."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedlatent.engine.fedem.federation import Federation
from fedlatent.engine.protocol.exchange import setup_clients
from fedlatent.engine.protocol.runtime import Runtime

__all__ = ["FitSetup", "setup_fit"]


@dataclass
class FitSetup:
    """What a fit's setup produced.

    Attributes
    ----------
    n_units : dict of str to int
        Each client's units (what it answered ``setup``).
    secure : SecureChannel or None
        The fit's channel under ``Federation(secure_aggregation=True)``.
    privacy : PrivacyBudget or None
        The fit's budget under ``Federation(privacy=...)``.
    """

    n_units: dict[str, int]
    secure: Any = None
    privacy: Any = None


def setup_fit(runtime: Runtime, model, federation: Federation, max_rounds: int, *,
              init_releases: int = 0, privacy=None, open_secure: bool = True,
              run: str | None = None) -> FitSetup:
    """Set a fit up: under differential privacy its budget planned for ``max_rounds`` rounds
    and ``init_releases`` initialization releases (unless ``privacy`` gives it), the clients
    set up with the model, the disclosure policy and that plan, and under secure aggregation
    (with ``open_secure``) the channel's keys and shares exchanged. ``run`` labels the fit for
    the sites' ledgers (:func:`~fedlatent.engine.protocol.exchange.setup_clients`)."""
    from fedlatent.engine.privacy.disclosure import effective

    federation.check_model(model)  # before any message: statistics valid only where computed
    if federation.privacy is not None and privacy is None:
        from fedlatent.engine.privacy.dp import PrivacyBudget, planned_releases

        privacy = PrivacyBudget(federation.privacy.calibrate(
            planned_releases(max_rounds, 1, int(init_releases))))
    cohort = None
    if federation.secure_aggregation:  # the smallest cohort an aggregate can cover
        from fedlatent.engine.secagg.secure import default_threshold

        cohort = (federation.secagg_threshold or
                  default_threshold(len(runtime.client_ids)))
    n_units = setup_clients(runtime, model, effective(federation.disclosure,
                                                      federation.secure_aggregation),
                            federation.privacy,
                            0 if privacy is None else privacy.calibration.releases, run=run,
                            batch_size=_batch_size(federation), cohort=cohort, fit=True,
                            statistics=1 + (0 if federation.newton is None
                                            else federation.newton.extra_points))
    secure = None
    if federation.secure_aggregation and open_secure:
        from fedlatent.engine.secagg.secure import open_channel

        secure = open_channel(runtime, federation, n_units, max_rounds)
    return FitSetup(n_units, secure, privacy)


def _batch_size(federation: Federation) -> int | None:
    """The fit's mini-batch (``batch_size``, or SPIDER's), None for full passes."""
    vr = federation.variance_reduction
    b = federation.batch_size if vr is None else getattr(vr, "batch_size", None)
    return None if b is None else int(b)
