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
  suppressed (sent as zeros) by :func:`suppress_blocks`; the rest of the reply is sent;
- such a block is also suppressed when, with the blocks the client released before, a linear
  combination would be a sum over too few records (:func:`suppress_differences`: differencing
  across rounds and clusters);
- at setup, the saturation and rare-level rules of
  :mod:`fedlatent.engine.privacy.disclosure` (:func:`setup_rule_refusal`).

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
    "looser",
    "policy_from_json",
    "policy_to_json",
    "setup_refusal",
    "stricter",
    "suppress_blocks",
    "suppress_differences",
]

#: the client-state key of the released blocks' span (an orthonormal basis, units x rank)
BASIS_KEY = "disclosure/basis"
_ONE = 1.0 - 1e-9  # a projection's norm this close to 1: the unit vector is in the span

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


def looser(floor: DisclosurePolicy, sent: DisclosurePolicy) -> list[str]:
    """The disclosure settings in which ``sent`` is looser than ``floor``, as
    ``"name=value (floor value)"`` (count scope aside: it is enforced per message)."""
    out = []
    for f in fields(DisclosurePolicy):
        a, b = getattr(floor, f.name), getattr(sent, f.name)
        if f.name == "count_scope":
            continue
        if f.name == "allow_row_storing_learners":
            loose = b and not a
        elif f.name in _LOWER_IS_STRICTER:
            loose = b > a
        else:
            loose = b < a
        if loose:
            out.append(f"{f.name}={b} (floor {a})")
    return out


def setup_refusal(policy: DisclosurePolicy, client: str, n_records: int) -> str | None:
    """Why a client holding ``n_records`` records refuses to take part, or None."""
    if policy.count_scope != "client" or not 0 < n_records < policy.min_records:
        return None
    return (f"client {client!r}: refused by the disclosure policy: min_records="
            f"{policy.min_records} (it holds fewer records, so every sum it could send "
            f"would disclose them; DataSHIELD nfilter.tab). Merge it with another client, or "
            f"pass Federation(disclosure=DisclosurePolicy(min_records=...)) or "
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
    return _zeroed(stats, names, small), small.tolist()


def _zeroed(stats: Stats, names, blocks) -> Stats:
    """``stats`` with the blocks ``blocks`` (axis 0) of the statistics ``names`` set to zero
    (copies; the others shared)."""
    out = dict(stats.items())
    for name in names:
        v = np.array(out[name], dtype=np.float64, copy=True)
        v[blocks] = 0.0
        out[name] = v
    return Stats(out, copy=False)


def setup_rule_refusal(policy: DisclosurePolicy, client: str, model, data, levels,
                       batch_records: int | None = None) -> str | None:
    """Why a client refuses the setup under the rules on what a reply determines, or None.

    ``levels``: ``[(column, level names, records per level)]`` of the client's one-hot encoded
    columns and the model's own categorical variables (the rare-level rule, every scope);
    the saturation rule (``count_scope="client"`` only) counts ``model.reply_numbers(data)``
    against the client's records, and against ``batch_records`` when the fit draws
    mini-batches (they are replies too)."""
    from fedlatent.engine.privacy.disclosure import check_level_counts, check_reply_numbers

    for column, names, counts in levels:
        why = check_level_counts(policy, client, column, names, counts)
        if why:
            return why
    if policy.count_scope != "client":
        return None
    n_rec = model.n_records(data)
    for records, what in ((n_rec, "the round statistic"),
                          (batch_records, "a mini-batch statistic")):
        if records is None or records <= 0:
            continue
        why = check_reply_numbers(policy, f"client {client!r}", model.reply_numbers(data),
                                  min(records, n_rec), model.record_width(data), what)
        if why:
            return why
    return None


def _discloses(Q: np.ndarray, records: np.ndarray, t: int) -> bool:
    """Whether the span of the orthonormal columns ``Q`` (units x rank) holds a non-zero
    vector supported on units whose records sum to ``0 < n < t``: one unit of fewer than
    ``t`` records, or two whose records sum to fewer (complete for ``t <= 3``)."""
    small = (records > 0) & (records < t)
    if not small.any():
        return False
    norm2 = np.einsum("ij,ij->i", Q, Q)  # |projection of e_j on the span|^2
    if np.any(norm2[small] >= _ONE):
        return True
    idx = np.flatnonzero((records > 0) & (records <= t - 2))
    if idx.size < 2:
        return False
    G = Q[idx] @ Q[idx].T  # the span meets span(e_i, e_j) iff [[Gii, Gij], [Gij, Gjj]]
    a = np.diag(G)  # has eigenvalue 1
    top = (a[:, None] + a[None, :]) / 2 + np.sqrt(((a[:, None] - a[None, :]) / 2) ** 2 + G**2)
    pair = (records[idx][:, None] + records[idx][None, :]) < t
    np.fill_diagonal(pair, False)
    return bool(np.any(top[pair] >= _ONE))


def _extend(Q: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    """``Q`` with ``b``'s direction outside its span added (None: ``b`` is in the span)."""
    u = b - Q @ (Q.T @ b)
    u = u - Q @ (Q.T @ u)  # twice: Gram-Schmidt keeps its orthogonality
    norm = float(np.linalg.norm(u))
    if norm <= 1e-9 * max(float(np.linalg.norm(b)), 1.0):
        return None
    return np.column_stack([Q, u / norm])


def _release(Q: np.ndarray, M: np.ndarray, records: np.ndarray, first: np.ndarray,
             t: int) -> tuple[np.ndarray, list[int]]:
    """The span after releasing the blocks of ``M`` that keep it safe, and the others."""
    small = []
    for k in range(M.shape[0]):
        if not M[k].any() or not np.any(first[k]):  # empty, or suppressed already
            continue
        Q2 = _extend(Q, M[k].astype(np.float64))
        if Q2 is None:
            continue
        if _discloses(Q2, records, t):
            small.append(k)
        else:
            Q = Q2
    return Q, small


def suppress_differences(policy: DisclosurePolicy, stats: Stats, names: tuple[str, ...],
                         members, state: dict[str, np.ndarray]) -> tuple[Stats, list[int]]:
    """``stats`` with every block zeroed whose release would let the server combine this
    client's released blocks into a sum over too few records; the suppressed blocks.

    Parameters
    ----------
    policy : DisclosurePolicy
        ``min_records_per_block`` is the threshold (``count_scope="client"`` only: under
        secure aggregation the server sees no client's blocks).
    stats : Stats
        The reply, blocks already suppressed by :func:`suppress_blocks` zeroed.
    names : tuple of str
        The statistics whose axis 0 indexes the blocks.
    members : (ndarray (n_blocks, n_units) of bool, ndarray (n_units,)) or None
        The units of each block and each unit's records (``model.disclosure_members``).
    state : dict
        The client's private state; the span of what it released is kept in it
        (``BASIS_KEY``) and updated.

    Every block released is a sum over a set of units; the server knows every linear
    combination of the released sums. The span of the released sets' indicator vectors is
    kept (an orthonormal basis; it starts with the all-ones vector, the client's totals, which
    initialization queries release). A block whose set is already in the span adds nothing.
    Otherwise it is released only if the span with it holds no vector supported on units of
    ``0 < n < min_records_per_block`` records in total (:func:`_discloses`); else it is sent
    as zeros and the span is unchanged. The cost is one projection per new block; the basis
    holds at most one column per unit, and is kept only for a client with a unit under the
    threshold (no such unit: nothing can be disclosed below it).
    """
    t = policy.min_records_per_block
    if members is None or policy.count_scope != "client" or t <= 1:
        return stats, []
    M, records = members
    records = np.asarray(records, dtype=np.float64)
    if not np.any((records > 0) & (records < t)):
        return stats, []
    E = records.size
    Q = np.asarray(state.get(BASIS_KEY, np.ones((E, 1)) / np.sqrt(max(E, 1))), dtype=np.float64)
    if Q.shape[0] != E:  # the units changed (a new data set): start again
        Q = np.ones((E, 1)) / np.sqrt(max(E, 1))
    state[BASIS_KEY], small = _release(Q, M, records, np.asarray(stats[names[0]]), t)
    if not small:
        return stats, []
    return _zeroed(stats, names, small), small
