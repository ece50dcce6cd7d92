"""Floors announced, not discovered by refusal (issue 39, item 2): every node answers the
``settings`` exchange with its policy's floors (no data), the server adopts the strictest
disclosure floor, and an analyst lists the sites' settings before fitting."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

import fedlatent as fl
from fedlatent.cli import app
from fedlatent.engine.node.client import ClientNode
from fedlatent.engine.privacy.enforce import policy_to_json
from fedlatent.engine.protocol.settings import adopt_floors, settings_rows, site_settings
from fedlatent.engine.site import SitePolicy
from fedlatent.engine.transport.inprocess import InProcessRuntime


def _fd():
    rng = np.random.default_rng(0)
    return fl.FederatedDataset.from_arrays({f"c{i}": rng.normal(size=(30, 2)) for i in range(3)})


def test_a_node_announces_its_policys_floors_and_no_data():
    policy = SitePolicy(disclosure=fl.DisclosurePolicy(min_records=5), privacy_required=True,
                        max_epsilon=1.0, models=("gmm",), max_rounds=50)
    reply = ClientNode("c0", _fd()["c0"], policy=policy).handle("settings", {})
    got = json.loads(reply["settings"])
    assert set(reply) == {"settings"} and got["site"] == "c0" and not got["relaxed"]
    assert got["disclosure"]["min_records"] == 5 and got["privacy_required"] == "dp"
    assert (got["max_epsilon"], got["models"], got["max_rounds"]) == (1.0, ["gmm"], 50)
    bare = json.loads(ClientNode("c0", _fd()["c0"]).handle("settings", {})["settings"])
    assert bare["disclosure"] == json.loads(policy_to_json(fl.DisclosurePolicy()))
    assert bare["privacy_required"] == "" and bare["max_epsilon"] is None
    held = ClientNode("c0", _fd()["c0"], policy=SitePolicy.for_simulation())
    assert json.loads(held.handle("settings", {})["settings"]) == {"relaxed": True}


def test_the_server_adopts_the_strictest_floor_and_keeps_its_count_scope():
    fd = _fd()
    rt = InProcessRuntime(fd, policies={
        "c0": SitePolicy(disclosure=fl.DisclosurePolicy(min_records=5)),
        "c1": SitePolicy(disclosure=fl.DisclosurePolicy(min_records_per_block=4,
                                                        max_parameters_per_record=0.2))})
    settings = site_settings(rt)
    assert settings["c2"] == {"relaxed": True}  # a site the runtime holds without a policy
    sent = fl.DisclosurePolicy(count_scope="aggregate")
    policy, record = adopt_floors(sent, settings)
    assert (policy.min_records, policy.min_records_per_block,
            policy.max_parameters_per_record) == (5, 4, 0.2)
    assert policy.count_scope == "aggregate"
    assert record["raised"] == {"min_records": ["c0"], "min_records_per_block": ["c1"],
                                "max_parameters_per_record": ["c1"]}
    assert adopt_floors(fl.DisclosurePolicy(min_records=9, min_records_per_block=9,
                                            max_parameters_per_record=0.1),
                        settings)[1] == {}  # already stricter: nothing adopted
    rows = settings_rows(settings)
    assert ("c0", "disclosure.min_records", "5") in rows
    assert ("c2", "(relaxed)", "held by the runtime: no floors of its own") in rows


def test_a_runtime_without_policies_is_not_asked():
    rt = InProcessRuntime(_fd(), record=True)
    assert site_settings(rt) == {c: {"relaxed": True} for c in rt.client_ids}
    assert rt.log == []


def test_site_settings_lists_policy_files_and_the_floor_a_fit_adopts(tmp_path):
    a, b = tmp_path / "a.toml", tmp_path / "b.toml"
    a.write_text('[site]\nname = "a"\n[disclosure]\nmin_records = 5\n')
    b.write_text('[site]\nname = "b"\n[privacy]\nrequired = true\nmax-epsilon = 1.0\n')
    res = CliRunner().invoke(app, ["site", "settings", str(a), str(b)])
    assert res.exit_code == 0, res.output
    assert "a     disclosure.min_records" in res.output
    assert "b     privacy-required" in res.output
    assert "a fit adopts: min_records=5 (asked by a)" in res.output


@pytest.mark.parametrize("relaxed", [True, False])
def test_settings_are_asked_once_per_runtime(relaxed):
    rt = InProcessRuntime(_fd(), record=True,
                          policies=None if relaxed else SitePolicy())
    first = site_settings(rt)
    assert site_settings(rt) is first
    assert len([m for d, _, m, _ in rt.log if d == "down"]) == (0 if relaxed else 3)


def test_a_fit_adopts_the_floors_records_them_and_logs_who_asked(caplog):
    fd = _fd()
    rt = InProcessRuntime(fd, policies={"c1": SitePolicy(
        disclosure=fl.DisclosurePolicy(min_records=5, min_records_per_block=4))})
    est = fl.FederatedGaussianMixture(2, max_rounds=2, random_state=0)
    with caplog.at_level("INFO", logger="fedlatent"):
        est.fit(fd, runtime=rt)
    assert est.excluded_clients_ == {}  # not refused: its floors were adopted
    assert est.history_.adopted["raised"] == {"min_records": ["c1"],
                                              "min_records_per_block": ["c1"]}
    assert est.history_.to_frame().attrs["adopted"]["disclosure"]["min_records"] == 5
    assert any("the sites announced stricter disclosure floors: min_records by c1; "
               "min_records_per_block by c1" in r.getMessage() for r in caplog.records)
    plain = fl.FederatedGaussianMixture(2, max_rounds=2, random_state=0).fit(fd)
    assert plain.history_.adopted == {}  # sites the runtime holds announce nothing
