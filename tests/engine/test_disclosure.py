"""DisclosurePolicy: defaults anchored on DataSHIELD's, every rule and its refusal text, the
switch-off, and the move of the count rules to the aggregate under secure aggregation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedlatent.engine.privacy import (
    DisclosurePolicy,
    check_aggregate,
    check_counts,
    check_learner,
    check_levels,
    check_saturation,
    check_tree_leaves,
    effective,
)


def test_defaults_are_datashields():
    p = DisclosurePolicy()
    # dsBase default.nfilter.tab = 3, nfilter.subset = 3, nfilter.glm = 0.33,
    # nfilter.levels.density = 0.33
    assert (p.min_records, p.min_records_per_block, p.tree_min_leaf) == (3, 3, 3)
    assert (p.max_parameters_per_record, p.max_levels_density) == (0.33, 0.33)
    assert p.allow_row_storing_learners is False and p.count_scope == "client"
    assert not p.is_off and DisclosurePolicy.off().is_off


@pytest.mark.parametrize("rule, on", [("min_records", 1), ("min_records_per_block", 2),
                                      ("max_parameters_per_record", 1e9), ("tree_min_leaf", 2),
                                      ("max_levels_density", 0.9),
                                      ("allow_row_storing_learners", False)])
def test_the_policy_is_off_only_when_every_rule_is_and_whatever_its_scope(rule, on):
    from dataclasses import replace

    off = DisclosurePolicy.off()
    assert replace(off, count_scope="aggregate").is_off
    assert not replace(off, **{rule: on}).is_off
    assert not replace(off, count_scope="aggregate", **{rule: on}).is_off


# ---- counts -------------------------------------------------------------------------------
def test_a_reply_over_too_few_records_is_refused_naming_client_and_rule():
    msg = check_counts(DisclosurePolicy(), "site-7", 2, "round statistics")
    assert msg == (
        "client 'site-7': round statistics is a sum over fewer than min_records=3 records "
        "(DataSHIELD nfilter.tab); it is not sent. Merge small clients or lower "
        "DisclosurePolicy(min_records=...); DisclosurePolicy.off() disables every rule")


@pytest.mark.parametrize("n, refused", [(0, False), (1, True), (2, True), (2.999, True),
                                        (3, False), (1000, False)])
def test_count_threshold_boundaries(n, refused):
    assert (check_counts(DisclosurePolicy(), "c", n, "sums") is not None) is refused


def test_per_block_rule_reports_the_smallest_non_empty_block():
    counts = np.array([[5.0, 0.0], [1.0, 2.5]])  # an agent's entities per cluster
    msg = check_counts(DisclosurePolicy(), "agent-3", counts, "cluster blocks", per_block=True)
    assert msg.startswith("client 'agent-3': a block of cluster blocks is a sum over fewer "
                          "than min_records_per_block=3 records ")  # no count: issue 39
    assert "lower DisclosurePolicy(min_records_per_block=...)" in msg
    assert check_counts(DisclosurePolicy(), "a", [0.0, 3.0, 7.0], "b", per_block=True) is None
    soft = check_counts(DisclosurePolicy(min_records_per_block=4), "a", [3.5, 9.0], "nk",
                        per_block=True)
    assert "is a sum over fewer than min_records_per_block=4 records" in soft


def test_off_refuses_nothing():
    off = DisclosurePolicy.off()
    assert check_counts(off, "c", 1, "sums") is None
    assert check_counts(off, "c", [1.0, 2.0], "blocks", per_block=True) is None
    assert check_saturation(off, "c", 50, 1, "regression block") is None
    assert check_tree_leaves(off, "c", [1, 1], "tree") is None
    assert check_learner(off, "c", "KNeighborsRegressor", stores_rows=True) is None
    assert check_levels(off, "c", 10, 10, "labels") is None


# ---- secure aggregation moves the count rules to the aggregate -------------------------------
def test_secure_aggregation_checks_the_round_aggregate_instead_of_each_client():
    base = DisclosurePolicy()
    assert effective(base, secure_aggregation=False) == base
    sa = effective(base, secure_aggregation=True)
    assert sa.count_scope == "aggregate" and sa.min_records == 3
    assert check_counts(sa, "small", 1, "round statistics") is None  # one client: not seen
    assert check_aggregate(sa, 1 + 1, "round statistics", ["a", "b"]) == (
        "the aggregate of this round's participants ('a', 'b'): round statistics is a sum over "
        "fewer than min_records=3 records (DataSHIELD nfilter.tab); it is not sent. Merge "
        "small clients or lower DisclosurePolicy(min_records=...); DisclosurePolicy.off() "
        "disables every rule")
    assert check_aggregate(sa, 1 + 2, "round statistics", ["a", "b"]) is None
    assert "a block of cluster blocks" in check_aggregate(sa, [4.0, 2.0], "cluster blocks",
                                                          ["a"], per_block=True)
    # without secure aggregation the aggregate is not the rule (each client was checked)
    assert check_aggregate(base, 1, "round statistics", ["a"]) is None
    assert effective(sa, secure_aggregation=False).count_scope == "client"


# ---- regression saturation (nfilter.glm) ----------------------------------------------------
def test_saturated_regression_block_is_refused():
    p = DisclosurePolicy()
    assert check_saturation(p, "c", 3, 10, "regression block") is None  # 3 <= 3.3
    assert check_saturation(p, "c", 4, 0, "regression block") is None  # empty: nothing to show
    msg = check_saturation(p, "h1", 4, 10, "cluster 2's regression block")
    assert msg == (
        "client 'h1': cluster 2's regression block has 4 coefficient(s) over 10 record(s), more "
        "than max_parameters_per_record=0.33 per record (DataSHIELD nfilter.glm); it is not sent. "
        "Use fewer features or more records, or raise "
        "DisclosurePolicy(max_parameters_per_record=...); DisclosurePolicy.off() disables every "
        "rule")


# ---- SEC: trees and row-storing learners ----------------------------------------------------
def test_tree_leaves_smaller_than_the_minimum_are_refused():
    p = DisclosurePolicy()
    assert check_tree_leaves(p, "c", [3, 8, 12], "random forest") is None
    assert check_tree_leaves(p, "c", [], "constant model") is None
    msg = check_tree_leaves(p, "s2", np.array([5, 1, 9]), "random forest")
    assert msg.startswith("client 's2': random forest has a leaf with fewer than "
                          "tree_min_leaf=3 training records (DataSHIELD nfilter.tab)")
    assert "Fit it with min_samples_leaf=3" in msg


def test_row_storing_learners_are_refused_unless_allowed():
    p = DisclosurePolicy()
    assert check_learner(p, "c", "RandomForestRegressor", stores_rows=False) is None
    assert check_learner(p, "s1", "KNeighborsRegressor", stores_rows=True) == (
        "client 's1': learner 'KNeighborsRegressor' stores training rows in its fitted model, so "
        "sending it sends the rows; it is not sent. Choose another candidate, or set "
        "DisclosurePolicy(allow_row_storing_learners=True) if the rows may be shared")
    assert check_learner(DisclosurePolicy(allow_row_storing_learners=True), "s1", "SVR",
                         stores_rows=True) is None


def test_dense_level_lists_are_refused():
    p = DisclosurePolicy()
    assert check_levels(p, "c", 3, 10, "class labels") is None
    msg = check_levels(p, "c9", 4, 10, "class labels")
    assert msg.startswith("client 'c9': class labels has 4 distinct level(s) over 10 record(s), "
                          "denser than max_levels_density=0.33 (DataSHIELD "
                          "nfilter.levels.density)")


# ---- validation ------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, message", [
    (dict(min_records=-1), r"min_records must be an integer >= 0, got -1"),
    (dict(min_records=2.5), r"min_records must be an integer >= 0, got 2.5"),
    (dict(min_records_per_block=True), r"min_records_per_block must be an integer >= 0"),
    (dict(tree_min_leaf=0), r"tree_min_leaf must be an integer >= 1, got 0"),
    (dict(max_parameters_per_record=0), r"max_parameters_per_record must be a number > 0 "
                                        r"\(math.inf disables it\), got 0"),
    (dict(max_levels_density=math.nan), r"max_levels_density must be a number > 0"),
    (dict(allow_row_storing_learners="no"), r"allow_row_storing_learners must be True or False"),
    (dict(count_scope="round"), r"count_scope must be one of \('client', 'aggregate'\)"),
])
def test_policy_values_are_checked(kwargs, message):
    with pytest.raises(ValueError, match=r"DisclosurePolicy: " + message):
        DisclosurePolicy(**kwargs)


def test_policy_is_frozen():
    with pytest.raises(AttributeError):
        DisclosurePolicy().min_records = 1


def test_numpy_scalars_become_plain_numbers():
    p = DisclosurePolicy(min_records=np.int64(5), max_parameters_per_record=np.float32(0.5))
    assert type(p.min_records) is int and p.min_records == 5
    assert type(p.max_parameters_per_record) is float and p.max_parameters_per_record == 0.5
