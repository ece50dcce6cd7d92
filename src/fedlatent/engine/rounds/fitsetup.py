"""One fit setup, for the estimator and the bare round loop alike: the privacy budget planned,
the clients set up, the secure-aggregation channel opened."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from fedlatent.engine.fedem.federation import Federation
from fedlatent.engine.protocol.exchange import setup_sites
from fedlatent.engine.protocol.runtime import Runtime, SiteSubset

logger = logging.getLogger(__name__)

__all__ = ["FitSetup", "setup_fit", "site_refusals", "warn_excluded"]


@dataclass
class FitSetup:
    """What a fit's setup produced.

    Attributes
    ----------
    n_units : dict of str to int
        Each client's units (what it answered ``setup``), of the clients taking part.
    secure : SecureChannel or None
        The fit's channel under ``Federation(secure_aggregation=True)``.
    privacy : PrivacyBudget or None
        The fit's budget under ``Federation(privacy=...)``.
    runtime : Runtime or None
        What the fit runs on: the runtime it was given, or, when sites were left out, its
        :class:`~fedlatent.engine.protocol.runtime.SiteSubset` of the others.
    excluded : dict of str to str
        The sites left out of the fit (``Federation(on_refusal="exclude")``) and why.
    adopted : dict
        The disclosure floors the sites announced that raised the fit's policy.
    """

    n_units: dict[str, int]
    secure: Any = None
    privacy: Any = None
    runtime: Any = None
    excluded: dict[str, str] = field(default_factory=dict)
    adopted: dict[str, Any] = field(default_factory=dict)


def setup_fit(runtime: Runtime, model, federation: Federation, max_rounds: int, *,
              init_releases: int = 0, privacy=None, open_secure: bool = True,
              run: str | None = None) -> FitSetup:
    """Set a fit up: under differential privacy its budget planned for ``max_rounds`` rounds
    and ``init_releases`` initialization releases (unless ``privacy`` gives it), the clients
    set up with the model, the disclosure policy and that plan, and under secure aggregation
    (with ``open_secure``) the channel's keys and shares exchanged among the clients taking
    part. A site that refuses the setup by a rule is left out with one warning
    (:class:`~fedlatent.engine.warn.SitesExcludedWarning`) under
    ``Federation(on_refusal="exclude")``, the default. ``run`` labels the fit for the sites'
    ledgers (:func:`~fedlatent.engine.protocol.exchange.setup_sites`)."""
    from fedlatent.engine.privacy.disclosure import effective

    federation.check_model(model)  # before any message: statistics valid only where computed
    if federation.privacy is not None and privacy is None:
        from fedlatent.engine.privacy.dp import PrivacyBudget, planned_releases

        privacy = PrivacyBudget(federation.privacy.calibrate(
            planned_releases(max_rounds, 1, int(init_releases))))
    cohort = None
    if federation.secure_aggregation:  # the smallest cohort an aggregate can cover
        from fedlatent.engine.secagg.secure import default_threshold

        if not federation.verifies:
            logger.warning("secure aggregation without verified rounds (%s): the sites cannot "
                           "replay the server and trust it with the parameters they evaluate",
                           "; ".join(federation.verification_problems())
                           or "verification turned off")

        cohort = federation.secagg_threshold or default_threshold
    sites = setup_sites(runtime, model, effective(federation.disclosure,
                                                  federation.secure_aggregation),
                        federation.privacy,
                        0 if privacy is None else privacy.calibration.releases, run=run,
                        batch_size=_batch_size(federation), cohort=cohort, fit=True,
                        statistics=1 + (0 if federation.newton is None
                                        else federation.newton.extra_points),
                        on_refusal=federation.on_refusal,
                        min_clients=federation.fewest_clients(len(runtime.client_ids)),
                        verify=federation if federation.verifies else None)
    if sites.excluded:
        runtime = SiteSubset(runtime, sites.excluded)
        warn_excluded(sites.excluded, len(runtime.client_ids))
    secure = None
    if federation.secure_aggregation and open_secure:
        from fedlatent.engine.secagg.secure import open_channel

        secure = open_channel(runtime, federation, sites.n_units, max_rounds)
    return FitSetup(sites.n_units, secure, privacy, runtime, dict(sites.excluded),
                    dict(sites.adopted))


def site_refusals(runtime: Runtime, model, federation: Federation,
                  run: str | None = None) -> dict[str, str]:
    """The sites that refuse a fit of ``model`` under ``federation`` at its setup, and why:
    the setup :func:`setup_fit` sends (without differential privacy or secure aggregation),
    sent and nothing more. For choosing a size among candidates on the same sites."""
    from fedlatent.engine.privacy.disclosure import effective

    return setup_sites(runtime, model, effective(federation.disclosure, False), run=run,
                       batch_size=_batch_size(federation), fit=True,
                       statistics=1 + (0 if federation.newton is None
                                       else federation.newton.extra_points),
                       on_refusal="exclude", min_clients=0).excluded


def warn_excluded(excluded: dict[str, str], n_kept: int, note: str = "") -> None:
    """The one warning of a fit that left the sites ``excluded`` out (``n_kept`` take part):
    each named (ten, then a count) with its refusal, which gives the rule and the fix (each
    fix once: :func:`~fedlatent.engine.protocol.messages.refusal_detail`); then ``note``."""
    from fedlatent.engine.protocol.messages import refusal_detail
    from fedlatent.engine.warn import SitesExcludedWarning, warn_user

    n = len(excluded)
    warn_user(f"{n} of {n + n_kept} sites left out of the fit, refused by a disclosure rule or "
              f"their own policy ({n_kept} take part; predictions for a site left out use the "
              f"population-level model, as for a site not seen in training): "
              f"{refusal_detail(excluded)}{note}. Federation(on_refusal='stop') stops the fit "
              "instead; the estimator's excluded_clients_ lists them", SitesExcludedWarning)


def _batch_size(federation: Federation) -> int | None:
    """The fit's mini-batch (``batch_size``, or SPIDER's), None for full passes."""
    vr = federation.variance_reduction
    b = federation.batch_size if vr is None else getattr(vr, "batch_size", None)
    return None if b is None else int(b)
