"""HLCR block differencing (issue 22, item 1): an agent's cluster blocks over 3 or more
events are sent, but two blocks released in different rounds (or clusters) can differ by one
entity of one event, and their difference is that event (x and y). The client keeps the span of
the blocks it released and suppresses a block whose release would put a sum over fewer than
``min_records_per_block`` events in it; the differencing attack then recovers no event."""

from __future__ import annotations

import math
import warnings
from itertools import combinations

import numpy as np

import fedlatent as fl
from fedlatent.engine.privacy import record_from_regression_block
from fedlatent.engine.protocol.messages import ERROR_KEY
from fedlatent.engine.stats import Stats

# every rule on (saturation aside: the small agent is the point of this test, not its size)
POLICY = fl.DisclosurePolicy(max_parameters_per_record=math.inf)


def _data():
    """Agent 'a': eight one-event entities and two of six events; four other agents."""
    rng = np.random.default_rng(3)
    data, ents = {}, {}
    for c in ("a", "b", "c", "d", "e"):
        sizes = [1] * 8 + [6, 6] if c == "a" else [5, 4, 6, 5]
        X = rng.normal(size=(sum(sizes), 2)) * 3.0
        y = X @ rng.normal(size=2) + rng.normal(size=len(X)) * 5.0
        data[c] = (X, y)
        ents[c] = np.repeat([f"{c}{i:02d}" for i in range(len(sizes))], sizes)
    return fl.FederatedDataset.from_arrays(data, entities=ents), data["a"]


def _released_blocks(log, client):
    """Every cluster block the client sent (its own sums: no control variates, so
    ``(delta + S_hat) * n``), and each round's sum of them."""
    out, down = [], None
    for direction, cid, method, msg in log:
        if cid != client or method != "estep":
            continue
        if direction == "down":
            down = msg
            continue
        if ERROR_KEY in msg:
            continue
        n = float(msg["n"])
        S = {k: (np.asarray(msg[f"delta/{k}"]) + np.asarray(down.get(f"S_hat/{k}", 0.0))) * n
             for k in ("XtX", "Xty", "n_events")}
        blocks = [(S["XtX"][k], S["Xty"][k], S["n_events"][k]) for k in range(len(S["Xty"]))]
        out += blocks
        out.append(tuple(sum(b[i] for b in blocks) for i in range(3)))
    return out


def _differencing_attack(blocks, X, y):
    """Events rebuilt from the difference of two released blocks that is one event."""
    Xt = np.column_stack([X, np.ones(len(X))])
    found = set()
    for (A, a, na), (B, b, nb) in combinations(blocks, 2):
        if abs(abs(na - nb) - 1.0) > 1e-6:
            continue
        sign = 1.0 if na > nb else -1.0
        x, yy = record_from_regression_block(sign * (A - B), sign * (a - b))
        hit = np.flatnonzero((np.abs(Xt - x).max(axis=1) < 1e-6) & (np.abs(y - yy) < 1e-6))
        found.update(hit.tolist())
    return found


def _fit(monkeypatch=None):
    fd, (X, y) = _data()
    rt = fl.InProcessRuntime(fd, record=True)
    fed = fl.Federation(control_variates=False, disclosure=POLICY)
    with warnings.catch_warnings():  # 12 sweeps: short chains, by design
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        warnings.simplefilter("ignore", RuntimeWarning)
        # the paper's model: its blocks are raw sums (the default random intercept scales
        # each entity's by the round's 1 / (1 + n_e rho), which this linear attack does not undo)
        fl.HLCR(n_clusters=3, random_state=1, max_rounds=12, federation=fed, sigma=1.0,
                delta=1.0, standardize=False, random_intercept=False).fit(fd, runtime=rt)
    return _differencing_attack(_released_blocks(rt.log, "a"), X, y), rt


def test_differencing_recovers_events_without_the_rule(monkeypatch):
    monkeypatch.setattr("fedlatent.engine.node.client.suppress_differences",
                        lambda policy, stats, names, members, state: (stats, []),
                        raising=False)  # (on the base commit there is nothing to disable)
    found, _ = _fit()
    assert len(found) >= 1  # the positive control: one-event entities, x and y exactly


def test_differencing_recovers_no_event_under_the_rule():
    found, rt = _fit()
    assert found == set()
    from fedlatent.engine.privacy.enforce import BASIS_KEY

    assert BASIS_KEY in rt.nodes["a"].state  # agent 'a' has entities under the threshold
    assert BASIS_KEY not in rt.nodes["b"].state  # no entity under it: nothing kept


def test_the_span_check_finds_one_and_two_entity_sums():
    from fedlatent.engine.privacy.enforce import _discloses

    records = np.array([1.0, 1.0, 6.0, 6.0])
    total = np.ones((4, 1)) / 2.0
    assert not _discloses(total, records, 3)
    with_pair_out = np.linalg.qr(np.column_stack([np.ones(4), [0, 0, 1, 1]]))[0]
    assert _discloses(with_pair_out, records, 3)  # 1 - (0,0,1,1): the two one-event entities
    with_one_out = np.linalg.qr(np.column_stack([np.ones(4), [0, 1, 1, 1]]))[0]
    assert _discloses(with_one_out, records, 3)  # e_0
    big_out = np.linalg.qr(np.column_stack([np.ones(4), [1, 1, 1, 0]]))[0]
    assert not _discloses(big_out, records, 3)  # e_3: six events, a block may hold them


def test_a_block_repeating_a_released_set_is_sent():
    from fedlatent.engine.privacy.enforce import suppress_differences

    state = {}
    M = np.array([[True, True, True, False], [False, False, False, True]])
    stats = Stats({"n_events": np.array([8.0, 6.0])})
    members = (M, np.array([1.0, 1.0, 6.0, 6.0]))
    out, small = suppress_differences(POLICY, stats, ("n_events",), members, state)
    assert small == [] and np.array_equal(out["n_events"], [8.0, 6.0])
    M2 = np.array([[True, False, True, False], [False, True, False, True]])
    out, small = suppress_differences(POLICY, stats, ("n_events",), (M2, members[1]), state)
    assert small == [0, 1]  # each differs from a released set by one one-event entity
    assert np.array_equal(out["n_events"], [0.0, 0.0])
    out, small = suppress_differences(POLICY, stats, ("n_events",), members, state)
    assert small == []  # the released sets again: nothing new
