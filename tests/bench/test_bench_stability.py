"""The bench's spread verdicts and its per-thread CPU clock (pure and in-process; no timing asserted)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from searchr1.bench.report import Figure, Measure, render_table
from searchr1.bench.samplers import CountingSampler, InMemorySampler
from searchr1.bench.thread_cpu import ThreadCpuMeter, available, loop_thread_id, thread_seconds

samples = st.lists(st.floats(min_value=0.0, max_value=100.0, allow_nan=False), min_size=1, max_size=12)
targets = st.floats(min_value=0.0, max_value=100.0, allow_nan=False)


@given(values=samples, target=targets, comparator=st.sampled_from(["<=", ">="]))
def test_a_measure_is_met_only_when_every_repetition_meets_its_target_and_straddles_when_they_disagree(
        values, target, comparator):
    """Invariant: the verdict is "met" when every repetition meets the target, "missed" when
    none does, "straddles" otherwise; and the spread runs from the lowest to the highest."""
    assume(all(v == target or abs(v - target) > 1e-9 for v in values))  # rounding is the test below
    measure = Measure.of_samples("m", "m", values, target, comparator)
    hits = [v <= target if comparator == "<=" else v >= target for v in values]
    expected = "met" if all(hits) else "missed" if not any(hits) else "straddles"
    assert measure.verdict == expected
    assert measure.met is (expected == "met")
    assert (measure.low if measure.low is not None else measure.value) == min(values)
    assert (measure.high if measure.high is not None else measure.value) == max(values)


def test_a_value_off_its_target_only_by_float_rounding_meets_it():
    rounded = 0.1 + 0.2  # 0.30000000000000004
    assert rounded > 0.3 and Measure("m", "m", rounded, 0.3, "<=").verdict == "met"
    assert Measure("m", "m", 0.3, rounded, ">=").verdict == "met"
    assert Measure("m", "m", 0.3001, 0.3, "<=").verdict == "missed"


def test_the_value_of_a_measure_from_samples_is_their_median_inside_the_spread():
    measure = Measure.of_samples("m", "m", [3.0, 1.0, 2.0, 10.0], 5.0, "<=")
    assert measure.value == 2.5 and (measure.low, measure.high, measure.samples) == (1.0, 10.0, 4)
    assert measure.verdict == "straddles" and measure.met is False
    assert measure.relative_spread == pytest.approx(9.0 / 2.5)
    with pytest.raises(ValueError):
        Measure("m", "m", 11.0, low=1.0, high=10.0)


def test_a_straddling_figure_says_so_in_the_table():
    from rich.console import Console

    figure = Figure(5, "f", "F", [Measure.of_samples("m", "m", [1.0, 2.0], 1.5, "<=")])
    console = Console(width=120, record=True)
    console.print(render_table([figure]))
    text = console.export_text()
    assert "straddles" in text and "1.00–2.00 (n=2)" in text and "yes" not in text


def test_a_measure_without_a_target_shows_a_dash_for_its_target_and_its_verdict():
    from rich.console import Console

    figure = Figure(5, "f", "F", [Measure("ratio", "with target", 0.5, 0.75, "<=", "x"),
                                  Measure("plain", "without target", 1.25, unit="s")])
    console = Console(width=120, record=True)
    console.print(render_table([figure]))
    row = next(line for line in console.export_text().splitlines() if "without target" in line)
    cells = [cell.strip() for cell in row.split("│")]
    assert cells[3:7] == ["1.25 s", "", "-", "-"]  # value, spread, target, met


def test_the_lab_port_way_of_a_step_swaps_our_replayed_rollout_for_the_lab_ports():
    from searchr1.bench.step_overhead import StepRecord

    record = StepRecord(local=1.0, rollout_main=0.3, rollout_client=0.2, replay_main=0.25, replay_client=0.0,
                        lab_port_main=0.75, lab_port_client=0.0)
    assert record.lab_port_way == pytest.approx(1.5) and record.in_memory == pytest.approx(0.75)


def test_per_thread_cpu_counts_a_busy_thread_and_not_a_sleeping_one():
    if not available():
        pytest.skip("no /proc per-thread CPU on this platform")
    ids: dict[str, int] = {}
    done = {"busy": threading.Event(), "sleepy": threading.Event()}
    release = threading.Event()

    def busy() -> None:
        ids["busy"] = threading.get_native_id()
        end = time.thread_time() + 0.05
        while time.thread_time() < end:
            pass
        done["busy"].set()
        release.wait()  # stays alive until its CPU has been read

    def sleepy() -> None:
        ids["sleepy"] = threading.get_native_id()
        time.sleep(0.1)
        done["sleepy"].set()
        release.wait()

    meter = ThreadCpuMeter({threading.main_thread().native_id: "main"})
    start = meter.snapshot()
    threads = [threading.Thread(target=busy), threading.Thread(target=sleepy)]
    for thread in threads:
        thread.start()
    end = time.thread_time() + 0.03  # the main thread, which the meter was told about, works too
    while time.thread_time() < end:
        pass
    for event in done.values():
        assert event.wait(30)
    seen = thread_seconds()
    interval = meter.interval(start, meter.snapshot())
    release.set()
    for thread in threads:
        thread.join()
    assert seen[ids["busy"]] >= 0.045
    assert seen[ids["sleepy"]] < 0.02
    assert interval.roles.get("other", 0.0) >= 0.045  # threads the meter was not told about
    assert interval.roles.get("main", 0.0) >= 0.025


def test_the_thread_of_another_event_loop_is_found():
    loop = asyncio.new_event_loop()
    native: dict[str, int] = {}

    def run() -> None:
        native["id"] = threading.get_native_id()
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    while not loop.is_running():
        time.sleep(0.001)
    try:
        assert loop_thread_id(loop) == native["id"]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
    assert loop_thread_id(object()) is None


def test_the_in_memory_sampler_replays_exactly_what_the_counting_sampler_recorded():
    from types import SimpleNamespace

    import pytrio as trio

    class Wire:
        async def sample_async(self, prompt, num_samples, sampling_params, **kwargs):
            tokens = prompt.to_ints()
            return SimpleNamespace(sequences=[
                SimpleNamespace(tokens=tokens[-2:] + [k], logprobs=[-0.5, -1.0, -0.25], text=f"t{k}", stop_reason="stop")
                for k in range(num_samples)])

    answers: dict = {}
    wire = CountingSampler(Wire(), answers)
    prompt = trio.ModelInput.from_ints([5, 6, 7])
    params = trio.SamplingParams(max_tokens=4, seed=11)
    recorded = asyncio.run(wire.sample_async(prompt, num_samples=2, sampling_params=params))
    replay = InMemorySampler(answers)
    replayed = asyncio.run(replay.sample_async(trio.ModelInput.from_ints([5, 6, 7]), num_samples=2,
                                               sampling_params=trio.SamplingParams(max_tokens=4, seed=11)))
    assert [(s.tokens, s.logprobs, s.text, s.stop_reason) for s in replayed.sequences] == \
        [(s.tokens, s.logprobs, s.text, s.stop_reason) for s in recorded.sequences]
    assert wire.requests == replay.requests == 1
    with pytest.raises(LookupError, match="seed 12"):
        asyncio.run(replay.sample_async(prompt, num_samples=2, sampling_params=trio.SamplingParams(max_tokens=4, seed=12)))


def test_a_spread_wider_than_its_documented_bound_is_flagged():
    narrow = Measure.of_samples("m", "m", [1.0, 1.05, 1.1], 2.0, "<=", spread_bound=0.15)
    wide = Measure.of_samples("m", "m", [1.0, 1.5, 2.0], 3.0, "<=", spread_bound=0.15)
    assert narrow.spread_within_bound is True and "!" not in narrow.spread_text()
    assert wide.spread_within_bound is False and wide.spread_text().endswith("!")
    assert Measure("m", "m", 1.0, spread_bound=0.15).spread_within_bound is None  # measured once
