"""Figure 5's scaling rows: the local CPU and the memory of one rollout as the batch grows.

For each size (questions x samples) a workload of that size is served by the offline twin (in a
process of its own, zero latency, as in figure 5) and rolled out whole with the real pytrio
client and an in-memory search backend. The local CPU is our main thread plus pytrio's
event-loop thread (:mod:`.thread_cpu`); the twin's process CPU (``/proc/<pid>/stat``, its ended
threads included) is reported, never counted. Per trajectory, the local CPU should stay flat as
the batch grows: a cost that grows with the batch (a scan over every request in flight, a
collection over every live trajectory) shows up as the last size's CPU per trajectory over the
first's. The first size, the ratio's reference, is rolled out three times (a sample per pair);
larger sizes average over more trajectories and are rolled out once.

Sizes: 64 (figure 5's step), 256 and 1,024 trajectories by default; with ``bench
--paper-sizes`` also 2,560 (the paper's step, 512 prompts x 5) and 4,096
(512 x 8), which take about two and a half minutes more on two cores; ``python -m
searchr1.bench.client_scaling`` measures those five sizes alone.

Memory is the growth of this process's resident set during the rollout: the peak is reset
before it (``/proc/self/clear_refs``) and read after it (``VmHWM``), less the resident set before.
Where the peak cannot be reset, the growth of the lifetime peak (``getrusage``) is read instead,
which can only understate it.

Every rollout starts on a collected, frozen heap with freed memory handed back to the system,
so that neither the garbage nor the allocator's leftovers of an earlier rollout are charged to
a later one. The first size is rolled out once unmeasured (tokenizer and template caches), and
each measured rollout's sampling client answers one question first (its connections); a twin's
start-up is never measured.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import gc
import resource
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from searchr1.bench.report import Measure
from searchr1.bench.samplers import CountingSampler
from searchr1.bench.served import BASE_MODEL, served_twin
from searchr1.bench.thread_cpu import CpuInterval, ThreadCpuMeter, client_thread_roles, process_seconds
from searchr1.bench.workload import Workload, WorkloadSpec, build_workload
from searchr1.core.rollout import rollout_batch_async
from searchr1.search.tool import with_search
from searchr1.core.types import SamplingClient, Trajectory
from searchr1.runtime.tokenizer import Qwen35Tokenizer
from searchr1.twin.scripted_search import ScriptedSearch

if TYPE_CHECKING:
    from pytrio import ServiceClient

# (questions, samples per question): 64 is figure 5's step, 2,560 the paper's (512 prompts x 5).
FULL_SIZES: tuple[tuple[int, int], ...] = ((8, 8), (32, 8), (128, 8), (512, 5), (512, 8))
DEFAULT_SIZES: tuple[tuple[int, int], ...] = FULL_SIZES[:3]
QUICK_SIZES: tuple[tuple[int, int], ...] = ((2, 8), (8, 8))
SMALLEST_REPEATS = 3  # rollouts of the first size, the ratio's reference (the others average over more)
GROWTH_TARGET = 1.25  # CPU per trajectory, the last size's / the first's
MIB = 1024 * 1024


@dataclass
class SizeRecord:
    """One measured rollout of one size."""

    questions: int
    group_size: int
    trajectories: int
    sampling_requests: int
    assistant_turns: int
    main_seconds: float
    client_seconds: float
    twin_seconds: float
    memory_mb: float
    wall_seconds: float
    memory_source: str = ""  # how memory_mb was read (ResidentGrowth.source)

    @property
    def local_seconds(self) -> float:
        return self.main_seconds + self.client_seconds

    @property
    def ms_per_trajectory(self) -> float:
        return 1000.0 * self.local_seconds / max(1, self.trajectories)


# ------------------------------------------------------------------------------- memory


def _status_kib(field: str) -> int | None:
    """A ``kB`` field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``), or None without /proc."""
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _lifetime_peak_kib() -> int:
    """The process's peak resident set so far (``ru_maxrss``: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak // 1024 if sys.platform == "darwin" else peak


def _reset_peak() -> bool:
    """Set ``VmHWM`` back to the current resident set; False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


class ResidentGrowth:
    """How far this process's resident set rose above where it stood at :meth:`start`."""

    def __init__(self) -> None:
        self.source = ""
        self.before = 0

    def start(self) -> None:
        resident = _status_kib("VmRSS")
        if resident is not None and _reset_peak():
            self.source, self.before = "VmHWM after clear_refs", resident
        else:
            self.source, self.before = "getrusage lifetime peak", _lifetime_peak_kib()

    def megabytes(self) -> float:
        peak = _status_kib("VmHWM") if self.source.startswith("VmHWM") else None
        peak = _lifetime_peak_kib() if peak is None else peak
        return max(0, peak - self.before) * 1024 / MIB


def _hand_back_freed_memory() -> None:
    """Return the allocator's free memory to the system (glibc's ``malloc_trim``), where there is one."""
    name = ctypes.util.find_library("c")
    if not name:
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(name).malloc_trim(0)


@contextlib.contextmanager
def settled_heap() -> Iterator[None]:
    """Collect the heap, hand freed memory back and freeze what is left (``gc.freeze``) for the
    block: what ran before is neither collected nor scanned on the block's time."""
    gc.collect()
    _hand_back_freed_memory()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


# ------------------------------------------------------------------------------- rollouts


def _rollout(sampler: SamplingClient, tokenizer: Qwen35Tokenizer, workload: Workload,
             questions: int | None = None) -> list[Trajectory]:
    """The workload's batch (or its first ``questions`` questions), rolled out on ``sampler``."""
    examples = workload.examples if questions is None else workload.examples[:questions]
    return asyncio.run(rollout_batch_async(sampler, tokenizer, with_search(ScriptedSearch(workload.results)),
                                           examples, workload.config))


def _measure(service: ServiceClient, tokenizer: Qwen35Tokenizer, workload: Workload,
             twin_pid: int | None) -> SizeRecord:
    """One rollout of the whole workload on ``service``, its CPU by thread and its memory. The
    twin's CPU is its process's (``twin_pid``) or, served in this process, our other threads'."""
    sampler = CountingSampler(service.create_sampling_client(base_model=BASE_MODEL))
    meter = ThreadCpuMeter(client_thread_roles(service))
    growth = ResidentGrowth()

    async def measured() -> tuple[list[Trajectory], CpuInterval, float, float]:
        search = ScriptedSearch(workload.results)
        with settled_heap():
            growth.start()
            twin = process_seconds(twin_pid) if twin_pid else 0.0
            start, wall = meter.snapshot(), time.perf_counter()
            trajectories = await rollout_batch_async(sampler, tokenizer, with_search(search), workload.examples,
                                                     workload.config)
            spent, wall = meter.interval(start, meter.snapshot()), time.perf_counter() - wall
            twin = process_seconds(twin_pid) - twin if twin_pid else spent.roles.get("other", 0.0)
            return trajectories, spent, twin, wall

    _rollout(sampler.inner, tokenizer, workload, questions=1)  # this client's connections
    trajectories, spent, twin, wall = asyncio.run(measured())
    spec = workload.spec
    return SizeRecord(
        questions=spec.questions, group_size=spec.group_size, trajectories=len(trajectories),
        sampling_requests=sampler.requests, assistant_turns=sum(len(t.turns) for t in trajectories),
        main_seconds=spent.roles.get("main", 0.0), client_seconds=spent.roles.get("client", 0.0),
        twin_seconds=twin, memory_mb=growth.megabytes(), wall_seconds=wall, memory_source=growth.source,
    )


def _rollouts_of_size(tokenizer: Qwen35Tokenizer, workload: Workload, *, repeats: int, warm_up: bool,
                      in_process: bool) -> list[SizeRecord]:
    """``repeats`` measured rollouts of ``workload`` on a twin of its own (its start-up is not
    measured), after one unmeasured rollout of the whole batch with ``warm_up``."""
    pids: list[int] = []
    with served_twin(workload.raw, in_process=in_process, tokenizer=tokenizer, on_process=pids.append,
                     sampling_concurrency=workload.config.sampling_concurrency) as service:
        if warm_up:
            _rollout(service.create_sampling_client(base_model=BASE_MODEL), tokenizer, workload)
        return [_measure(service, tokenizer, workload, pids[0] if pids else None) for _ in range(repeats)]


def measure_sizes(tokenizer: Qwen35Tokenizer, sizes: Sequence[tuple[int, int]], *, seed: int = 0,
                  in_process: bool = False, smallest_repeats: int = SMALLEST_REPEATS) -> list[list[SizeRecord]]:
    """Each size's measured rollouts, in the order given: the first size (the ratio's reference)
    ``smallest_repeats`` times after a warm-up rollout, every other size once."""
    records = []
    for index, (questions, group_size) in enumerate(sizes):
        workload = build_workload(WorkloadSpec(questions=questions, group_size=group_size), seed + 707 + index)
        records.append(_rollouts_of_size(tokenizer, workload, repeats=smallest_repeats if index == 0 else 1,
                                         warm_up=index == 0, in_process=in_process))
    return records


# ------------------------------------------------------------------------------- rows


def _per_trajectory(rollouts: Sequence[SizeRecord]) -> list[float]:
    return [r.ms_per_trajectory for r in rollouts]


def scaling_measures(records: Sequence[Sequence[SizeRecord]]) -> list[Measure]:
    """Rows: local CPU per trajectory at each size (the median of its rollouts, with their
    spread), the largest size's over the first's (one sample per pair of rollouts; target
    :data:`GROWTH_TARGET`), and the rollout's memory at the largest size and per 1,000 trajectories."""
    first, last = records[0], records[-1]
    measures = [
        Measure.of_samples(f"scaling_cpu_ms_per_trajectory_{size[0].trajectories}",
                           f"local CPU per trajectory, rollout of {size[0].trajectories:,} "
                           f"({size[0].questions} x {size[0].group_size})",
                           _per_trajectory(size), unit="ms", digits=2)
        for size in records
    ]
    growth = [large / max(1e-12, small) for large in _per_trajectory(last) for small in _per_trajectory(first)]
    measures.append(Measure.of_samples(
        "scaling_cpu_per_trajectory_growth",
        f"  local CPU per trajectory, {last[0].trajectories:,} / {first[0].trajectories:,}",
        growth, GROWTH_TARGET, "<=", "x", target_source="issue"))
    memory = statistics.median(r.memory_mb for r in last)
    measures += [
        Measure("scaling_memory_mb", f"  client memory growth, rollout of {last[0].trajectories:,}",
                memory, unit="MB", digits=0),
        Measure("scaling_memory_mb_per_1000_trajectories", "  client memory growth per 1,000 trajectories",
                1000.0 * memory / max(1, last[0].trajectories), unit="MB", digits=1),
    ]
    return measures


def scaling_details(records: Sequence[Sequence[SizeRecord]]) -> list[dict[str, object]]:
    """Per size, for ``bench.json``: its shape and each measured rollout with its local CPU."""
    return [{"trajectories": size[0].trajectories, "questions": size[0].questions,
             "group_size": size[0].group_size,
             "rollouts": [{**asdict(r), "local_seconds": r.local_seconds, "ms_per_trajectory": r.ms_per_trajectory}
                          for r in size]}
            for size in records]


def default_sizes(quick: bool, paper_sizes: bool = False) -> tuple[tuple[int, int], ...]:
    """:data:`QUICK_SIZES` with ``quick``; :data:`FULL_SIZES` with ``paper_sizes``;
    :data:`DEFAULT_SIZES` otherwise."""
    if quick:
        return QUICK_SIZES
    return FULL_SIZES if paper_sizes else DEFAULT_SIZES


def client_scaling(tokenizer: Qwen35Tokenizer, *, seed: int = 0, quick: bool = False, paper_sizes: bool = False,
                   sizes: Sequence[tuple[int, int]] | None = None) -> tuple[list[Measure], list[dict[str, object]]]:
    """The scaling rows and their per-size details, for ``sizes`` or :func:`default_sizes`
    (with ``quick`` the twin is served in this process)."""
    records = measure_sizes(tokenizer, sizes or default_sizes(quick, paper_sizes), seed=seed, in_process=quick)
    return scaling_measures(records), scaling_details(records)


def main() -> None:
    """``python -m searchr1.bench.client_scaling``: the full series (up to 4,096 trajectories)
    alone, printed as rows and as JSON details."""
    import json

    from searchr1.runtime.tokenizer import shared_tokenizer

    measures, details = client_scaling(shared_tokenizer(), sizes=FULL_SIZES)
    for measure in measures:
        target = "" if measure.target is None else f" (target {measure.comparator} {measure.formatted(measure.target)})"
        print(f"{measure.label.strip()}: {measure.formatted()} {measure.spread_text()}{target}")
    print(json.dumps(details, indent=1))


if __name__ == "__main__":
    main()
