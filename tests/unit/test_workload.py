"""Workload generators and trace readers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from disagg.workload import (
    Request,
    Workload,
    burst,
    detect_format,
    load_trace,
    mix,
    poisson,
    random_bursts,
    spikes,
)

AZURE = "/work/shared/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv"
MOONCAKE = "/work/shared/traces/mooncake_fast25/conversation_trace.0-40min.jsonl"


def test_azure_trace_matches_readme_statistics():
    w = load_trace(AZURE)
    assert len(w) == 19366 and w.skipped == 0
    assert w.duration_s == pytest.approx(3501.7219370, abs=1e-6)  # 18:15:46.6805900 -> 19:14:08.4025270
    assert w.mean_rate == pytest.approx(5.530, abs=1e-3)
    assert w.prompt_tokens.mean() == pytest.approx(1154.7, abs=0.05)
    assert w[0] == Request(0.0, 374, 44)
    assert w.arrival_s[1] == pytest.approx(50.9951690 - 46.6805900, abs=1e-9)


def test_mooncake_trace_keeps_hash_ids_and_scales_time():
    w = load_trace(MOONCAKE)
    assert len(w) == 7851
    assert w.duration_s == pytest.approx(2397.0)
    assert w.hash_ids[1][:3] == (0, 14, 15)
    fast = load_trace(MOONCAKE, time_scale=0.5, limit=100)
    assert len(fast) == 100
    assert fast.arrival_s[-1] == pytest.approx(w.arrival_s[99] * 0.5)


def test_format_detection(tmp_path):
    assert detect_format(AZURE) == "azure"
    assert detect_format(MOONCAKE) == "mooncake"
    f = tmp_path / "trace.txt"
    f.write_text('{"timestamp": 0, "input_length": 5, "output_length": 2}\n')
    assert detect_format(str(f)) == "mooncake"
    g = tmp_path / "mystery.dat"
    g.write_text("a b c\n")
    with pytest.raises(ValueError, match=r"known formats: azure .*burstgpt .*mooncake"):
        load_trace(str(g))
    with pytest.raises(ValueError, match="unknown trace format 'parquet'"):
        load_trace(str(f), format="parquet")


def test_malformed_lines_report_line_numbers(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:47.12,oops,5\n"
        "2023-11-16 18:15:48,10\n"
        "2023-11-16 18:15:49.5,20,0\n"
        "2023-11-16 18:15:50.25,20,3\n"
    )
    with pytest.raises(ValueError, match=r"t\.csv:3: "):
        load_trace(str(f))
    w = load_trace(str(f), on_error="skip")
    # the row with 0 output tokens is a failed request, not a malformed line: counted apart
    assert len(w) == 2 and w.skipped == 2 and w.failed == 1
    assert w.arrival_s[1] == pytest.approx(50.25 - 46.68059)
    j = tmp_path / "t.jsonl"
    j.write_text('{"timestamp": 0, "input_length": 5, "output_length": 2}\n{"timestamp": 1000}\n')
    with pytest.raises(ValueError, match=r"t\.jsonl:2: "):
        load_trace(str(j))
    assert load_trace(str(j), on_error="skip").skipped == 1


def test_generators_are_seeded_and_shaped():
    a = poisson(5.0, 1000.0, seed=3)
    b = poisson(5.0, 1000.0, seed=3)
    assert np.array_equal(a.arrival_s, b.arrival_s)
    assert len(a) == pytest.approx(5000, rel=0.05)
    n = poisson(5.0, n=1000, seed=1)
    assert len(n) == 1000 and np.all(np.diff(n.arrival_s) >= 0)
    m = mix(10.0, 1000.0, long_fraction=0.25, short_tokens=500, long_tokens=6000, seed=2)
    assert (m.prompt_tokens == 6000).mean() == pytest.approx(0.25, abs=0.02)
    bw = burst(1.0, 10.0, 100.0, 10_000.0, duty=0.5, seed=4)
    phase = bw.arrival_s % 100.0
    assert (phase < 50).sum() / (phase >= 50).sum() == pytest.approx(10.0, rel=0.1)
    sp = spikes(1.0, 20.0, every_s=60.0, spike_s=6.0, duration_s=6000.0, seed=5)
    assert len(sp) == pytest.approx((54 * 1.0 + 6 * 20.0) * 100, rel=0.05)
    wm = poisson(2.0, 100.0, media_fraction=0.5, media_items=3, seed=1)
    assert set(np.unique(wm.media_items)) <= {0, 3}


def test_workload_validation():
    with pytest.raises(ValueError):
        Workload([0.0], [0], [1])
    with pytest.raises(ValueError):
        poisson(0.0, 10.0)
    w = Workload([2.0, 1.0], [10, 20], [1, 2])  # sorted on construction
    assert list(w.prompt_tokens) == [20, 10]
    assert list(Workload.from_requests(list(w))) == list(w)


def test_with_media_gives_a_seeded_share_of_requests_media_items():
    from disagg.workload import poisson, with_media

    w = poisson(5.0, 400.0, seed=0)
    m = with_media(w, 0.25, 3, seed=1)
    assert set(m.media_items.tolist()) == {0, 3}
    assert (m.media_items > 0).mean() == pytest.approx(0.25, abs=0.04)
    assert (m.arrival_s == w.arrival_s).all() and (m.prompt_tokens == w.prompt_tokens).all()
    assert (with_media(w, 0.25, 3, seed=1).media_items == m.media_items).all()  # seeded
    assert with_media(w, 0.0, 3).media_items.max() == 0
    with pytest.raises(ValueError, match="media_items"):
        with_media(w, 0.5, 0)


def test_azure_2024_timestamps_with_six_digit_fractions_and_a_zone(tmp_path):
    """The 2024 traces write '2024-05-10 00:00:00.009930+00:00' (and no fraction on whole seconds)."""
    f = tmp_path / "AzureLLMInferenceTrace_code_1week.csv"
    f.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2024-05-10 00:00:00.009930+00:00,2162,5\n"
        "2024-05-10 00:00:01+00:00,2399,6\n"
        "2024-05-10 00:00:02.5Z,76,15\n"
        # one hour east of UTC: 01:00:03.25 there is 00:00:03.25 UTC
        "2024-05-10 01:00:03.25+01:00,2376,1\n"
        "2024-05-10T00:00:04.000001-0000,7670,8\n"
    )
    w = load_trace(str(f))
    assert w.name == "azure:AzureLLMInferenceTrace_code_1week.csv" and w.skipped == 0
    assert w.arrival_s.tolist() == pytest.approx([0.0, 0.99007, 2.49007, 3.24007, 3.990071], abs=1e-9)
    assert w.prompt_tokens.tolist() == [2162, 2399, 76, 2376, 7670]
    for bad in ("2024-05-10 00:00:00.+00:00", "2024-05-10 00:00:00+25:00", "2024-05-10 00:00:00 UTC"):
        g = tmp_path / "bad.csv"
        g.write_text(f"TIMESTAMP,ContextTokens,GeneratedTokens\n{bad},5,5\n")
        with pytest.raises(ValueError, match=r"bad\.csv:2: cannot parse"):
            load_trace(str(g))


def test_burstgpt_csv_reads_seconds_and_counts_failed_requests(tmp_path):
    f = tmp_path / "BurstGPT_1.csv"
    f.write_text(
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5,ChatGPT,472,18,490,Conversation log\n"
        "45,ChatGPT,1087,0,1087,Conversation log\n"  # failed: no response
        "46.5,GPT-4,417,276,693,API log\n"
        '47,"GPT-4, 0613",30,7,37,API log\n'
    )
    assert detect_format(str(f)) == "burstgpt"
    w = load_trace(str(f))
    assert w.name == "burstgpt:BurstGPT_1.csv"
    assert w.arrival_s.tolist() == [0.0, 41.5, 42.0]
    assert w.prompt_tokens.tolist() == [472, 417, 30] and w.output_tokens.tolist() == [18, 276, 7]
    assert w.failed == 1 and w.skipped == 0
    assert w.summary()["failed_requests"] == 1
    g = tmp_path / "renamed.txt"  # detected by its header, whatever the file is called
    g.write_text(f.read_text())
    assert len(load_trace(str(g))) == 3
    h = tmp_path / "other.csv"
    h.write_text("time,prompt,output\n1,2,3\n")
    with pytest.raises(ValueError, match=r"cannot detect the trace format .*Request tokens"):
        load_trace(str(h))
    with pytest.raises(ValueError, match="a burstgpt trace needs the columns Timestamp, Request tokens"):
        load_trace(str(h), format="burstgpt")


def test_a_time_window_of_a_long_trace():
    full = load_trace(AZURE)
    at = full.arrival_s
    w = load_trace(AZURE, start_s=600.0, duration_s=300.0)
    inside = (at >= 600.0) & (at < 900.0)
    assert len(w) == int(inside.sum()) > 1000
    assert w.arrival_s[0] == 0.0
    assert w.arrival_s == pytest.approx(at[inside] - at[inside][0], abs=1e-9)
    assert w.prompt_tokens.tolist() == full.prompt_tokens[inside].tolist()
    # the limit counts rows of the window; the time scale applies after the window
    assert len(load_trace(AZURE, start_s=600.0, duration_s=300.0, limit=10)) == 10
    fast = load_trace(AZURE, start_s=600.0, duration_s=300.0, time_scale=0.5)
    assert fast.arrival_s[-1] == pytest.approx(w.arrival_s[-1] * 0.5)
    mooncake = load_trace(MOONCAKE, start_s=2100.0)
    assert mooncake.duration_s <= 300.0 and len(mooncake) > 500
    assert len(load_trace(AZURE, start_s=4000.0)) == 0
    for bad in ({"start_s": -1.0}, {"duration_s": 0.0}, {"start_s": math.nan}):
        with pytest.raises(ValueError, match=r"start_s|duration_s"):
            load_trace(AZURE, **bad)


def test_busiest_rate_is_the_most_requests_in_any_window() -> None:
    # 3 requests in the first second, then one every 10 s: the busiest 2 s hold the first three
    w = Workload([0.0, 0.4, 0.9, 10.0, 20.0, 30.0], [5] * 6, [5] * 6)
    assert w.busiest_rate(2.0) == pytest.approx(1.5)
    assert w.busiest_rate(0.5) == pytest.approx(2 / 0.5)  # 0.0 and 0.4 (a window [t, t + 0.5) leaves 0.9 out)
    assert w.busiest_rate(100.0) == pytest.approx(6 / 100.0)
    assert Workload([], [], []).busiest_rate(60.0) == 0.0
    with pytest.raises(ValueError, match="window_s"):
        w.busiest_rate(0.0)


def _levels(w: Workload, step_s: float, split: float) -> np.ndarray:
    """Whether each step_s-long window of w is in the high state (count above `split` req/s)."""
    counts, _ = np.histogram(w.arrival_s, bins=np.arange(0.0, w.duration_s, step_s))
    return counts > split * step_s


def test_random_bursts_spend_the_expected_share_of_time_high_and_switch_at_random():
    w = random_bursts(1.0, 20.0, 120.0, 60.0, 40_000.0, seed=3)
    assert np.all(np.diff(w.arrival_s) >= 0) and w.arrival_s[0] >= 0 and w.arrival_s[-1] < 40_000.0
    # a third of the time at 20 req/s, two thirds at 1: 7.33 req/s on average
    assert w.mean_rate == pytest.approx((1.0 * 120.0 + 20.0 * 60.0) / 180.0, rel=0.1)
    high = _levels(w, 10.0, 10.5)
    assert high.mean() == pytest.approx(1 / 3, abs=0.05)
    # bursts begin at random: the gaps between their starts vary like sums of exponentials
    # (coefficient of variation ~0.75 here), where a square wave's do not vary at all
    starts = np.flatnonzero(high[1:] & ~high[:-1]) * 10.0
    gaps = np.diff(starts)
    assert gaps.size > 100
    assert gaps.std() / gaps.mean() > 0.5
    square = burst(1.0, 20.0, 180.0, 40_000.0, duty=1 / 3, seed=3)
    sq_high = _levels(square, 10.0, 10.5)
    sq_gaps = np.diff(np.flatnonzero(sq_high[1:] & ~sq_high[:-1]))
    assert sq_gaps.std() / sq_gaps.mean() < 0.1


def test_random_bursts_are_seeded_and_refuse_impossible_shapes():
    a = random_bursts(2.0, 10.0, 240.0, 90.0, 3600.0, seed=1)
    b = random_bursts(2.0, 10.0, 240.0, 90.0, 3600.0, seed=1)
    assert np.array_equal(a.arrival_s, b.arrival_s) and np.array_equal(a.prompt_tokens, b.prompt_tokens)
    assert not np.array_equal(a.arrival_s, random_bursts(2.0, 10.0, 240.0, 90.0, 3600.0, seed=2).arrival_s)
    for bad in (
        (-1.0, 10.0, 240.0, 90.0, 3600.0),
        (2.0, 10.0, 0.0, 90.0, 3600.0),
        (2.0, math.inf, 1.0, 1.0, 60.0),
    ):
        with pytest.raises(ValueError):
            random_bursts(*bad)
