"""Issue 19, item 12: short errors. A message or a log line naming many clients names at most
10 (grouped by reason) and the count of the others; the exception keeps them all
(``err.clients``, ``err.faults``) and ``fedlatent fit`` writes them to
``OUT/refused_clients.csv``. Before: refusing 343 clients of 2 rows printed 115,631
characters; 20,000 one-row clients 6.7 MB of message plus 7.4 MB of log warnings (one per
client, from the in-process clients' own logs)."""

import csv
import logging
import warnings

import numpy as np
import pandas as pd
import pytest
from test_honest_data import RaisingHandler
from typer.testing import CliRunner

import fedlatent as fl
from federations import make_blobs_federation
from fedlatent.cli import app
from fedlatent.engine import FederatedFitError


def test_name_list_shows_ten_names_and_the_count():
    from fedlatent.data.validation import name_list

    names = [f"c{i}" for i in range(343)]
    assert name_list(names) == ", ".join(f"'c{i}'" for i in range(10)) + " and 333 more"
    assert name_list(["a", "b"]) == "'a', 'b'"
    assert name_list([]) == "(none)"
    assert name_list(names, limit=2) == "'c0', 'c1' and 341 more"


def test_fault_detail_groups_clients_by_reason_and_counts_the_rest():
    from fedlatent.engine.protocol.messages import fault_detail

    assert fault_detail({"a": "x", "b": "y", "c": "x"}) == ("client 'a': x (also client 'c'); "
                                                          "client 'b': y")
    faults = {f"c{i}": f"r{i % 3}" for i in range(25)}
    assert fault_detail(faults) == ("client 'c0': r0 (also clients 'c3', 'c6', 'c9'); client "
                                    "'c1': r1 (also clients 'c4', 'c7'); client 'c2': r2 (also "
                                    "clients 'c5', 'c8'); and 15 more client(s)")
    assert fault_detail({"a": "x"}) == "client 'a': x"


def _tiny_clients(n_clients, rows):
    rng = np.random.default_rng(0)
    return fl.FederatedDataset.from_arrays(
        {f"c{i:05d}": rng.normal(size=(rows, 2)) for i in range(n_clients)})


@pytest.mark.parametrize("n_clients, rows", [(343, 2), (3000, 1)])
def test_refusing_many_small_clients_is_one_short_message(n_clients, rows, caplog):
    fd = _tiny_clients(n_clients, rows)
    with caplog.at_level(logging.INFO, logger="fedlatent"):
        with pytest.raises(FederatedFitError, match=(
                r"setup: client 'c00000': refused by the disclosure policy: min_records=3 "
                r"\(it holds fewer records.* \(also clients 'c00001', .*'c00009'\); and "
                rf"{n_clients - 10} more client\(s\); nothing of this exchange was used")) as err:
            fl.FederatedGaussianMixture(2, random_state=0).fit(fd)
    assert len(str(err.value)) < 2000
    assert err.value.clients == fd.client_ids
    assert all("refused by the disclosure policy" in r for r in err.value.faults.values())
    logged = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert sum(map(len, logged)) < 2000  # was one warning per client


@pytest.mark.usefixtures("saturation_rule_off")
def test_a_round_naming_many_clients_logs_one_short_line(caplog):
    """30 of 40 clients fail in round 3: history keeps every one, the log line names 10."""
    fd = make_blobs_federation(n_clients=40)
    victims = fd.client_ids[:30]
    rt = RaisingHandler(fd, victims[0])
    for v in victims[1:]:
        rt.nodes[v].handle = RaisingHandler(fd.subset([v]), v).nodes[v].handle
    est = fl.FederatedGaussianMixture(3, max_rounds=3, tol=0.0, random_state=0)
    with caplog.at_level(logging.WARNING, logger="fedlatent"), warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        est.fit(fd, runtime=rt)
    assert est.history_[2].missing == victims
    assert est.history_[2].errors == {v: "RuntimeError: handler crashed" for v in victims}
    lines = [r.getMessage() for r in caplog.records if "did not answer" in r.getMessage()]
    assert len(lines) == 1 and len(lines[0]) < 600, lines
    assert lines[0].startswith("round 3: 30 client(s) [") and "and 20 more" in lines[0]


@pytest.mark.usefixtures("saturation_rule_off")
def test_an_initialization_round_refusing_many_clients_names_ten(caplog):
    fd = make_blobs_federation(n_clients=40)
    rt = RaisingHandler(fd, fd.client_ids[0], from_round=1)
    for v in fd.client_ids[1:25]:
        rt.nodes[v].handle = RaisingHandler(fd.subset([v]), v, from_round=1).nodes[v].handle
    with pytest.raises(FederatedFitError, match=r"clients \['c00', .* and 15 more\] did not "
                       r"answer the initialization round validly") as err:
        fl.FederatedGaussianMixture(3, random_state=0).fit(fd, runtime=rt)
    assert len(str(err.value)) < 1000
    assert err.value.clients == fd.client_ids[:25]


def test_fit_command_writes_every_refused_client_to_a_file(tmp_path):
    rng = np.random.default_rng(0)
    df = pd.DataFrame(rng.normal(size=(40, 2)), columns=["a", "b"])
    df["site"] = [f"s{i:02d}" for i in range(20) for _ in range(2)]  # 20 sites of 2 rows
    df.to_csv(tmp_path / "d.csv", index=False)
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["fit", "gmm", "--data", str(tmp_path / "d.csv"),
                                   "--client", "site", "-k", "2", "--out", str(out)])
    assert res.exit_code == 2
    err = res.stderr if hasattr(res, "stderr") else res.output
    # one line per reason naming its clients, ten of them then a count (issue 41); all of them
    # in the file
    lines = err.splitlines()
    assert len(lines) == 2 and f"{out / 'refused_clients.csv'}" in lines[0]
    assert lines[1].startswith("  clients 's00', 's01', 's02', 's03', 's04', 's05', 's06', "
                               "'s07', 's08', 's09' and 10 more: refused by the disclosure "
                               "policy: --min-records 3 (it holds fewer records")
    assert max(map(len, lines)) < 400
    with open(out / "refused_clients.csv", newline="") as fh:
        rows = list(csv.reader(fh))
    assert rows[0] == ["client", "reason"]
    assert [r[0] for r in rows[1:]] == [f"s{i:02d}" for i in range(20)]
    assert all("min_records=3" in r[1] for r in rows[1:])
    assert sorted(p.name for p in out.iterdir()) == ["refused_clients.csv"]
