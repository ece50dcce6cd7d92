"""One integer seed from what a user gives as ``random_state``."""

from __future__ import annotations

import numpy as np

__all__ = ["resolve_seed"]


def resolve_seed(random_state) -> int:
    """One integer seed from an int, a Generator or None (fresh entropy)."""
    if random_state is None:
        return int(np.random.SeedSequence().entropy % (2**63))
    if isinstance(random_state, np.random.Generator):
        return int(random_state.integers(0, 2**63 - 1))
    if isinstance(random_state, np.random.RandomState):
        return int(random_state.randint(0, 2**31 - 1))
    return int(random_state)
