"""What a twin can be configured with: limits, the stop-token convention, modelled latencies,
strict-mode rules and injected faults. Plain frozen dataclasses; nothing here does I/O."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TypedDict

from searchr1.twin.mismatch import check_scale

# Every operation a fault can target (HTTP routes of the control and actor APIs).
OPERATIONS = (
    "api_key_verify", "sdk_bootstrap", "model_list",
    "service_session_create", "service_session_renew", "service_session_close", "service_session_get",
    "training_run_create", "training_run_update", "training_run_get", "training_run_renew",
    "training_run_find_by_checkpoint_uri", "training_run_checkpoints",
    "sampling_run_create", "sampling_run_renew", "sampling_run_get",
    "checkpoint_list", "telemetry",
    "event_submit", "event_get", "heartbeat", "sample",
)
# Event types as the twin names them (pytrio's EventType values without "trainer.").
EVENT_TYPES = ("init_run", "forward", "forward_backward", "optimize_step", "save_state", "save_weights")
INJECTED_FAILURE_CODE = "twin.injected_failure"


@dataclass(frozen=True)
class OperationLimits:
    """One operation's capacity, as the model catalog reports it (``None``: unlimited)."""

    max_batch_size: int | None = None
    max_tokens_per_request: int | None = None
    max_seq_len: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_batch_size", "max_tokens_per_request", "max_seq_len"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"OperationLimits.{name} must be a positive int or None, got {value!r}")


@dataclass(frozen=True)
class TwinLimits:
    """The served model's limits (what ``get_server_capabilities()`` and run creation report).

    pytrio splits training calls by ``training`` and rejects oversized datums client-side; the
    twin enforces both ``training`` and ``sampling`` server-side as well.
    """

    training: OperationLimits = field(default_factory=OperationLimits)
    sampling: OperationLimits = field(default_factory=OperationLimits)
    max_context_length: int | None = None


@dataclass(frozen=True)
class StopConvention:
    """How a sequence that ended on a stop rule is returned.

    ``token_in_tokens``: the stop token (the one that matched a stop token id or completed a
    stop string, or the policy's own end of turn) is the last of ``tokens``, with its logprob.
    ``string_in_text``: the stop string (the stop token's text) ends ``text``. Logprobs are
    always aligned with tokens.
    """

    token_in_tokens: bool = True
    string_in_text: bool = False


@dataclass(frozen=True)
class Latencies:
    """Modelled service times in seconds (all zero by default: the twin answers at once).

    A sampling request takes ``sample_request + sampled_token * (tokens of its longest
    sequence)`` from when the twin starts on it, its own work included (the sequences of one
    request are generated side by side), plus a uniform
    ``[0, sample_jitter)`` draw from a generator seeded with ``jitter_seed``; a
    forward/forward_backward chunk ``trained_token * (input tokens)``; an optimiser step
    ``optim_step``; a checkpoint save ``weight_save``.
    """

    sample_request: float = 0.0
    sampled_token: float = 0.0
    trained_token: float = 0.0
    optim_step: float = 0.0
    weight_save: float = 0.0
    sample_jitter: float = 0.0
    jitter_seed: int = 0

    def __post_init__(self) -> None:
        for name, value in self.__dict__.items():
            if name != "jitter_seed" and (not isinstance(value, (int, float)) or value < 0):
                raise ValueError(f"Latencies.{name} must be >= 0 seconds, got {value!r}")


@dataclass(frozen=True)
class Strictness:
    """Strict mode: the server records protocol violations and fails a violating training event
    with ``twin.protocol_violation`` (see :mod:`searchr1.twin.strict` for the rules).

    ``sampled_actions`` checks that every datum position trained with a non-zero advantage
    holds a token the twin sampled after exactly that prefix, with the logprob it returned;
    turn it off only for synthetic datums that were never sampled. ``max_staleness`` is how
    many weight-changing optimiser steps a sampler may lag behind the run it trains.
    """

    enabled: bool = True
    sampled_actions: bool = True
    max_staleness: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.max_staleness, int) or self.max_staleness < 0:
            raise ValueError(f"Strictness.max_staleness must be an int >= 0, got {self.max_staleness!r}")


@dataclass(frozen=True)
class SampleRequestInfo:
    """What a sampling fault hook sees of one request."""

    call: int  # the request's number among the twin's sampling calls, from 1
    prompt: tuple[int, ...]
    num_samples: int
    max_tokens: int


# A hook's answer: None (serve it), an HTTP error status, "drop" (handled, answer lost) or
# "timeout" (no byte until the client gives up).
SampleFault = Callable[[SampleRequestInfo], "int | str | None"]
SAMPLE_FAULT_ACTIONS = ("drop", "timeout")


def _numbers(where: str, calls: Iterable[int]) -> frozenset[int]:
    numbers = frozenset(calls)
    if any(not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in numbers):
        raise ValueError(f"TwinFaults.{where}: call numbers start at 1, got {sorted(numbers, key=str)}")
    return numbers


def _known(where: str, name: str, choices: tuple[str, ...]) -> None:
    if name not in choices:
        raise ValueError(f"TwinFaults.{where}: unknown name {name!r}; expected one of {', '.join(choices)}")


@dataclass(frozen=True)
class TwinFaults:
    """Faults at the wire, numbered per twin and per operation (or event type) from 1.

    * ``capacity_full``: the first N training-run creations (and ``load_state`` rebinds)
      answer HTTP 429 ``actor_capacity_exceeded``; pytrio polls until a slot frees up.
    * ``http_errors``: ``{operation: {call: status}}``, that call answers the status with a
      JSON error body (5xx and 429 are retried by pytrio; 4xx are not).
    * ``dropped_connections``: ``{operation: {calls}}``, the twin handles the request, then
      closes the connection without answering (the answer is lost; pytrio retries, and an
      event submitted again is recognised by its id).
    * ``failed_events``: ``{event type: {call: code}}``, the event is accepted and then fails
      with that code (``EventFailedError``); nothing is applied.
    * ``broken_runs``: ``{event type: {calls}}``, as a failed event, and the training run is
      broken: every later event of it fails with ``training.run_broken``.
    * ``slow_events``: seconds every training event stays ``running`` before it executes.
    * ``sample_timeouts``: sampling calls that send no byte until the client gives up (the
      server waits ``sample_timeout_hold`` seconds, or until it stops).
    * ``sample_hook``: decides per sampling request (:class:`SampleRequestInfo`), for faults
      that depend on what is asked rather than on arrival order: ``None`` serves it, an HTTP
      status answers that error, ``"drop"`` and ``"timeout"`` act as above.
    * ``collapse_from``: a model collapse. Samplers whose weights have had this many weight
      updates or more (in a run that updates every step: from step N on) reply with one
      repetitive turn that has no ``Answer:`` line and no tool call, with logprob 0 for each
      token (:mod:`searchr1.twin.collapse`). ``None``: never.
    * ``sampler_noise``: a sampler-learner mismatch. The learning policy's samplers perturb each
      candidate turn's logit by a deterministic noise of this standard deviation per (prompt,
      candidate), as a low-precision inference engine would, and draw from and return the
      perturbed logprobs; training computes the exact ones (:mod:`searchr1.twin.mismatch`). 0: none.
    """

    capacity_full: int = 0
    http_errors: Mapping[str, Mapping[int, int]] = field(default_factory=dict)
    dropped_connections: Mapping[str, Iterable[int]] = field(default_factory=dict)
    failed_events: Mapping[str, Mapping[int, str]] = field(default_factory=dict)
    broken_runs: Mapping[str, Iterable[int]] = field(default_factory=dict)
    slow_events: float = 0.0
    sample_timeouts: Iterable[int] = frozenset()
    sample_timeout_hold: float = 30.0
    sample_hook: SampleFault | None = None
    collapse_from: int | None = None
    sampler_noise: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "sampler_noise", check_scale(self.sampler_noise))
        if self.collapse_from is not None and (not isinstance(self.collapse_from, int) or self.collapse_from < 0):
            raise ValueError(f"TwinFaults.collapse_from must be an int >= 0 or None, got {self.collapse_from!r}")
        if not isinstance(self.capacity_full, int) or self.capacity_full < 0:
            raise ValueError(f"TwinFaults.capacity_full must be an int >= 0, got {self.capacity_full!r}")
        errors = {}
        for operation, statuses in self.http_errors.items():
            _known("http_errors", operation, OPERATIONS)
            for number, status in statuses.items():
                _numbers(f"http_errors[{operation!r}]", [number])
                if not isinstance(status, int) or not 400 <= status <= 599:
                    raise ValueError(f"TwinFaults.http_errors[{operation!r}][{number}]: {status!r} is not an HTTP "
                                     f"error status")
            errors[operation] = MappingProxyType(dict(statuses))
        dropped = {}
        for operation, calls in self.dropped_connections.items():
            _known("dropped_connections", operation, OPERATIONS)
            dropped[operation] = _numbers(f"dropped_connections[{operation!r}]", calls)
        failed = {}
        for event, codes in self.failed_events.items():
            _known("failed_events", event, EVENT_TYPES)
            _numbers(f"failed_events[{event!r}]", codes)
            failed[event] = MappingProxyType(dict(codes))
        broken = {}
        for event, calls in self.broken_runs.items():
            _known("broken_runs", event, EVENT_TYPES)
            broken[event] = _numbers(f"broken_runs[{event!r}]", calls)
        if self.slow_events < 0 or self.sample_timeout_hold < 0:
            raise ValueError("TwinFaults.slow_events and sample_timeout_hold must be >= 0 seconds")
        object.__setattr__(self, "http_errors", MappingProxyType(errors))
        object.__setattr__(self, "dropped_connections", MappingProxyType(dropped))
        object.__setattr__(self, "failed_events", MappingProxyType(failed))
        object.__setattr__(self, "broken_runs", MappingProxyType(broken))
        object.__setattr__(self, "sample_timeouts", _numbers("sample_timeouts", self.sample_timeouts))


OFFLINE_FAULTS = ("collapse@N", "mismatch@SCALE", "none")
MAX_SAMPLER_NOISE = 10.0  # a logit noise past this is no precision error: the sampler is another model


class OfflineFault(TypedDict, total=False):
    """``--offline-fault`` as :class:`TwinFaults` keyword arguments."""

    collapse_from: int
    sampler_noise: float


def parse_offline_fault(text: str) -> OfflineFault:
    """``--offline-fault`` of ``train`` and ``twin serve``: ``collapse@N`` (from the N-th weight
    update on, the served policy degenerates), ``mismatch@SCALE`` (the learning policy's sampler
    differs from its learner by a logit noise of standard deviation SCALE) or ``none`` (no fault;
    on ``train --resume`` it clears the recorded one) as :class:`TwinFaults` keyword arguments."""
    if text.strip() == "none":
        return {}
    kind, sep, number = text.strip().partition("@")
    if kind not in ("collapse", "mismatch") or not sep:
        raise ValueError(f"--offline-fault {text!r}: expected one of {', '.join(OFFLINE_FAULTS)}")
    if kind == "mismatch":
        try:
            scale = float(number)
        except ValueError:
            scale = -1.0
        if not 0.0 < scale <= MAX_SAMPLER_NOISE:
            raise ValueError(f"--offline-fault {text!r}: SCALE must be a number in (0, {MAX_SAMPLER_NOISE:g}]")
        return {"sampler_noise": scale}
    if not number.isdigit():
        raise ValueError(f"--offline-fault {text!r}: N must be a step number >= 0")
    return {"collapse_from": int(number)}


def offline_fault_text(fault: OfflineFault) -> str:
    """The one spelling of a parsed fault, as config.json records it (``none`` for no fault)."""
    if "sampler_noise" in fault:
        return f"mismatch@{fault['sampler_noise']:g}"
    return f"collapse@{fault['collapse_from']}" if "collapse_from" in fault else "none"
