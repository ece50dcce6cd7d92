"""Many clients' generators in one compiled pass (engine/fedem/pcg.py): NumPy's numbers."""

from __future__ import annotations

import numpy as np
import pytest

from fedlatent.engine.fedem.pcg import client_uniforms
from fedlatent.engine.fedem.seeds import client_key, client_rng
from tolerance import assert_same  # exact: the same integer generator, bit for bit

IDS = ["a000", "a001", "x", "", "client 7", "é"]
COUNTS = [0, 1, 5, 3, 17, 2]


@pytest.mark.parametrize("seed", [0, 1, 12345, 2**32 - 1, 2**32, 2**63 + 5, 2**100 + 3])
@pytest.mark.parametrize("round_", [0, 7, 2**32 + 3])
@pytest.mark.parametrize("purpose", [0, 3])
def test_client_uniforms_are_each_clients_generator_bit_for_bit(seed, round_, purpose):
    got = client_uniforms(seed, [client_key(c) for c in IDS], round_, purpose, COUNTS)
    want = np.concatenate([client_rng(seed, c, round_, purpose).random(m)
                           for c, m in zip(IDS, COUNTS)])
    assert_same(got, want)
    assert_same(client_uniforms(seed, IDS, round_, purpose, COUNTS), want)


def test_client_uniforms_refuse_what_no_client_key_is():
    with pytest.raises(ValueError, match="non-negative"):
        client_uniforms(-1, [1], 0, 0, [1])
    with pytest.raises(ValueError, match="32-bit"):
        client_uniforms(0, [2**32], 0, 0, [1])
