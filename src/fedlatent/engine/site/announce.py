"""The sites' floors, announced before a fit (DataSHIELD's ``ds.listDisclosureSettings``).

Every node answers the protocol exchange ``settings`` with what its site policy sets (no data:
the disclosure floor, whether DP or secure aggregation is required, the privacy ceilings, the
models and exchanges it answers, its limits). The server adopts the strictest disclosure floor
of all (:func:`adopt_floors`, called by
:func:`~fedlatent.engine.protocol.exchange.setup_clients`) before it sets anything up, so a site
whose floor is above the library's default is not discovered by refusal; it records what it
adopted in the log and in the fit's ``history_.adopted``. An analyst lists the settings before
fitting with :func:`site_settings` (``fedlatent site settings`` for policy files).

The count scope stays the server's: a site's floor counts per site, and a node holds every
unmasked reply to it whatever the server says (:class:`~fedlatent.engine.site.guard.SiteGuard`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import fields, replace
from typing import Any

from fedlatent.engine.privacy.disclosure import DisclosurePolicy
from fedlatent.engine.protocol.messages import ERROR_KEY
from fedlatent.engine.site.policy import SitePolicy, looser

__all__ = ["SETTINGS", "adopt_floors", "announce", "settings_rows", "site_settings"]

logger = logging.getLogger(__name__)

#: the exchange a node answers with its announced settings
SETTINGS = "settings"
#: what a site the runtime relaxes (a simulation's) announces
RELAXED = {"relaxed": True}
#: the keys of a site's settings besides its disclosure floor, in the order they are listed
_KEYS = ("privacy_required", "max_epsilon", "max_delta", "secure_aggregation_required",
         "models", "exchanges", "max_rounds", "max_releases", "max_points",
         "max_message_bytes")


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
    for key in _KEYS[1:]:
        value = getattr(policy, key)
        out[key] = list(value) if isinstance(value, tuple) else value
    return {SETTINGS: json.dumps(out)}


def site_settings(runtime) -> dict[str, dict[str, Any]]:
    """Every site's announced settings, by client id (a site that cannot answer, an older
    node: ``{"unknown": reason}``). Asked once per runtime and kept on it; a runtime that
    holds every site itself without a policy (the in-process runtime's default) is not asked:
    its sites announce nothing (``{"relaxed": True}``)."""
    kept = getattr(runtime, "_site_settings", None)
    if kept is not None:
        return kept
    ids = list(runtime.client_ids)
    if getattr(runtime, "sites_relaxed", False):
        out = {c: dict(RELAXED) for c in ids}
    else:
        replies = runtime.call(ids, SETTINGS, {c: {} for c in ids})
        out = {c: _parse(replies.get(c, {})) for c in ids}
    try:
        runtime._site_settings = out
    except AttributeError:  # a runtime with slots: asked again next time
        pass
    return out


def _parse(reply: dict[str, Any]) -> dict[str, Any]:
    if ERROR_KEY in reply or SETTINGS not in reply:
        return {"unknown": str(reply.get(ERROR_KEY, "no settings in the reply"))}
    try:
        got = json.loads(str(reply[SETTINGS]))
    except ValueError as err:
        return {"unknown": f"settings not JSON ({err})"}
    return got if isinstance(got, dict) else {"unknown": "settings not a JSON object"}


def adopt_floors(disclosure: DisclosurePolicy, settings: dict[str, dict[str, Any]]
                 ) -> tuple[DisclosurePolicy, dict[str, Any]]:
    """``(policy, record)``: ``disclosure`` raised to every site's announced floor (the count
    scope kept), and what was adopted: ``{"disclosure": the policy as a dict, "raised":
    {setting: [sites that asked for more]}}`` (empty when nothing was raised)."""
    from fedlatent.engine.privacy.enforce import policy_from_config, stricter

    out, raised = disclosure, {}
    for cid, s in sorted(settings.items()):
        floor = s.get("disclosure")
        if not floor:
            continue
        floor = policy_from_config(floor)
        for item in looser(floor, out):
            raised.setdefault(item.split("=", 1)[0], []).append(str(s.get("site") or cid))
        out = replace(stricter(out, floor), count_scope=disclosure.count_scope)
    if not raised:
        return disclosure, {}
    record = {"disclosure": {f.name: getattr(out, f.name) for f in fields(out)},
              "raised": raised}
    logger.info("the sites announced stricter disclosure floors: %s; the fit uses %r",
                "; ".join(f"{k} by {', '.join(v[:5])}{', ...' if len(v) > 5 else ''}"
                          for k, v in raised.items()), out)
    return out, record


def settings_rows(settings: dict[str, dict[str, Any]]) -> list[tuple[str, ...]]:
    """One row per site: ``(site, setting, value)`` of what it announced (for a table)."""
    rows = []
    for cid, s in settings.items():
        name = str(s.get("site") or cid)
        if s.get("relaxed"):
            rows.append((name, "(relaxed)", "held by the runtime: no floors of its own"))
            continue
        if "unknown" in s:
            rows.append((name, "(unknown)", str(s["unknown"])))
            continue
        rows += [(name, f"disclosure.{k}", str(v)) for k, v in (s.get("disclosure") or {}).items()]
        rows += [(name, k.replace("_", "-"), "(not set)" if s.get(k) in (None, "") else
                  (", ".join(s[k]) if isinstance(s[k], list) else str(s[k]))) for k in _KEYS]
    return rows
