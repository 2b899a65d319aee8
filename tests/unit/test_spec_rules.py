"""Specs that would pass admission and then fail later are refused, or warned about."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from disagg import api, builders

DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")


def spec_of(placement: str = "disaggregated", **autoscaling) -> api.DisaggDeploymentSpec:
    tpl = {"spec": {"containers": [{"name": "vllm", "image": "x"}]}}
    pools = (
        {"colocated": {"maxReplicas": 2, "template": tpl}}
        if placement == "colocated"
        else {"prefill": {"maxReplicas": 2, "template": tpl}, "decode": {"maxReplicas": 4, "template": tpl}}
    )
    if placement != "colocated":  # the colocated plan sizes one pool only
        pools["encoder"] = {"maxReplicas": 2, "template": tpl}
    return api.parse_spec(
        {
            "engine": "vllm",
            "model": "m",
            "placement": {"mode": placement},
            "pools": pools,
            "autoscaling": autoscaling,
        }
    )


@pytest.mark.parametrize("placement", ["disaggregated", "colocated"])
def test_longest_allowed_name_gives_valid_children(placement):
    """The name limit comes from the builders' suffixes: every child of a max-length name is valid."""
    name = "a" * api.MAX_NAME_LENGTH
    assert api.name_error(name) is None
    owner = builders.Owner(name=name, namespace="ns", uid="u")
    objs = builders.all_objects(owner, spec_of(placement))
    assert objs
    longest = 0
    for obj in objs:
        child = obj["metadata"]["name"]
        assert DNS1035.fullmatch(child) and len(child) <= 63, child  # Service names are DNS-1035
        longest = max(longest, len(child))
        for value in obj["metadata"]["labels"].values():
            assert len(value) <= 63
    if placement == "colocated":
        assert longest == 63  # the limit is tight: one more character breaks the colocated pool


@pytest.mark.parametrize(
    "name",
    ["a" * (api.MAX_NAME_LENGTH + 1), "llama-3.1-8b", "8b", "Llama", "llama-", "llama_8b", ""],
)
def test_names_that_break_a_child_are_refused(name):
    assert api.name_error(name) == api.MSG_NAME


def test_name_rule_in_the_crd_matches_the_offline_check():
    rule = api.NAME_RULES[0]["rule"]
    assert f"size() <= {api.MAX_NAME_LENGTH}" in rule and api.DNS1035_LABEL_PATTERN in rule


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ({}, api.MSG_TEMPLATE_SPEC),
        ({"metadata": {}}, api.MSG_TEMPLATE_SPEC),
        ({"spec": {}}, api.MSG_TEMPLATE_CONTAINERS),
        ({"spec": {"containers": []}}, api.MSG_TEMPLATE_CONTAINERS),
        ({"spec": {"containers": [{"name": "vllm"}]}}, api.MSG_CONTAINER_IMAGE),
        ({"spec": {"containers": [{"name": "vllm", "image": " "}]}}, api.MSG_CONTAINER_IMAGE),
        ({"spec": {"containers": [{"image": "x"}]}}, api.MSG_CONTAINER_IMAGE),
    ],
)
def test_templates_that_create_no_pod_are_refused(template, message):
    raw = spec_of().to_dict()
    raw["pools"]["decode"]["template"] = template
    with pytest.raises(ValidationError, match=re.escape(message)):
        api.parse_spec(raw)


def test_gpus_agreeing_with_the_template_are_accepted():
    raw = spec_of().to_dict()
    raw["pools"]["decode"]["gpusPerReplica"] = 8
    raw["pools"]["decode"]["template"]["spec"]["containers"][0]["resources"] = {
        "limits": {"nvidia.com/gpu": "8"},
        "requests": {"nvidia.com/gpu": 8},
    }
    assert api.parse_spec(raw).pools.decode.gpus_per_replica == 8


@pytest.mark.parametrize(("scrape", "window", "ok"), [(15, 30, True), (15, 29, False), (30, 30, False)])
def test_a_window_needs_two_scrapes(scrape, window, ok):
    if ok:
        spec_of(scrapeIntervalSeconds=scrape, metricWindowSeconds=window)
    else:
        with pytest.raises(ValidationError, match="at least twice scrapeIntervalSeconds"):
            spec_of(scrapeIntervalSeconds=scrape, metricWindowSeconds=window)


@pytest.mark.parametrize(
    ("url", "ok"),
    [
        ("http://prometheus.monitoring:9090", True),
        ("https://prom.example.com/api/prefix", True),
        ("http://127.0.0.1:9090/", True),
        ("prometheus.monitoring:9090", False),
        ("ftp://prom:21", False),
        ("http://", False),
        ("http://prom:9090/?query=up", False),
        ("http://prom 9090", False),
    ],
)
def test_prometheus_url_must_be_http(url, ok):
    if ok:
        spec_of(prometheus={"url": url})
    else:
        with pytest.raises(ValidationError, match="must be an http:// or https:// URL"):
            spec_of(prometheus={"url": url})


def fields(spec: api.DisaggDeploymentSpec) -> set[str]:
    return {f for f, _ in api.spec_warnings(spec)}


def test_defaults_warn_about_nothing():
    assert api.spec_warnings(spec_of()) == []


@pytest.mark.parametrize(
    ("over", "field"),
    [
        (
            {"autoscaling": {"scrapeIntervalSeconds": 15, "metricWindowSeconds": 45}},
            "spec.autoscaling.metricWindowSeconds",
        ),
        (
            {"autoscaling": {"scrapeIntervalSeconds": 30, "intervalSeconds": 10, "metricWindowSeconds": 120}},
            "spec.autoscaling.intervalSeconds",
        ),
        (
            {"autoscaling": {"intervalSeconds": 60, "scaleDownStabilizationSeconds": 30}},
            "spec.autoscaling.scaleDownStabilizationSeconds",
        ),
        ({"slo": {"ttftSeconds": 600}}, "spec.slo.ttftSeconds"),
        ({"slo": {"itlSeconds": 50}}, "spec.slo.itlSeconds"),
        (
            {"placement": {"mode": "disaggregated", "splitThresholdTokens": 512}},
            "spec.placement.splitThresholdTokens",
        ),
        (
            {
                "autoscaling": {
                    "prometheus": {"url": "http://p:9090", "bearerTokenSecretRef": {"name": "s", "key": "t"}}
                }
            },
            "spec.autoscaling.prometheus.url",
        ),
        ({"pools.decode": {"minReplicas": 4, "maxReplicas": 4}}, "spec.pools.decode.maxReplicas"),
    ],
)
def test_unusual_values_warn_naming_the_field(over, field):
    raw = spec_of().to_dict()
    for key, value in over.items():
        if key.startswith("pools."):
            raw["pools"][key.split(".")[1]].update(value)
        else:
            raw[key] = {**raw.get(key, {}), **value}
    assert fields(api.parse_spec(raw)) == {field}
