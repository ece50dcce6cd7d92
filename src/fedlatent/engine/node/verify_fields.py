"""What else a verified exchange's message asks of a site, checked (issue 38): the round's
settings, the weight and unit its reply is scaled by, and the control variates' start.

Replaying the parameters is not enough: an E-step's message also says *how* to compute the
reply (``mode``, ``batch_size``, ``control_variates``, ``alpha``, ``quant_levels``,
``keep_init``, ``V_reset/``), and the secure exchange by what to scale it
(``secagg/weight``, ``secagg/unit``). Each of these, chosen by a server that does not follow
the protocol, steers what leaves a site without moving a parameter: a mini-batch of one makes
the reply one record's statistic; control variates reset, or turned on with ``alpha = 0``,
shift every reply and so the verified aggregate and the ``S_hat`` every site replays from it;
weights of zero for all sites but one make the secure sum that site's reply. So a verifying
site answers only the values the setup's federation gives:

- the round's settings are :func:`~fedlatent.engine.fedem.update.round_message` of the
  setup's federation, the committed seed, the round and whether the server's state is still
  uninitialized (the site's own replay says: no ``S_hat`` kept yet), and ``V_reset/`` (a
  server's reset of a client's control variate after it refused a reply in the clear) is
  never answered (:func:`round_refusal`);
- its weight is its own units over the federation's (``client_weighting="samples"``) or one
  over the number of clients, and the unit one over the federation's units, the numbers the
  first exchange said and the site kept (:func:`scale_refusal`);
- what each site checks these against must be what every other site was sent too: the
  setup (model, its configuration, the federation), the federation's units and the committed
  seed are hashed with the transcript's digest into the exchange's pair masks and
  consistency tokens (:func:`bound`), so two neighbours told different ones compute
  different tokens and neither reveals (as for two transcripts);
- ``cv_init``'s ``S_hat`` (the control variates start from ``S_c(theta_0) - S_hat``) is kept
  and, at the next E-step, must be the ``S_hat`` the site replayed from the initialization
  round's verified aggregate (:func:`keep_cv_start`, :func:`cv_start_refusal`), before any
  reply computed from it leaves; only the ``cv_init`` that sets the control variate is kept
  (a later one changes nothing and must not replace the one checked).

A steady round costs little: a message's field names are read once per tuple of names
(:func:`fields_of`), each setting equal to the expected one and of its type is accepted at
once (anything else is judged by the full comparison, which words the refusal), and the
bytes the binding hashes after the digest are kept with the arrays they were made from.
"""

from __future__ import annotations

import functools
import hashlib
from typing import Any, NamedTuple

import numpy as np

__all__ = ["CV_KEPT", "Fields", "bound", "cv_start_refusal", "fields_of", "keep_cv_start",
           "round_refusal", "scale_refusal"]

_CV = "verify/cv-start/"  # cv_init's S_hat, kept until the next E-step checks it
#: the mark that a cv_init's S_hat is kept (the next E-step checks it)
CV_KEPT = _CV[:-1]
#: a weight or unit may differ from the site's own quotient by this much (relative): the same
#: two numbers divided on both sides give the same bits; the slack is for another machine's
_RTOL = 1e-12


def round_refusal(node, fed, msg: dict[str, Any], rnd: int, seed: int, init_round: bool,
                  who: str) -> str | None:
    """Why the round settings of the E-step message ``msg`` are not those the setup's
    federation ``fed`` gives for round ``rnd`` (None: they are). Each setting equal to the
    federation's, of its type, is accepted at once (:func:`_same`'s first test,
    :func:`_exact`)."""
    f = fields_of(tuple(msg))
    if f.reset:
        return (f"{who}: it resets this site's control variate (V_reset), which a verifying "
                "site never takes from the server: its control variate follows from its own "
                "replies")
    if init_round and f.shown:
        return (f"{who}: it sends an S_hat in the fit's first round, where the server's state "
                "holds none: each reply would be the statistic less the server's choice")
    got = msg.get("round")
    if f.secure and not _same(got, rnd):
        return (f"{who}: its 'round' ({msg.get('round')!r}) is not the exchange's round "
                f"({rnd})")
    alpha = _alpha(node, fed, msg)
    want = _round_message()(fed, seed, rnd, init_round, alpha)
    for k, v in want.items():
        got = msg.get(k)
        if not _same(got, v):
            return (f"{who}: its {k!r} is {got!r}, where the setup's federation gives {v!r} "
                    "for this round: a verifying site computes only what the setup asked")
    for k in f.extra:
        if k not in want:
            return (f"{who}: it carries {k!r} = {msg[k]!r}, which the setup's federation does "
                    "not give for this round")
    return None


class Fields(NamedTuple):
    """What a message's field names say (:func:`fields_of`): ``kept``, its fields but the
    transcript's (``verify/``), in its order; whether it carries a ``V_reset/`` (``reset``),
    an ``S_hat/`` (``shown``) and a ``secagg/round`` (``secure``); ``extra``, which of
    ``batch_size`` and ``keep_init`` it carries (in that order)."""

    kept: tuple
    reset: bool
    shown: bool
    secure: bool
    extra: tuple


@functools.lru_cache(maxsize=64)
def fields_of(keys: tuple) -> Fields:
    """:class:`Fields` of a message's field names ``keys`` (``tuple(msg)``: in its order),
    read once per distinct tuple of names (a steady fit's rounds carry the same)."""
    return Fields(tuple(k for k in keys if not k.startswith("verify/")),
                  any(k.startswith("V_reset/") for k in keys),
                  any(k.startswith("S_hat/") for k in keys), "secagg/round" in keys,
                  tuple(k for k in ("batch_size", "keep_init") if k in keys))


@functools.cache
def _round_message():
    from fedlatent.engine.fedem.update import round_message

    return round_message


#: the largest integer magnitude every integer below has an exact float64 of (2^53)
_EXACT_INT = 2 ** 53


def _exact(got, want) -> bool:
    """``got`` is ``want``, of its very type (a bool, str, float, or an int a float64 holds
    exactly): :func:`_judged` accepts it too; False says nothing (then :func:`_judged` decides)."""
    t = type(want)
    return type(got) is t and got == want and (t is not int or -_EXACT_INT <= want <= _EXACT_INT)


def _alpha(node, fed, msg: dict[str, Any]) -> float:
    """The control-variate step the server's federation takes (its statistic's shapes only
    matter with a quantizer and no ``alpha`` given)."""
    if fed.alpha is not None or fed.quantizer is None:
        return fed.alpha_for({})
    from fedlatent.engine.protocol.messages import unpack

    return fed.alpha_for(node.model.stat_shapes(unpack(msg, "params")))


def _same(got, want) -> bool:
    """``got`` is the setting ``want``: :func:`_exact` at once (the steady case), else
    :func:`_judged`."""
    return _exact(got, want) or _judged(got, want)


def _judged(got, want) -> bool:
    """The full comparison: a bool or a string as it is, a number within ``_RTOL``."""
    if isinstance(want, bool):
        return isinstance(got, bool | np.bool_) and bool(got) == want
    if isinstance(want, str):
        return isinstance(got, str) and got == want
    try:
        g = float(np.asarray(got, dtype=np.float64).reshape(()))
    except (TypeError, ValueError):
        return False
    return g == want or abs(g - want) <= _RTOL * abs(want)


def scale_refusal(node, msg: dict[str, Any], method: str, units: tuple[float, float],
                  weighting: str, who: str) -> str | None:
    """Why the secure exchange's ``secagg/unit`` (and, for an E-step, ``secagg/weight``) are
    not the site's (None: they are): the unit ``1 / N`` and the weight ``n_c / N`` or ``1 /
    n_clients``, with ``units = (N, n_clients)`` as the first exchange said."""
    n_total, n_clients = units
    checks = [("secagg/unit", 1.0 / n_total)]
    if method == "estep":
        own = float(node.model.n_units(node._data))
        checks.append(("secagg/weight", own / n_total if weighting == "samples"
                       else 1.0 / n_clients))
    for k, v in checks:
        got = msg.get(k)
        if not _same(got, v):
            return (f"{who}: its {k!r} is {msg.get(k)!r}, not this site's {v!r} (its units "
                    f"over the federation's {n_total:g}, as the first exchange said): a "
                    "reply scaled otherwise would weigh the sites as the server chose")
    return None


def keep_cv_start(node, msg: dict[str, Any]) -> None:
    """Keep ``cv_init``'s ``S_hat`` (checked at the next E-step) if it is the one this site's
    control variate starts from: the site still holds the initialization round's statistic
    (``init_S/``), which this ``cv_init`` consumes. One that changes nothing (before that
    round, or a second one) is not kept: else a server could set the control variates from
    one ``S_hat`` and have the next round check another."""
    if not any(k.startswith("init_S/") for k in node.state):
        return
    for k in [k for k in node.state if k.startswith(_CV)]:
        del node.state[k]
    node.state.update({_CV + k[6:]: np.array(v, dtype=np.float64, copy=True)
                       for k, v in msg.items() if k.startswith("S_hat/")})
    node.state[CV_KEPT] = np.array(1.0)


def cv_start_refusal(node, replayed: dict[str, Any], rnd: int) -> str | None:
    """Why the kept ``cv_init`` ``S_hat`` is not ``replayed`` (the ``S_hat`` this site
    replayed from the initialization round: None when it is, or nothing was kept); what was
    kept is forgotten either way."""
    if CV_KEPT not in node.state:
        return None
    from fedlatent.engine.node.replay import params_refusal

    kept = {k[len(_CV):]: v for k, v in node.state.items() if k.startswith(_CV)}
    for k in [k for k in node.state if k.startswith(CV_KEPT)]:
        del node.state[k]
    why = params_refusal(kept, replayed, rnd, node.client_id)
    if why is None:
        return None
    return (why.replace("its parameters", "the S_hat its control variates started from")
            .replace("parameter ", "cv_init's S_hat field ")
            + " (the control variates' start, cv_init, is not the verified aggregate's)")


_BOUND_TAG = b"fedlatent/verify/bound\x00"


def bound(node, digest: bytes) -> bytes:
    """What a site binds into an exchange's pair masks and tokens: SHA-256 of the
    transcript's ``digest``, its setup's (``verify/setup``), the federation's units and
    clients (``verify/units``) and the committed seed (``verify/seed``), each as the site
    holds it (absent: empty), its length first (4 bytes). The bytes after the digest are
    kept on the node with the three arrays they were made from, and made again whenever
    the node holds another array for any of them (each held by the cache, so no other array
    can take its address; the state's arrays are replaced, never written in place)."""
    state = node.state
    held = (state.get("verify/setup"), state.get("verify/units"), state.get("verify/seed"))
    got = getattr(node, "_verify_bound", None)
    if got is None or got[0] is not held[0] or got[1] is not held[1] or got[2] is not held[2]:
        parts = []
        for v in held:
            raw = b"" if v is None else np.ascontiguousarray(v).tobytes()
            parts += [len(raw).to_bytes(4, "little"), raw]
        got = node._verify_bound = (*held, b"".join(parts))
    return hashlib.sha256(_BOUND_TAG + bytes(digest) + got[3]).digest()
