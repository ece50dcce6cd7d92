"""A round of the FedEM loop: plan -> gather -> server step -> record.

- :mod:`.plan`: :class:`RoundPlan`, what one round asks (its number, draw of clients, message,
  step, participation, bytes of a reply), made once per round by the loop;
- :mod:`.aggregate`: :class:`Aggregate`, what every collector returns (the weighted sum of the
  accepted replies and the round's record);
- :mod:`.screen`: the checks of the replies (:class:`Screen`) and the server's mirror of the
  clients' control variates (:class:`Mirror`), written once for every collector;
- :mod:`.collectors`: the :class:`Collector` interface and its collectors, one client at a time
  and batched (the secure collector is in :mod:`fedlatent.engine.rounds.secure_round`);
- :mod:`.evaluation`: ``||h(S_hat)||^2`` from any collector's evaluation pass.
"""

from fedlatent.engine.rounds.aggregate import Aggregate, Stacked
from fedlatent.engine.rounds.plan import RoundPlan

__all__ = ["Aggregate", "RoundPlan", "Stacked"]
