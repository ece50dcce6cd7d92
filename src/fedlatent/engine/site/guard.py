"""What a client node consults before it answers: its site's policy and ledger.

A :class:`SiteGuard` sits in a :class:`~fedlatent.engine.node.client.ClientNode` built with
``policy=``. It

- checks a ``setup`` against the policy's floors (model answered, disclosure thresholds, DP
  required, per-fit epsilon/delta ceilings, ``noise_seed`` only on a simulation site, planned
  releases, the lifetime budget of the data set composed with every earlier fit) and fixes the
  run's plan at its first setup: a second setup of the same run with another plan is refused;
- checks every other message (exchange kinds answered, secure aggregation required, unmasked
  replies under an aggregate count scope, message size, rounds) and answers each
  (run, exchange, round) once: an identical re-ask gets the recorded answer, a masked re-ask
  or another question under the same (run, exchange, round) is refused;
- writes every differential-privacy release to the ledger before the reply leaves, and refuses
  one beyond the run's plan or the lifetime budget (counted on the ledger, which a restored
  state cannot roll back).

A refusal is a reply carrying one line, ``site S refused (rule): why; fix: ...``, which the
server records (``history_.errors``, a :class:`~fedlatent.engine.rounds.loop.FederatedFitError`);
it is written to the ledger too.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import warnings
from dataclasses import replace
from typing import Any

import numpy as np

from fedlatent.engine.protocol.messages import ERROR_KEY, refusal_reply
from fedlatent.engine.site.ledger import Ledger
from fedlatent.engine.site.policy import PROTOCOL_EXCHANGES, SitePolicy, looser

__all__ = ["SiteGuard", "SiteRefused", "parse_refusal", "question_digest", "refusal_rules",
           "verified_rounds"]

logger = logging.getLogger(__name__)

#: methods whose reply carries something computed from the data
_DATA_METHODS = ("estep", "evaluate", "query")
#: what ``[limits] max-rounds`` bounds: a round's E-step and its evaluation pass
_ROUND_METHODS = ("estep", "evaluate")
_REFUSAL = re.compile(r"site '(.*?)' refused \(([a-z.-]+)\)")
#: prefix of the node's state kept beside a recorded answer
_KEPT_STATE = "node-state:"
_PLAN_KEYS = ("model", "model_config", "disclosure", "privacy", "privacy_releases", "verify")


def verified_rounds(msg: dict[str, Any]) -> bool:
    """Whether setup ``msg`` sets up secure aggregation whose rounds this site verifies (it
    checks its own reply is in the sum of each exchange's transcript and replays the server's
    step: :mod:`fedlatent.engine.node.verify`). The hook a policy's ``[privacy] required =
    "dp-or-verified"`` consults. A setup that says so binds the site: from then on it answers
    only secure exchanges whose transcript and parameters it verifies (fail closed)."""
    return bool(msg.get("verify"))


class SiteRefused(RuntimeError):
    """A site refused a message by its own policy (the text is the one-line reason)."""


def parse_refusal(text: str) -> tuple[str, str] | None:
    """``(site, rule)`` of a site's refusal as the server records it (in
    ``FederatedFitError.faults`` or ``history_.errors``), or None for another fault."""
    m = _REFUSAL.search(str(text))
    return None if m is None else (m.group(1), m.group(2))


def refusal_rules(text: str) -> list[str]:
    """Every rule a site's refusal names (it lists every violated rule at once)."""
    first = parse_refusal(text)
    if first is None:
        return []
    return [first[1]] + re.findall(r"; also \(([a-z.-]+)\): ", str(text))


def _feed(h, value: Any) -> None:
    if isinstance(value, np.ndarray):
        a = np.ascontiguousarray(value)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    else:
        h.update(json.dumps(value, sort_keys=True, default=str).encode())


def question_digest(msg: dict[str, Any], skip: tuple[str, ...] = ()) -> str:
    """sha256 of a message's content (secure-aggregation fields, a verified round's
    transcript and ``skip`` left out)."""
    h = hashlib.sha256()
    for k in sorted(msg):
        if k.startswith(("secagg", "verify/")) or k in skip:
            continue
        h.update(k.encode() + b"\0")
        _feed(h, msg[k])
    return h.hexdigest()


def _message_bytes(msg: dict[str, Any]) -> int:
    return sum(v.nbytes if isinstance(v, np.ndarray) else len(str(v)) for v in msg.values())


def _memory_budget(site: str, deployed: bool) -> None:
    """A lifetime budget whose ledger has no directory: refused on a deployed node, warned
    about elsewhere (it is forgotten with the process)."""
    text = (f"site {site!r}: its policy sets a lifetime budget (privacy.lifetime-epsilon) but "
            "no site directory, so its ledger would live in this process only and a new "
            "process would start the budget again; set [site] directory")
    if deployed:
        from fedlatent.engine.site.policy import PolicyError

        raise PolicyError(text)
    warnings.warn(text, UserWarning, stacklevel=4)
    logger.warning("%s", text)


class SiteGuard:
    """A site's policy and ledger, as one client node applies them.

    Parameters
    ----------
    policy : SitePolicy
    client_id : str
    dataset : str
        The data set the node answers from (its lifetime budget is composed on it).
    directory : path or None
        The site directory when the policy names none (a Flower node's ``site-dir``).
    keys : SiteKeys or None
        The site's signing key (it signs the ledger's anchor).
    deployed : bool
        A node of a deployment: a lifetime budget with nowhere to keep its ledger is refused
        (elsewhere it is warned about: the ledger then lives as long as the process).
    """

    def __init__(self, policy: SitePolicy, client_id: str, *, dataset: str = "default",
                 directory=None, keys=None, deployed: bool = False):
        self.policy = policy
        self.site = policy.site_name(client_id)
        self.dataset = str(dataset)
        where = policy.directory if policy.directory is not None else directory
        if where is None and policy.lifetime_epsilon is not None:
            _memory_budget(self.site, deployed)
        self.ledger = Ledger(where, self.site, keys=keys, witness=policy.witness)
        self.run: str | None = None
        self.plan: dict[str, Any] | None = None

    # ---- refusals --------------------------------------------------------------------------
    def refuse(self, rule: str, why: str, fix: str, **where: Any) -> dict[str, Any]:
        """The refusal reply (also written to the ledger and the log)."""
        text = self.refusal_text(rule, why, fix)
        self.ledger.append("refusal", run=self.run, dataset=self.dataset, rule=rule,
                           reason=text, **where)
        logger.warning("%s", text)
        return refusal_reply(text, f"site policy: {rule}")

    def refuse_all(self, whys: list[tuple[str, str, str]], **where: Any) -> dict[str, Any]:
        """The refusal reply naming every violated rule at once (``(rule, why, fix)`` each;
        the ledger's entry lists them all under ``rules``)."""
        if len(whys) == 1:
            return self.refuse(*whys[0], **where)
        text = self.refusal_text(*whys[0]) + "".join(
            f"; also ({rule}): {why}; fix: {fix}" for rule, why, fix in whys[1:])
        self.ledger.append("refusal", run=self.run, dataset=self.dataset, rule=whys[0][0],
                           rules=[w[0] for w in whys], reason=text, **where)
        logger.warning("%s", text)
        return refusal_reply(text, "site policy: " + ", ".join(w[0] for w in whys))

    def refusal_text(self, rule: str, why: str, fix: str) -> str:
        """The one-line reason of a refusal (for a model that raises it; the node's reply
        carries it and :meth:`after` writes it to the ledger)."""
        return f"site {self.site!r} refused ({rule}): {why}; fix: {fix}"

    def secagg(self, node, msg: dict[str, Any], step_fn) -> dict[str, Any]:
        """``step_fn(node, msg)``, a secure-aggregation step, under the policy: a key set-up
        under a label already used is refused (:meth:`claim_keys`); a step that raises (an
        unknown or substituted peer key, say) is written to the ledger as a refusal
        (``secagg.peer``) and raised again, as it would be without a policy."""
        if msg.get("step") == "keys":
            refusal = self.claim_keys(msg)
            if refusal is not None:
                return refusal
        try:
            return step_fn(node, msg)
        except Exception as err:
            text = f"site {self.site!r} refused (secagg.peer): {err}"
            self.ledger.append("refusal", run=self.run, dataset=self.dataset,
                               rule="secagg.peer", reason=text, exchange="secagg",
                               step=str(msg.get("step", "")))
            logger.warning("%s", text)
            raise

    def claim_keys(self, msg: dict[str, Any]) -> dict[str, Any] | None:
        """Refuse a second secure-aggregation key set-up under one label (a replay of old
        keys), whatever process answers: the set-ups are on the ledger, not in memory."""
        label = str(msg.get("run", ""))
        if label and self.ledger.of("secagg-keys", label=label):
            return self.refuse(
                "secagg.keys", f"the secure aggregation keys of {label!r} were set up already "
                "(a second set-up under one label replays old keys)",
                "set up new keys under a new label", exchange="secagg")
        self.ledger.append("secagg-keys", run=self.run, dataset=self.dataset, label=label,
                           round=int(msg.get("round", 0)))
        return None

    # ---- setup -----------------------------------------------------------------------------
    def setup(self, msg: dict[str, Any]) -> dict[str, Any] | None:
        """Check a setup against the floors and fix the run's plan; a refusal reply or None."""
        plan = {k: str(msg.get(k) or "") for k in _PLAN_KEYS}  # as a replayed setup has it
        plan["privacy_releases"] = int(msg.get("privacy_releases") or 0)
        digest = question_digest(plan)
        self.run = str(msg.get("run") or f"unnamed-{digest[:16]}")
        self.plan = None  # until this setup is accepted, nothing else is answered
        fixed = self.ledger.plan(self.run)
        if fixed is not None and fixed["digest"] != digest:
            return self.refuse(
                "plan", f"run {self.run!r} was set up with another plan (the plan of a run is "
                "fixed at its first setup: releases, exchanges, rounds)",
                "start a new run; its releases count against the site's lifetime budget",
                exchange="setup")
        whys = (self._model_refusal(plan) + self._disclosure_refusal(plan)
                + self._privacy_refusals(msg, fixed))
        if whys:
            return self.refuse_all(whys, exchange="setup")
        if fixed is None:
            self.ledger.append("plan", run=self.run, dataset=self.dataset, digest=digest,
                               model=str(plan["model"]), privacy=self._plan_privacy(msg),
                               verified=verified_rounds(msg))
        self.plan = self.ledger.plan(self.run)
        return None

    def _model_refusal(self, plan) -> list[tuple[str, str, str]]:
        models = self.policy.models
        if models is not None and str(plan["model"]) not in models:
            return [("answer.models", f"model {plan['model']!r} is not one it answers",
                     f"fit one of {list(models)}, or ask the site's operator")]
        return []

    def _disclosure_refusal(self, plan) -> list[tuple[str, str, str]]:
        from fedlatent.engine.privacy.enforce import policy_from_json

        sent = policy_from_json(str(plan["disclosure"] or ""))
        loose = looser(self.policy.disclosure, sent)
        if loose:
            return [("disclosure", f"the server's disclosure policy is looser than the site's "
                     f"floor: {', '.join(loose)}",
                     "send Federation(disclosure=...) at least as strict as the site's (a "
                     "server adopts the floors the sites announce at setup)")]
        return []

    def _privacy_refusals(self, msg, fixed) -> list[tuple[str, str, str]]:
        p = self.policy
        raw = str(msg.get("privacy") or "")
        if not raw:
            if p.privacy_required and not (p.verified_suffices and verified_rounds(msg)):
                return [("privacy.required", "the fit is not differentially private",
                         "fit with Federation(privacy=DifferentialPrivacy(...))")]
            return []
        from fedlatent.engine.privacy.dp import DifferentialPrivacy

        dp = DifferentialPrivacy.from_config(json.loads(raw))
        releases = int(msg.get("privacy_releases", 0))
        checks = [
            (p.max_epsilon is not None and dp.epsilon > p.max_epsilon, "privacy.max-epsilon",
             f"epsilon={dp.epsilon:g} above its ceiling {p.max_epsilon}",
             f"ask for epsilon <= {p.max_epsilon}"),
            (p.max_delta is not None and dp.delta > p.max_delta, "privacy.max-delta",
             f"delta={dp.delta:g} above its ceiling {p.max_delta}",
             f"ask for delta <= {p.max_delta}"),
            (dp.noise_seed is not None and not p.simulation, "privacy.noise-seed",
             "a noise_seed lets whoever knows it remove the noise; the site draws its own",
             "drop noise_seed (only a site whose policy says simulation = true honours it)"),
            (p.max_releases is not None and releases > p.max_releases, "limits.max-releases",
             f"the plan has {releases} releases, above its limit {p.max_releases}",
             f"plan at most {p.max_releases} releases (fewer rounds)"),
        ]
        out = [(rule, why, fix) for bad, rule, why, fix in checks if bad]
        return out + self._lifetime_refusal(dp, releases, fixed)

    def _lifetime_refusal(self, dp, releases: int, fixed) -> list[tuple[str, str, str]]:
        p = self.policy
        if p.lifetime_epsilon is None:
            return []
        z = dp.calibrate(releases).noise_multiplier
        made = 0 if fixed is None else self.ledger.releases(self.run)
        delta = p.lifetime_delta
        eps = self.ledger.lifetime_epsilon(self.dataset, delta, [(z, max(releases - made, 0))])
        if eps > p.lifetime_epsilon * (1 + 1e-9):
            spent = self.ledger.lifetime_epsilon(self.dataset, delta)
            left = max(p.lifetime_epsilon - spent, 0.0)
            return [("privacy.lifetime-epsilon",
                     f"this plan would bring data set {self.dataset!r} to epsilon={eps:.4g} "
                     f"(spent so far {spent:.4g}) above its lifetime budget "
                     f"{p.lifetime_epsilon}; {left:.4g} remains",
                     f"ask for a smaller epsilon (this data set has {left:.4g} left), or none")]
        return []

    def _plan_privacy(self, msg) -> dict[str, Any] | None:
        raw = str(msg.get("privacy") or "")
        if not raw:
            return None
        from fedlatent.engine.privacy.dp import DifferentialPrivacy

        dp = DifferentialPrivacy.from_config(json.loads(raw))
        c = dp.calibrate(int(msg["privacy_releases"]))
        return {"epsilon": c.epsilon, "delta": c.delta, "releases": c.releases,
                "noise_multiplier": c.noise_multiplier, "accountant": c.accountant}

    # ---- every other message ---------------------------------------------------------------
    def answer(self, node, method: str, msg: dict[str, Any], reply_fn) -> dict[str, Any]:
        """``node``'s reply to ``method`` under the policy: a refusal, the recorded answer of a
        re-asked question, or ``reply_fn(method, msg)`` (recorded). An unmasked reply is held
        to the per-client count rules even when the server's policy says ``aggregate``."""
        pre = self.before(method, msg)
        if pre is not None:
            kept = {k[len(_KEPT_STATE):]: v for k, v in pre.items()
                    if k.startswith(_KEPT_STATE)}
            if kept:  # a re-asked question: the node as it was after answering it
                node.state = kept
            return {k: v for k, v in pre.items() if not k.startswith(_KEPT_STATE)}
        saved = node.disclosure
        if (method in _DATA_METHODS and "secagg/slot" not in msg
                and saved.count_scope != "client"):
            node.disclosure = replace(saved, count_scope="client")
            if node.model is not None:
                node.model.disclosure = node.disclosure
        try:
            reply = reply_fn(method, msg)
        finally:
            node.disclosure = saved
            if node.model is not None:
                node.model.disclosure = saved
        self.after(method, msg, reply, node.state)
        return reply

    def before(self, method: str, msg: dict[str, Any]) -> dict[str, Any] | None:
        """A refusal or the recorded answer of ``method``'s ``msg``, or None (answer it)."""
        if method in PROTOCOL_EXCHANGES:
            return None
        exchange = str(msg["query"]) if method == "query" else method
        rnd = int(msg.get("round", 0))
        where = {"exchange": exchange, "round": rnd}
        why = self._message_refusal(method, exchange, msg, rnd)
        if why is not None:
            return self.refuse(*why, **where)
        key, digest = self._key(method, exchange, msg, rnd)
        done = self.ledger.of("answer", run=self.run, key=key)
        if not done:
            return None
        if "secagg/slot" in msg or done[0]["digest"] != digest:
            return self.refuse(
                "one-answer", f"{exchange} of round {rnd} of run {self.run!r} was answered "
                "already (a second answer to another question, or under other masks, lets "
                "the server difference the two)", "a server asks each question once", **where)
        kept = self.ledger.answer(key)
        if kept is None:
            return self.refuse("one-answer", f"{exchange} of round {rnd} was answered and "
                               "its answer is not kept", "a server asks each question once",
                               **where)
        logger.info("site %r: %s of round %d re-asked: the recorded answer", self.site,
                    exchange, rnd)
        self.ledger.append("replay", run=self.run, dataset=self.dataset, key=key, **where)
        return kept

    def _message_refusal(self, method, exchange, msg, rnd) -> tuple[str, str, str] | None:
        p = self.policy
        masked = "secagg/slot" in msg
        if self.plan is None:
            return ("setup", f"{exchange} asked before a setup it accepted",
                    "set the run up first, within the site's policy")
        if p.exchanges is not None and exchange not in p.exchanges:
            return ("answer.exchanges", f"exchange {exchange!r} is not one it answers",
                    f"use only {list(p.exchanges)}, or ask the site's operator")
        if method in _DATA_METHODS and not masked and p.secure_aggregation_required:
            return ("secure-aggregation.required", f"{exchange} is not masked",
                    "fit with Federation(secure_aggregation=True)")
        if p.max_message_bytes is not None and _message_bytes(msg) > p.max_message_bytes:
            return ("limits.max-message-bytes", f"the message holds {_message_bytes(msg)} "
                    f"bytes, above its limit {p.max_message_bytes}", "send smaller messages")
        # rounds are 1-based: a round numbered 0 or below, or an evaluation pass, would
        # otherwise be answered beyond the limit (one of each per number)
        if p.max_rounds is not None and method in _ROUND_METHODS and not (
                1 <= rnd <= p.max_rounds):
            where = (f"beyond its limit {p.max_rounds}" if rnd > 0
                     else f"not one of its rounds 1..{p.max_rounds}")
            return ("limits.max-rounds", f"round {rnd} is {where}",
                    f"plan at most {p.max_rounds} rounds")
        points = int(msg.get("points", 0) or 0) if method == "estep" else 0
        if p.max_points is not None and points > p.max_points:
            return ("limits.max-points", f"round {rnd} asks {points} extra point(s), above "
                    f"its limit {p.max_points}", f"ask at most {p.max_points} extra point(s) "
                    "a round (Federation(acceleration=None) asks none)")
        return None

    def _key(self, method, exchange, msg, rnd) -> tuple[str, str]:
        digest = question_digest(msg, skip=("run",))
        parts = [self.run or "", method, exchange, str(rnd)]
        if method == "query":  # queries of one round differ by their payload
            parts.append(digest)
        return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32], digest

    def after(self, method: str, msg: dict[str, Any], reply: dict[str, Any],
              state: dict[str, np.ndarray] | None = None) -> None:
        """Record what ``method`` answered (and keep an unmasked reply for a re-ask, with the
        node's ``state`` after it: a node asked again after a restore continues from there)."""
        if method in PROTOCOL_EXCHANGES:
            return
        exchange = str(msg["query"]) if method == "query" else method
        rnd = int(msg.get("round", 0))
        if ERROR_KEY in reply:  # the site's own rule (a release beyond the plan), or the model's
            text = str(reply[ERROR_KEY])
            rule = parse_refusal(text)
            self.ledger.append("refusal", run=self.run, dataset=self.dataset,
                               rule=rule[1] if rule else "model", reason=text,
                               exchange=exchange, round=rnd)
            return
        key, digest = self._key(method, exchange, msg, rnd)
        masked = "secagg/slot" in msg
        self.ledger.append("answer", run=self.run, dataset=self.dataset, exchange=exchange,
                           round=rnd, key=key, digest=digest, masked=masked)
        if not masked:
            kept = {_KEPT_STATE + k: np.asarray(v) for k, v in (state or {}).items()}
            self.ledger.keep_answer(key, {**reply, **kept})

    # ---- differential privacy --------------------------------------------------------------
    def before_release(self, privacy, state: dict[str, np.ndarray], what: str) -> None:
        """Refuse (PrivacyBudgetExceeded) a release beyond the run's plan or the data set's
        lifetime budget; sync the node's release count from the ledger (a restored state
        cannot roll it back)."""
        from fedlatent.engine.privacy.client_dp import STATE_KEY
        from fedlatent.engine.privacy.dp import PrivacyBudgetExceeded

        made = self.ledger.releases(self.run)  # the run's own count, whatever the state says
        state[STATE_KEY] = np.array(float(made))
        c = privacy.calibration
        if made + 1 > c.releases:
            raise PrivacyBudgetExceeded(
                f"site {self.site!r} refused (privacy.plan): {what} would be release "
                f"{made + 1} of run {self.run!r}, whose plan has {c.releases} (its ledger "
                "counts them); fix: a run spends no more than its plan")
        p = self.policy
        if p.lifetime_epsilon is not None:
            delta = p.lifetime_delta
            eps = self.ledger.lifetime_epsilon(self.dataset, delta, [(c.noise_multiplier, 1)])
            if eps > p.lifetime_epsilon * (1 + 1e-9):
                left = max(p.lifetime_epsilon - self.ledger.lifetime_epsilon(self.dataset,
                                                                             delta), 0.0)
                raise PrivacyBudgetExceeded(
                    f"site {self.site!r} refused (privacy.lifetime-epsilon): {what} would "
                    f"bring data set {self.dataset!r} to epsilon={eps:.4g} above its lifetime "
                    f"budget {p.lifetime_epsilon} ({left:.4g} remains); fix: none, the budget "
                    "is spent")

    def released(self, privacy, msg: dict[str, Any], what: str, records: int) -> None:
        """Write one release to the ledger (called before its reply leaves)."""
        c = privacy.calibration
        k = self.ledger.releases(self.run) + 1
        self.ledger.append("release", run=self.run, dataset=self.dataset,
                           exchange=str(msg.get("query", "estep")), round=int(msg.get("round", 0)),
                           what=what, mechanism="gaussian", noise=privacy.dp.noise,
                           noise_multiplier=c.noise_multiplier, release=k, planned=c.releases,
                           epsilon_run=c.epsilon_after(min(k, c.releases)), delta=c.delta,
                           accountant=c.accountant, records=int(records))
