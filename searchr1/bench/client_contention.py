"""Figure 11: what one sampling request costs pytrio's thread, alone and beside a busy loop.

Figure 5 finds pytrio's event-loop thread spending about 3.4 ms of CPU per sampling request
inside a training step, which is what keeps the real client at about 2x the in-memory step.
This figure asks where that number comes from. It sends the same requests (one prompt, a
fixed number in flight, the toy policy of a twin served from another process) while our
main thread does nothing but await them, and again while it spends ``busy_ms`` of pure-Python
CPU on every answer, as the rollout engine does (figure 5's in-memory rollout runs about
2.5 ms on the main thread per request). The requests, the bytes and pytrio's work are the
same in both; only the second thread wanting the interpreter differs. Where the platform
allows, the busy run is repeated with the whole process pinned to one CPU (the two threads
then hand the GIL over on one core; the twin keeps the other).

Variants run interleaved, several times; each figure is the median with the lowest and highest
run. There is no target: the figure explains figure 5's floor, it does not hold one.
"""

from __future__ import annotations

import asyncio
import os
import time

from searchr1.runtime.tokenizer import Qwen35Tokenizer
from searchr1.bench.report import Figure, Measure
from searchr1.basics.wording import plural
from searchr1.bench.served import BASE_MODEL, served_twin
from searchr1.bench.thread_cpu import ThreadCpuMeter, client_thread_roles

IN_FLIGHT = 16  # pytrio 0.2.9 runs at most this many sampling requests of one client at once
PROMPT_TOKENS = 1500
REPLY_TOKENS = 60


def _busy(seconds: float) -> None:
    """Spend ``seconds`` of this thread's CPU in the interpreter (holding the GIL)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def _can_pin() -> bool:
    return hasattr(os, "sched_setaffinity") and hasattr(os, "sched_getaffinity") and len(os.sched_getaffinity(0)) > 1


def _pin_threads(cpus: set[int]) -> None:
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:
            pass  # the thread ended meanwhile


def client_contention_figure(tokenizer: Qwen35Tokenizer, *, seed: int = 0, quick: bool = False,
                             requests: int | None = None, repetitions: int | None = None,
                             busy_ms: float = 2.5) -> Figure:
    import pytrio as trio

    started = time.perf_counter()
    requests = requests if requests is not None else (40 if quick else 200)
    repetitions = repetitions if repetitions is not None else (1 if quick else 3)
    prompt = tokenizer.encode("Which city is meant? " * (PROMPT_TOKENS // 4))[:PROMPT_TOKENS]
    pin = _can_pin() and not quick  # --quick serves the twin in this process: pinning would pin it too
    variants: dict[str, tuple[float, bool]] = {"idle": (0.0, False), "busy": (busy_ms / 1000, False)}
    if pin:
        variants["busy_pinned"] = (busy_ms / 1000, True)
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}

    with served_twin(None, policy="toy", tokenizer=tokenizer, in_process=quick) as service:
        sampler = service.create_sampling_client(base_model=BASE_MODEL)
        meter = ThreadCpuMeter(client_thread_roles(service), [])
        all_cpus = set(os.sched_getaffinity(0)) if pin else set()

        async def burst(work: float, count: int) -> None:
            slots = asyncio.Semaphore(IN_FLIGHT)

            async def one(index: int) -> None:
                params = trio.SamplingParams(max_tokens=REPLY_TOKENS, seed=seed * 100_003 + index, temperature=1.0)
                async with slots:
                    await sampler.sample_async(prompt=trio.ModelInput.from_ints(prompt), num_samples=1,
                                               sampling_params=params)
                if work:
                    _busy(work)

            await asyncio.gather(*(one(i) for i in range(count)))

        def measure(work: float, pinned: bool) -> tuple[float, float]:
            if pinned:
                _pin_threads({min(all_cpus)})
            try:
                start = meter.snapshot()
                asyncio.run(burst(work, requests))
                spent = meter.interval(start, meter.snapshot())
            finally:
                if pinned:
                    _pin_threads(all_cpus)
            main = spent.roles.get("main", 0.0) - work * requests  # our own stand-in work is not the wire's
            return 1000 * spent.roles.get("client", 0.0) / requests, 1000 * max(0.0, main) / requests

        asyncio.run(burst(0.0, min(requests, 20)))  # connections and caches warm before any sample
        for _ in range(repetitions):
            for name, (work, pinned) in variants.items():
                samples[name].append(measure(work, pinned))

    def client_ms(name: str) -> list[float]:
        return [c for c, _ in samples[name]]

    inflation = [busy / idle for busy, idle in zip(client_ms("busy"), client_ms("idle")) if idle > 0]
    measures = [
        Measure.of_samples("client_ms_per_request_main_idle", "pytrio thread per request, our loop idle",
                           client_ms("idle"), unit="ms", digits=2),
        Measure.of_samples("client_ms_per_request_main_busy",
                           f"pytrio thread per request, our loop busy {busy_ms:g} ms per answer",
                           client_ms("busy"), unit="ms", digits=2),
    ]
    if inflation:  # empty where pytrio's thread cannot be read apart (no /proc)
        measures.append(Measure.of_samples("client_busy_over_idle", "  the same requests, busy / idle", inflation,
                                           unit="x", digits=2))
    if pin:
        measures.append(Measure.of_samples(
            "client_ms_per_request_main_busy_pinned", "pytrio thread per request, busy, process on one CPU",
            client_ms("busy_pinned"), unit="ms", digits=2))
    measures.append(Measure.of_samples("main_ms_per_request_wire", "main thread per request, pytrio's calls "
                                       "on our loop", [m for _, m in samples["idle"]], unit="ms", digits=2))
    figure = Figure(
        number=11, name="client_contention", title="pytrio's CPU per request, alone and beside our loop",
        measures=measures,
        details={"requests": requests, "repetitions": repetitions, "in_flight": IN_FLIGHT, "busy_ms": busy_ms,
                 "prompt_tokens": len(prompt), "reply_tokens": REPLY_TOKENS, "pinned_variant": pin,
                 "samples": {name: [{"client_ms": c, "main_ms": m} for c, m in values]
                             for name, values in samples.items()}},
        notes=[f"{plural(repetitions, 'interleaved run')} of {requests} requests per variant, {IN_FLIGHT} in flight, a "
               f"{len(prompt)}-token prompt, {REPLY_TOKENS} tokens back; CPU per thread; the twin served from "
               f"{'this process (--quick: not for quoting)' if quick else 'another process'}"],
    )
    figure.seconds = time.perf_counter() - started
    return figure
