"""Disclosure control of SEC's Select step, on the learner (issue 12, part 1).

A learner sends its fitted model, so what the model stores is what it discloses:

- a tree's leaf value is a mean over the training records in the leaf (one record: its raw
  ``y``, which the learner's ``y`` scaling sent beside the model turns back into the raw value);
  every candidate with a ``min_samples_leaf`` below the policy's ``tree_min_leaf`` is fitted with
  ``tree_min_leaf`` instead, and the fitted model's leaves are checked before it is sent (a
  forest's bootstrap weights do not count: scikit-learn counts the distinct records in a leaf);
- a model that stores training rows (KNN's neighbours, SVR's support vectors, kernel centres)
  is refused unless ``allow_row_storing_learners``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...engine.privacy.disclosure import DisclosurePolicy, check_tree_leaves
from ...engine.privacy.enforce import DisclosureRefused
from .candidates import _MEMORIZING, _final

__all__ = ["enforce_candidate", "leaf_sizes", "refuse_small_leaves"]


def enforce_candidate(policy: DisclosurePolicy, name: str, est: Any) -> Any:
    """``est`` with ``min_samples_leaf`` raised to ``tree_min_leaf`` (integer settings; a
    fractional one is checked after the fit); raises :class:`DisclosureRefused` for a candidate
    whose fitted model stores training rows, unless the policy allows it."""
    kind = type(_final(est)).__name__
    if kind in _MEMORIZING and not policy.allow_row_storing_learners:
        raise DisclosureRefused(
            f"candidate {name!r} ({kind}) stores training rows in its fitted model, so sending "
            f"it sends them; refused by the disclosure policy (allow_row_storing_learners="
            f"False). Remove it from the candidates, or pass federation=fl.Federation("
            f"disclosure=fl.DisclosurePolicy(allow_row_storing_learners=True)) if the rows may "
            f"be shared")
    params = est.get_params(deep=True)
    raise_to = {k: policy.tree_min_leaf for k, v in params.items()
                if (k == "min_samples_leaf" or k.endswith("__min_samples_leaf"))
                and isinstance(v, int | np.integer) and not isinstance(v, bool)
                and v < policy.tree_min_leaf}
    if raise_to:
        est.set_params(**raise_to)
    return est


def leaf_sizes(model: Any) -> np.ndarray:
    """Training records in every leaf of every tree of a fitted model (empty: no trees)."""
    final = _final(model)
    trees = [final] if hasattr(final, "tree_") else [
        t for t in np.ravel(np.asarray(getattr(final, "estimators_", []), dtype=object))
        if hasattr(t, "tree_")]
    sizes = [t.tree_.n_node_samples[t.tree_.children_left == -1] for t in trees]
    return np.concatenate(sizes) if sizes else np.zeros(0)


def refuse_small_leaves(policy: DisclosurePolicy, name: str, model: Any) -> None:
    """Raise :class:`DisclosureRefused` if a leaf of the fitted ``model`` holds fewer than
    ``tree_min_leaf`` training records."""
    reason = check_tree_leaves(policy, "", leaf_sizes(model), f"candidate {name!r}")
    if reason:
        raise DisclosureRefused(reason.removeprefix("client '': "))
