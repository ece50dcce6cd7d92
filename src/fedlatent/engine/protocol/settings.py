"""The sites' floors, asked before a fit and adopted (DataSHIELD's ``ds.listDisclosureSettings``).

Every node answers the protocol exchange ``settings`` with what its site policy sets
(:func:`fedlatent.engine.site.announce.announce`: no data). :func:`site_settings` asks every site
of a runtime (once per runtime); :func:`adopt_floors` raises a fit's disclosure policy to the
strictest floor the sites announced, so a site whose floor is above the library's default is
not discovered by refusal; :func:`~fedlatent.engine.protocol.exchange.setup_clients` calls both
before it sets anything up and logs what it adopted (the fit's ``history_.adopted``).

The count scope stays the server's: a site's floor counts per site, and a node holds every
unmasked reply to it whatever the server says (:class:`~fedlatent.engine.site.guard.SiteGuard`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import fields, replace
from typing import Any

from fedlatent.engine.privacy.disclosure import DisclosurePolicy
from fedlatent.engine.privacy.enforce import looser
from fedlatent.engine.protocol.messages import ERROR_KEY

__all__ = ["KEYS", "RELAXED", "SETTINGS", "adopt_floors", "settings_rows", "site_settings"]

logger = logging.getLogger(__name__)

#: the exchange a node answers with its announced settings
SETTINGS = "settings"
#: what a site the runtime relaxes (a simulation's) announces
RELAXED = {"relaxed": True}
#: the keys of a site's settings besides its disclosure floor, in the order they are listed
KEYS = ("privacy_required", "max_epsilon", "max_delta", "secure_aggregation_required",
        "models", "exchanges", "max_rounds", "max_releases", "max_points",
        "max_message_bytes")


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
    {setting: [sites whose floor is above the server's]}}`` (empty when nothing was
    raised)."""
    from fedlatent.engine.privacy.enforce import policy_from_config, stricter

    out, raised = disclosure, {}
    for cid, s in sorted(settings.items()):
        floor = s.get("disclosure")
        if not floor:
            continue
        floor = policy_from_config(floor)
        for item in looser(floor, disclosure):  # every site asking more than the server
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
                  (", ".join(s[k]) if isinstance(s[k], list) else str(s[k]))) for k in KEYS]
    return rows
