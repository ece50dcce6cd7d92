"""Issue 23 item 4: FedGMM's Gaussian start (the input mixture's moments and hard-assignment
sums) is answered by in-process clients at once, as the GMM's is, with the start the clients
called one by one give (to 1e-10)."""

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.engine.transport.inprocess import InProcessRuntime
from tolerance import assert_close


def _clients(n_clients=30, d=3, seed=0):
    """Clients of unequal sizes, inputs from three blobs, labels from the blob."""
    rng = np.random.default_rng(seed)
    data = {}
    for i in range(n_clients):
        n = int(rng.integers(6, 16))
        z = rng.integers(0, 3, n)
        data[f"c{i:02d}"] = (rng.normal(size=(n, d)) + 4.0 * z[:, None],
                             (z + (rng.random(n) < 0.1)) % 2)
    return fl.FederatedDataset.from_arrays(data)


# small clients (6 to 15 rows): the saturation rule would refuse them
@pytest.mark.usefixtures("saturation_rule_off")
def test_fedgmm_batched_start_equals_one_by_one():
    fd = _clients()
    starts, calls = {}, {}
    for batched in (False, True):
        rt = InProcessRuntime(fd, batched=batched)
        est = fl.FedGMM(n_input_components=3, n_learners=2, random_state=1)
        starts[batched], calls[batched] = est.initial_parameters(fd, runtime=rt), \
            rt.batched_calls
    assert calls[False] == 0
    assert calls[True] == 4  # moments, the candidates' sums and two Lloyd steps
    for k, v in starts[False].items():
        if isinstance(v, np.ndarray) or np.isscalar(v):
            assert_close(np.asarray(starts[True][k]), np.asarray(v), rtol=1e-10, err_msg=k)
