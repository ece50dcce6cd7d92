"""A site's floors, announced before a fit (DataSHIELD's ``ds.listDisclosureSettings``).

Every node answers the protocol exchange ``settings`` with what its site policy sets
(:func:`announce`; no data: the disclosure floor, whether DP or secure aggregation is required,
the privacy ceilings, the models and exchanges it answers, its limits). The server's side, which
asks every site and adopts the strictest disclosure floor before it sets a fit up, is
:mod:`fedlatent.engine.protocol.settings`.
"""

from __future__ import annotations

import json
from typing import Any

from fedlatent.engine.protocol.settings import KEYS, RELAXED, SETTINGS
from fedlatent.engine.site.policy import SitePolicy

__all__ = ["announce"]


def announce(policy: SitePolicy, site: str) -> dict[str, Any]:
    """A node's reply to ``settings``: its policy's floors as JSON (``{"settings": text}``)."""
    if policy.relaxed:
        return {SETTINGS: json.dumps(RELAXED)}
    from fedlatent.engine.privacy.enforce import policy_to_json
    from fedlatent.engine.site.policy import DP_OR_VERIFIED

    required = (DP_OR_VERIFIED if policy.verified_suffices
                else "dp" if policy.privacy_required else "")
    out = {"relaxed": False, "site": str(site),
           "disclosure": json.loads(policy_to_json(policy.disclosure)),
           "privacy_required": required}
    for key in KEYS[1:]:
        value = getattr(policy, key)
        out[key] = list(value) if isinstance(value, tuple) else value
    return {SETTINGS: json.dumps(out)}
