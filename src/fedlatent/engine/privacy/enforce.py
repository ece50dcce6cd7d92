"""Disclosure control where the data are: what a client node does with a :class:`DisclosurePolicy`.

The server sends its policy in the ``setup`` message (``Federation(disclosure=...)``); the client
enforces it, so a server cannot ask for more than the policy lets out. A node may also hold a
policy of its own (``ClientNode(..., disclosure=...)``, a site's floor): the policy in force is
then the stricter of the two (:func:`stricter`), so a server can tighten a site's rules but never
loosen them.

What a client refuses (the model hooks are in
:class:`fedlatent.engine.contract.model.FederatedModel`):

- at ``setup``: a client holding fewer than ``min_records`` records can answer nothing that is
  not a function of fewer than ``min_records`` records; it refuses the setup, which stops the
  fit before the first round with :func:`setup_refusal`'s text (client, rule, fix);
- every E-step and evaluation reply is a sum over ``model.n_records(data, rows)`` records (a
  mini-batch's, under ``Federation(batch_size=...)`` or SPIDER); fewer than ``min_records``:
  :class:`DisclosureRefused` (the round records the client as missing, with the text, in
  ``history_.errors``);
- blocks of a reply that are sums over hard-labelled subsets (``model.disclosure_blocks``:
  HLCR's cluster blocks of an agent) over ``0 < n < min_records_per_block`` records are
  suppressed (sent as zeros) by :func:`suppress_blocks`; the rest of the reply is sent.

Model-specific queries consult ``model.disclosure`` themselves (the Gaussian mixture's local
k-means centroids and hard-assignment blocks, SEC's learners).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, fields

import numpy as np

from fedlatent.engine.privacy.disclosure import DisclosurePolicy
from fedlatent.engine.stats import Stats

__all__ = [
    "DisclosureRefused",
    "policy_from_json",
    "policy_to_json",
    "setup_refusal",
    "stricter",
    "suppress_blocks",
]

_LOWER_IS_STRICTER = ("max_parameters_per_record", "max_levels_density")


class DisclosureRefused(RuntimeError):
    """A client declined to send a reply that the disclosure policy protects."""


def policy_to_json(policy: DisclosurePolicy) -> str:
    """The policy as JSON (``inf`` written as ``"inf"``: JSON has no infinity)."""
    return json.dumps({k: ("inf" if isinstance(v, float) and math.isinf(v) else v)
                       for k, v in asdict(policy).items()}, sort_keys=True)


def policy_from_config(config: dict | DisclosurePolicy | None) -> DisclosurePolicy:
    """A policy from :func:`policy_to_json`'s dict (None: the default, on)."""
    if isinstance(config, DisclosurePolicy):
        return config
    if not config:
        return DisclosurePolicy()
    known = {f.name for f in fields(DisclosurePolicy)}
    unknown = sorted(set(config) - known)
    if unknown:
        raise ValueError(f"disclosure policy: unknown setting(s) {unknown}; known: {sorted(known)}")
    return DisclosurePolicy(**{k: (math.inf if v == "inf" else v) for k, v in config.items()})


def policy_from_json(text: str | None) -> DisclosurePolicy:
    """Inverse of :func:`policy_to_json`; an empty or missing text is the default policy (on):
    a server that says nothing does not switch disclosure control off."""
    return policy_from_config(json.loads(text) if text else None)


def stricter(a: DisclosurePolicy, b: DisclosurePolicy) -> DisclosurePolicy:
    """The policy that refuses whatever ``a`` or ``b`` refuses."""
    out = {}
    for f in fields(DisclosurePolicy):
        va, vb = getattr(a, f.name), getattr(b, f.name)
        if f.name == "allow_row_storing_learners":
            out[f.name] = va and vb
        elif f.name == "count_scope":
            out[f.name] = "client" if "client" in (va, vb) else va
        elif f.name in _LOWER_IS_STRICTER:
            out[f.name] = min(va, vb)
        else:
            out[f.name] = max(va, vb)
    return DisclosurePolicy(**out)


def setup_refusal(policy: DisclosurePolicy, client: str, n_records: int) -> str | None:
    """Why a client holding ``n_records`` records refuses to take part, or None."""
    if policy.count_scope != "client" or not 0 < n_records < policy.min_records:
        return None
    return (f"client {client!r}: refused by the disclosure policy: min_records="
            f"{policy.min_records} (it holds {n_records} record(s), so every sum it could send "
            f"would disclose them; DataSHIELD nfilter.tab). Merge it with another client, or "
            f"pass Federation(disclosure=DisclosurePolicy(min_records={n_records})) or "
            f"Federation(disclosure=DisclosurePolicy.off()) if its records may be disclosed")


def suppress_blocks(policy: DisclosurePolicy, stats: Stats,
                    blocks: tuple[np.ndarray, tuple[str, ...]] | None) -> tuple[Stats, list[int]]:
    """``stats`` with every block over ``0 < n < min_records_per_block`` records zeroed, and the
    indices of the suppressed blocks. ``blocks``: the model's per-block record counts and the
    names of the statistics whose axis 0 indexes the blocks (None: nothing to suppress)."""
    if blocks is None or policy.count_scope != "client":
        return stats, []
    counts, names = blocks
    counts = np.asarray(counts, dtype=np.float64)
    small = np.flatnonzero((counts > 0) & (counts < policy.min_records_per_block))
    if small.size == 0:
        return stats, []
    out = dict(stats.items())
    for name in names:
        v = np.array(out[name], dtype=np.float64, copy=True)
        v[small] = 0.0
        out[name] = v
    return Stats(out, copy=False), small.tolist()
