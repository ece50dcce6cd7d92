"""Signed SEC models and the per-run evaluation quota, on the learner (issue 21, item 5).

In the Exchange step a learner evaluates models the server sends and replies their losses on its
own data. A server free to send models of its own (stumps with chosen thresholds and leaf values,
all of allowed types) can read a learner's rows back from the losses. So a learner whose site
pins a roster (:class:`~fedlatent.engine.site.keys.SiteIdentity`) evaluates only models that a
rostered site signed for this run, in its own Select step, and at most ``quota`` distinct
models per run (:attr:`SiteIdentity.quota`: by default one per rostered site). A learner with a
signing key signs the model it selects, bound to the run and to its site id.

Without a roster nothing is verified (today's behaviour: the server is assumed to follow the
protocol); a quota set on the identity applies all the same.

A learner whose site holds a policy (:class:`~fedlatent.engine.site.guard.SiteGuard`, the
model's ``site``) is bound by it whatever the server sends (:func:`check_site_policy`): it
evaluates others' models only with a pinned roster (unless ``[sec] evaluate-others = true``
says it accepts unsigned ones; ``false``: never); every model (and every candidate) contains
only the policy's ``trusted-types``; the per-run quota (``[sec] quota``, else one per rostered
site) is counted on the site's ledger (``sec-model`` entries of the run the site set up), so
that neither a fresh process (a Flower ClientApp answers each message in a new one), a restored
state nor a new label in the exchange message resets it. Each refusal names the site and its
rule (``sec.evaluate-others``, ``sec.roster``, ``sec.trusted-types``, ``sec.signature``,
``sec.quota``) and is written to the ledger.
"""

from __future__ import annotations

import functools
import hashlib
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from ...engine.privacy.enforce import DisclosureRefused

__all__ = ["MODEL_PURPOSE", "charge_quota", "charge_site_quota", "check_site_policy",
           "model_signature", "verify_models"]

#: what a site's signature of its SEC model is for
MODEL_PURPOSE = "sec-model"
_RUN, _SEEN = "quota_run", "quota_seen"


def _digest(blob: np.ndarray) -> bytes:
    return hashlib.sha256(np.asarray(blob, dtype=np.uint8).tobytes()).digest()


def model_signature(identity: Any, blob: np.ndarray, run: str) -> np.ndarray | None:
    """The site's signature of its selected model for ``run`` (uint8, 64 bytes), or None when
    the site has no signing key."""
    if identity is None or identity.keys is None:
        return None
    if identity.site is None:
        raise ValueError("a SEC model is signed by a site id: bind the identity to the client "
                         "(SiteIdentity.for_site)")
    sig = identity.keys.sign(MODEL_PURPOSE, {"site": identity.site, "run": str(run)},
                             _digest(blob))
    return np.frombuffer(sig, dtype=np.uint8).copy()


def _refused(site: Any, rule: str, why: str, fix: str) -> DisclosureRefused:
    return DisclosureRefused(site.refusal_text(rule, why, fix))


@functools.cache
def _candidate_types(name: str) -> frozenset[str]:
    """The estimator types a fitted built-in candidate ``name`` contains (as skops names
    them); empty for a name that is not a built-in candidate."""
    from .candidates import BUILTIN_CANDIDATES
    from .serialize import _schema_types, dumps_model

    if name not in BUILTIN_CANDIDATES:
        return frozenset()
    x = np.linspace(0.0, 1.0, 16)[:, None]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = BUILTIN_CANDIDATES[name]().fit(x, np.sin(6 * x[:, 0]))
    return frozenset(t for t in _schema_types(bytes(dumps_model(est).tobytes()))
                     if not t.startswith(("builtins.", "numpy.")))


def _trusted(type_name: str, trusted: tuple[str, ...]) -> bool:
    """Whether ``trusted`` (a policy's ``trusted-types``: built-in candidate names such as
    ``"linear"``, full type names, or module prefixes such as ``"sklearn.linear_model"``)
    admits ``type_name``."""
    return any(type_name == t or type_name.startswith(t + ".") or type_name in
               _candidate_types(t) for t in trusted)


def check_site_policy(site: Any, identity: Any, blobs: list[np.ndarray], *,
                      exchange: bool) -> None:
    """Raise :class:`DisclosureRefused` (site, rule, fix) when the site's policy forbids what
    the message asks: evaluating others' models (``exchange``) without ``evaluate-others`` or
    without a pinned roster, or any model naming a type outside ``trusted-types``. No policy
    (``site`` None): nothing to check."""
    if site is None:
        return
    p = site.policy
    if exchange and p.sec_evaluate_others is False:
        raise _refused(site, "sec.evaluate-others", "its policy says it evaluates no other "
                       "party's models", "leave this site out of SEC's exchange step")
    if exchange and p.sec_evaluate_others is None and (identity is None
                                                       or identity.roster is None):
        raise _refused(site, "sec.roster", "it pins no roster, so it cannot tell a peer's "
                       "model from one the server made", "name the consortium's roster in the "
                       "site policy ([site] roster; fedlatent site roster)")
    if p.sec_trusted_types is None:
        return
    from .serialize import _schema_types

    for k, blob in enumerate(blobs):
        names = _schema_types(np.asarray(blob, dtype=np.uint8).tobytes())
        bad = sorted(t for t in names if not t.startswith(("builtins.", "numpy."))
                     and not _trusted(t, p.sec_trusted_types))
        if bad:
            raise _refused(site, "sec.trusted-types", f"model {k} of the message contains "
                           f"{bad}, outside its trusted types",
                           f"send models of the types {list(p.sec_trusted_types)} only")


def charge_site_quota(site: Any, identity: Any, payload: Mapping[str, Any],
                      blobs: list[np.ndarray]) -> None:
    """Count ``blobs`` against the run's quota on the site's ledger (a model evaluated before
    in the run is not counted again); raise :class:`DisclosureRefused` (``sec.quota``,
    nothing evaluated) beyond it."""
    if site is None:
        return
    quota = site.policy.sec_quota or (None if identity is None else identity.quota)
    if quota is None:
        return
    seen = {e["digest"] for e in site.ledger.of("sec-model", run=site.run)}
    new: dict[str, str] = {}
    for k, blob in enumerate(blobs):
        d = _digest(blob).hex()
        if d not in seen:
            new.setdefault(d, str(payload.get(f"signer/{k}", "")))
    if len(seen) + len(new) > quota:
        raise _refused(site, "sec.quota", f"the exchange asks for {len(new)} more distinct "
                       f"models in run {site.run!r}, beyond its quota of {quota} per run "
                       f"({len(seen)} evaluated already, counted on its ledger)",
                       "raise [sec] quota in the site policy if the consortium is larger")
    for d, signer in new.items():
        site.ledger.append("sec-model", run=site.run, dataset=site.dataset, digest=d,
                           signer=signer)


def verify_models(identity: Any, payload: Mapping[str, Any], blobs: list[np.ndarray],
                  offset: int, site: Any = None) -> None:
    """Raise :class:`DisclosureRefused` unless every model of an exchange message carries a
    signature (``signature/<k>``) of the rostered site it names (``signer/<k>``) for the run
    (``run``); nothing is verified without a pinned roster. Under a site policy (``site``)
    the refusal names the site and the rule ``sec.signature``."""
    from ...engine.site.keys import AuthenticationError

    if identity is None or identity.roster is None:
        return
    run = str(payload.get("run", ""))
    if not run:
        raise DisclosureRefused("the exchange names no run; a learner with a pinned roster "
                                "evaluates only models signed for a named run")
    for k, blob in enumerate(blobs):
        signer = str(payload.get(f"signer/{k}", ""))
        sig = np.asarray(payload.get(f"signature/{k}", np.zeros(0, np.uint8)), dtype=np.uint8)
        try:
            identity.roster.verify(signer, sig.tobytes(), MODEL_PURPOSE,
                                   {"site": signer, "run": run}, _digest(blob),
                                   what=f"model {offset + k} of the exchange")
        except AuthenticationError as err:
            if site is not None:
                raise _refused(site, "sec.signature", str(err), "a learner evaluates only "
                               "models rostered sites signed; a server cannot have it "
                               "evaluate models of its own") from err
            raise DisclosureRefused(f"{err}; a server cannot have a learner evaluate models "
                                    "of its own") from err


def charge_quota(identity: Any, state: Mapping[str, np.ndarray], blobs: list[np.ndarray],
                 run: str) -> dict[str, np.ndarray]:
    """The learner's state with ``blobs`` counted against the run's quota of distinct models;
    raises :class:`DisclosureRefused` (nothing evaluated) when they would exceed it. A new run
    starts a new count; a model sent again is not counted again."""
    quota = None if identity is None else identity.quota
    if quota is None:
        return dict(state)
    tag = np.frombuffer(str(run).encode(), dtype=np.uint8)
    same = _RUN in state and np.array_equal(np.asarray(state[_RUN], np.uint8), tag)
    seen = {bytes(r) for r in np.asarray(state[_SEEN], np.uint8)} if same and _SEEN in state \
        else set()
    new = {_digest(b) for b in blobs} - seen
    if len(seen) + len(new) > quota:
        raise DisclosureRefused(
            f"the exchange asks for {len(new)} more distinct models in run {run!r}, beyond the "
            f"site's quota of {quota} per run ({len(seen)} evaluated already); raise sec_quota in "
            "the site policy if the consortium is larger")
    out = dict(state)
    out[_RUN] = tag
    rows = sorted(seen | new)
    out[_SEEN] = np.frombuffer(b"".join(rows), dtype=np.uint8).reshape(len(rows), 32)
    return out
