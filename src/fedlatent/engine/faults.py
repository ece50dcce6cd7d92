"""The errors of a federated fit: a fault during a run and a failed server step.

Their own module (no scikit-learn, nothing of the round loop), so every part of the engine that
stops a fit (the rounds, the collectors, the checked exchange, secure aggregation) raises them
without importing the loop: no import circle.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FederatedFitError", "ServerStepError"]


class FederatedFitError(RuntimeError):
    """A fault during a run. ``last_good`` holds the parameters of the last good round,
    ``round_`` (also ``round``) the round that failed, ``clients`` every client it names
    (``faults``: client -> reason; the message shows at most 10 of them)."""

    def __init__(self, message: str, last_good: dict[str, Any] | None = None,
                 round_: int | None = None, faults: dict[str, str] | None = None):
        super().__init__(message)
        self.last_good = last_good
        self.round = round_
        self.faults: dict[str, str] = dict(faults or {})
        self.clients: list[str] = list(self.faults)

    @property
    def round_(self) -> int | None:
        return self.round


class ServerStepError(FederatedFitError, ValueError):
    """The M-step failed on the aggregated statistics (overflow, a singular system): the
    round is named and the last good state kept. Also a ValueError, as the error the model
    raised was."""
