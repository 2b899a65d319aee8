"""Size-distribution and burstiness queries (metrics.sizing_queries) and their parsers."""

from __future__ import annotations

import json
import math
import shutil
import subprocess

import pytest

from disagg import metrics as m
from disagg.sizes import SizeDistribution

POOLS = ("prefill", "decode")


def bucket(le: str, v: float) -> dict:
    return {"metric": {"le": le}, "value": [0, str(v)]}


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_sizing_queries_use_the_engine_histograms_and_new_names(engine) -> None:
    qs = {
        q.name: q for q in m.sizing_queries(engine, "ns", "llm", POOLS, 120, 30, horizon_s=3600, scrape_s=15)
    }
    p = m.preset(engine)
    assert f"{p.prompt_tokens}_bucket" in qs["prompt_tokens_histogram"].promql
    assert f"{p.output_tokens}_bucket" in qs["output_tokens_histogram"].promql
    assert qs["arrival_counts"].promql.endswith("[120s:30s]")
    assert qs["arrival_counts_horizon"].promql.endswith("[3600s:30s]")
    assert all(not q.required for q in qs.values())  # optional: missing means "mean/Poisson"
    old = {q.name for q in m.build_queries(engine, "ns", "llm", POOLS, 120, 0.9)}
    assert not old & set(qs)  # new names only


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_sizing_queries_are_valid_promql(tmp_path) -> None:
    qs = m.sizing_queries("vllm", "ns", "llm", POOLS, 120, 30, horizon_s=3600, scrape_s=15)
    rules = {
        "groups": [{"name": "g", "rules": [{"record": f"r{i}", "expr": q.promql} for i, q in enumerate(qs)]}]
    }
    path = tmp_path / "rules.yml"
    path.write_text(json.dumps(rules))  # JSON is YAML
    out = subprocess.run(
        ["promtool", "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_histogram_to_size_distribution() -> None:
    prompt = [bucket("100", 1.0), bucket("1000", 4.0), bucket("+Inf", 5.0)]
    output = [bucket("50", 2.0), bucket("+Inf", 2.0)]
    d = m.size_distribution(prompt, output, prompt_sum=1 * 50 + 3 * 550 + 1 * 4000)
    assert isinstance(d, SizeDistribution)
    assert d.prompt_mean_std[0] == pytest.approx((50 + 1650 + 4000) / 5)
    assert d.prompt_tokens[-1] == pytest.approx(4000)


@pytest.mark.parametrize(
    ("result", "kind"),
    [
        ([], "missing"),
        ([bucket("10", 0.0), bucket("+Inf", 0.0)], "missing"),  # no observation: not a zero distribution
        ([bucket("10", 3.0), bucket("+Inf", 2.0)], "invalid"),
        ([bucket("10", 1.0), bucket("10", 1.0)], "multiple"),
        ([bucket("x", 1.0)], "invalid"),
        ([{"metric": {}, "value": [0, "1"]}], "invalid"),
        ([bucket("10", math.nan)], "nan"),
    ],
)
def test_bad_histograms_are_missing_not_zero(result, kind) -> None:
    with pytest.raises(m.MetricError) as err:
        m.parse_histogram(result, "prompt_tokens_histogram")
    assert err.value.kind == kind


def test_series_parsing() -> None:
    ok = [{"metric": {}, "values": [[0, "3"], [30, "5.5"], [60, "0"]]}]
    assert m.parse_series_points(ok, "arrival_counts") == [(0.0, 3.0), (30.0, 5.5), (60.0, 0.0)]
    for bad, kind in (
        ([], "missing"),
        ([ok[0], ok[0]], "multiple"),
        ([{"metric": {}, "values": [[0, "-1"]]}], "negative"),
        ([{"metric": {}, "values": [[0, "NaN"]]}], "nan"),
        ([{"metric": {}}], "missing"),
        ([{"metric": {}, "values": [["later", "1"]]}], "invalid"),
    ):
        with pytest.raises(m.MetricError) as err:
            m.parse_series_points(bad, "arrival_counts")
        assert err.value.kind == kind
