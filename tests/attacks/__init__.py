"""An automated reconstruction attacker (issue 22, item 2): an honest-but-curious server that keeps
everything it sees in a fit and solves for the smallest client's rows.

- :mod:`attacks.transcript` runs a fit and records what the server holds: every message that
  crosses (in order) and, under secure aggregation, every unmasked sum with its cohort.
- :mod:`attacks.attacker` sets up and solves the equations: an exact solve from per-block moment
  matrices (one reply, or all of them jointly: differencing across rounds), linear differencing
  of aggregates over overlapping cohorts, and a nonlinear least squares that replays the recorded
  messages on candidate rows.
- :mod:`attacks.models` holds one small adapter per registered model (its data, how its
  statistics read as moment matrices, how candidate rows become a client's data).
"""
