"""Every secure-aggregation message crosses Flower's records (ArrayRecord / ConfigRecord) as it
is: uint64 masked vectors, uint8 keys, ciphertexts and shares, JSON id lists."""

import numpy as np
import pytest

pytest.importorskip("flwr")

from fedlatent.engine.secagg import FixedPoint, SecAggConfig, Wire, run_exchange, setup  # noqa: E402
from fedlatent.runtime.flower_records import decode, encode  # noqa: E402

pytestmark = pytest.mark.flower


def test_a_secure_exchange_with_a_dropout_through_flower_records():
    ids = [f"site-{i}" for i in range(5)]
    scale = 2.0**20
    cfg = SecAggConfig(threshold=3, encoding=FixedPoint(scale=scale, bound=1e3))
    wire = Wire(record=True, transport=lambda m: decode(encode(m)))
    server, clients = setup(ids, cfg, wire=wire)
    rng = np.random.default_rng(0)
    stats = {u: {"n": rng.uniform(0, 9, 2), "sxx": rng.normal(size=(2, 3, 3))} for u in ids}
    got = run_exchange(server, clients, stats, 1, "stats", ids, drop=["site-2"], wire=wire)
    alive = [u for u in ids if u != "site-2"]
    for k in ("n", "sxx"):
        assert np.max(np.abs(got[k] - sum(stats[u][k] for u in alive))) <= 4 / (2 * scale)
    kinds = {step: {type(v).__name__ + ":" + str(getattr(v, "dtype", "")) for v in m.values()}
             for step, _, _, m in wire.log}
    assert kinds["masked"] == {"ndarray:uint64"}
    assert kinds["shares"] == {"ndarray:uint8"} and kinds["reveal"] == {"ndarray:uint8"}
    assert kinds["roster"] == {"ndarray:uint8", "str:"}
    assert kinds["announce"] == {"str:"}
