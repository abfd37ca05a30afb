"""Strict mode: protocol rules the twin checks on every training event.

A violation is recorded on the twin (tests fail on any they did not expect) and, while strict
mode is on, the violating event fails with ``twin.protocol_violation`` and a message naming
the rule. The rules:

``event_order``
    A run's events carry indices 1, 2, 3, ... in submission order, the first is
    ``trainer.init_run`` (and only the first), and every event's ``step`` equals the number of
    ``forward_backward`` calls completed before it (the chunks of one call share a step).
``accumulation_totals``
    Every chunk of one call carries the same totals, and once the call's chunks have all
    arrived (as many samples as ``total_samples``) the samples, active targets and
    advantage targets actually received add up to them. A call left short fails the next
    event; a chunk that overshoots fails itself.
``token_range``
    Every input token and every target other than ``-100`` is in ``[0, vocab size)``.
``sampled_action``
    Every position trained with a non-zero advantage holds a token the twin sampled right
    after exactly that prefix, ...
``sampled_logprob``
    ... with the logprob the twin returned for it (compared at float32 precision), or the one a
    ``forward`` of the same run returned for it (the learner's own logprob, sent as a proximal
    policy by ``--correction decoupled``), ...
``stale_sampler``
    ... by a sampler whose weights are at most ``max_staleness`` weight-changing optimiser
    steps behind the run, and of the same run lineage (a sampler of the base model counts as
    version 0 of every lineage).

The ledger of sampled tokens is keyed by two polynomial hashes of the whole prefix (mod two
primes near 2^31, computed with numpy over a whole sequence at once), the prefix length and
the token, so a lookup never compares token lists.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from searchr1.twin.policy import IGNORE_INDEX, PolicySample
from searchr1.basics.wording import plural

VIOLATION_CODE = "twin.protocol_violation"
RULES = ("event_order", "accumulation_totals", "token_range", "sampled_action", "sampled_logprob",
         "stale_sampler")
BASE_LINEAGE = "base"
_MODULI = (2_147_483_647, 2_147_483_629)
_BASES = (911_382_323, 972_663_749)


@dataclass(frozen=True)
class Violation:
    rule: str
    message: str
    run: str | None = None
    event_id: str | None = None

    def __str__(self) -> str:
        where = f" (run {self.run}, event {self.event_id})" if self.run else ""
        return f"{self.rule}: {self.message}{where}"


class ProtocolViolation(Exception):
    def __init__(self, rule: str, message: str) -> None:
        super().__init__(f"strict mode: {rule}: {message}")
        self.rule = rule
        self.detail = message


class _Powers:
    """``B^i`` and ``B^-i`` modulo each prime, grown on demand."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.size = 0
        self.up: list[np.ndarray] = []
        self.down: list[np.ndarray] = []

    def ensure(self, n: int) -> None:
        if n <= self.size:
            return
        with self._lock:
            size = max(n, 2 * self.size, 1024)
            self.up, self.down = [], []
            for modulus, base in zip(_MODULI, _BASES):
                inverse = pow(base, -1, modulus)
                up, down = np.empty(size, np.int64), np.empty(size, np.int64)
                a = b = 1
                for i in range(size):
                    up[i], down[i] = a, b
                    a, b = a * base % modulus, b * inverse % modulus
                self.up.append(up)
                self.down.append(down)
            self.size = size


_POWERS = _Powers()


def _hash_parts(tokens: Sequence[int] | np.ndarray) -> list[np.ndarray]:
    """Per modulus, ``parts[k][i]`` is the hash of ``tokens[: i + 1]``."""
    ids = np.asarray(tokens, dtype=np.int64) + 1
    n = len(ids)
    _POWERS.ensure(n + 1)
    return [
        np.cumsum(ids * _POWERS.down[k][:n] % modulus) % modulus * _POWERS.up[k][:n] % modulus
        for k, modulus in enumerate(_MODULI)
    ]


def _combine(parts: list[np.ndarray]) -> np.ndarray:
    return parts[0] * _MODULI[1] + parts[1]


def prefix_hashes(tokens: Sequence[int] | np.ndarray) -> np.ndarray:
    """``hashes[i]`` identifies ``tokens[: i + 1]`` (one int64 from two modular hashes)."""
    return _combine(_hash_parts(tokens))


def continued_hashes(prefix: Sequence[int], continuations: Sequence[Sequence[int]]) -> list[list[int]]:
    """For each continuation ``c``, the hashes of ``prefix + c[:k]`` for ``k`` in
    ``0 .. len(c) - 1`` (the prefix before each of its tokens); the prefix is hashed once."""
    head = [part[-1] for part in _hash_parts(prefix)]
    out: list[list[int]] = []
    for tokens in continuations:
        if not len(tokens):
            out.append([])
            continue
        tail = _hash_parts(tokens)
        n = len(tokens)
        before = []
        for k, modulus in enumerate(_MODULI):
            # hash(prefix + c[:j]) = hash(prefix) * B^j + hash(c[:j]), for j = 0 .. n - 1
            shifted = int(head[k]) * _POWERS.up[k][:n] % modulus
            own = np.concatenate([[0], tail[k][:-1]])
            before.append((shifted + own) % modulus)
        out.append(_combine(before).tolist())
    return out


class SampledToken(NamedTuple):
    """One returned token's logprob and the sampler that returned it (a tuple: the ledger makes
    one per returned token)."""

    logprob: float  # as the float32 the twin returned
    lineage: str
    version: int


class SampleLedger:
    """Every token the twin returned from a sampler, keyed by (prefix hash, prefix length, token)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[tuple[int, int, int], list[SampledToken]] = {}
        self._learned: dict[tuple[int, int, int], list[SampledToken]] = {}  # what forward calls returned

    def record(self, prompt: Sequence[int], sequences: Sequence[tuple[Sequence[int], Sequence[float]]],
               *, lineage: str, version: int) -> None:
        """The ``(tokens, logprobs)`` of every sequence one request returned after ``prompt``."""
        hashes = continued_hashes(prompt, [tokens for tokens, _ in sequences])
        with self._lock:
            for (tokens, logprobs), before in zip(sequences, hashes):
                values = np.asarray(logprobs, dtype=np.float32).tolist()
                entries = [SampledToken(v, lineage, version) for v in values]
                for k, (token, entry) in enumerate(zip(tokens, entries)):
                    self._entries.setdefault((before[k], len(prompt) + k, int(token)), []).append(entry)

    def record_learned(self, samples: Sequence[PolicySample], logprobs: Sequence[np.ndarray], *, lineage: str,
                       version: int) -> None:
        """What a ``forward`` of run ``lineage`` returned for the trained positions of its samples."""
        with self._lock:
            for sample, values in zip(samples, logprobs):
                trained = np.flatnonzero(sample.active & (sample.advantages != 0.0))
                if not len(trained):
                    continue
                hashes = prefix_hashes(sample.inputs[: int(trained[-1]) + 1])
                for position in trained.tolist():
                    key = (int(hashes[position]), position + 1, int(sample.targets[position]))
                    entry = SampledToken(float(np.float32(values[position])), lineage, version)
                    self._learned.setdefault(key, []).append(entry)

    def lookup(self, prefix_hash: int, length: int, token: int) -> list[SampledToken]:
        with self._lock:
            return list(self._entries.get((prefix_hash, length, token), ()))

    def learned(self, prefix_hash: int, length: int, token: int) -> list[SampledToken]:
        with self._lock:
            return list(self._learned.get((prefix_hash, length, token), ()))

    def forget_older_than(self, lineage: str, version: int) -> None:
        """Drop what samplers and forward calls of ``lineage`` older than ``version`` returned."""
        with self._lock:
            for entries in (self._entries, self._learned):
                for key in list(entries):
                    kept = [e for e in entries[key] if e.lineage != lineage or e.version >= version]
                    if kept:
                        entries[key] = kept
                    else:
                        del entries[key]

    def __len__(self) -> int:
        return len(self._entries)


def check_token_range(samples: Sequence[PolicySample], vocab_size: int) -> None:
    for index, sample in enumerate(samples):
        for name, ids in (("input", sample.inputs), ("target", sample.targets[sample.targets != IGNORE_INDEX])):
            bad = ids[(ids < 0) | (ids >= vocab_size)]
            if len(bad):
                raise ProtocolViolation(
                    "token_range", f"datum {index}: {name} token id {int(bad[0])} is outside [0, {vocab_size})"
                )


def check_sampled_actions(samples: Sequence[PolicySample], ledger: SampleLedger, *, lineage: str,
                          version: int, max_staleness: int) -> None:
    """The ``sampled_action``, ``sampled_logprob`` and ``stale_sampler`` rules."""
    for index, sample in enumerate(samples):
        trained = np.flatnonzero(sample.active & (sample.advantages != 0.0))
        if not len(trained):
            continue
        hashes = prefix_hashes(sample.inputs[: int(trained[-1]) + 1])
        for position in trained.tolist():
            token = int(sample.targets[position])
            found = ledger.lookup(int(hashes[position]), position + 1, token)
            where = f"datum {index} position {position} (token {token})"
            if not found:
                raise ProtocolViolation(
                    "sampled_action",
                    f"{where} is trained with advantage {sample.advantages[position]:g} but the twin "
                    "never sampled that token after that prefix (or did so from weights more than "
                    f"{plural(max_staleness + 1, 'step')} older than the run's, which it no longer remembers)",
                )
            logprob = float(np.float32(sample.old_logprobs[position]))
            matching = [e for e in found if e.logprob == logprob]
            if not matching and any(e.logprob == logprob and e.lineage == lineage
                                    for e in ledger.learned(int(hashes[position]), position + 1, token)):
                matching = found  # the run's own forward returned it: a proximal policy's logprob
            if not matching:
                raise ProtocolViolation(
                    "sampled_logprob",
                    f"{where} carries logprob {logprob:.6g}, the twin returned "
                    f"{', '.join(f'{e.logprob:.6g}' for e in found)}",
                )
            fresh = [
                e for e in matching
                if (e.lineage == lineage or e.lineage == BASE_LINEAGE) and version - e.version <= max_staleness
            ]
            if not fresh:  # name this run's own newest sampler of the token when it has one
                own = [e for e in matching if e.lineage in (lineage, BASE_LINEAGE)]
                e = max(own, key=lambda entry: entry.version) if own else matching[0]
                raise ProtocolViolation(
                    "stale_sampler",
                    f"{where} was sampled from weights version {e.version} of {e.lineage}; the run "
                    f"({lineage}) is at version {version} and allows "
                    f"{plural(max_staleness, 'weight-changing optimiser step')} of staleness",
                )


@dataclass
class GroupProgress:
    """The chunks of one forward/forward_backward call received so far."""

    event_type: str
    step: int
    totals: tuple[int, int, int]
    samples: int = 0
    active: int = 0
    advantage: int = 0

    @property
    def complete(self) -> bool:
        return self.samples >= self.totals[0]


def counted(samples: Sequence[PolicySample], loss_fn: str) -> tuple[int, int]:
    """Active and advantage targets as pytrio counts them (cross entropy: weight != 0)."""
    active = advantage = 0
    for sample in samples:
        mask = sample.active
        if loss_fn == "cross_entropy":
            mask = mask & (sample.weights != 0.0)
            active += int(mask.sum())
        else:
            active += int(mask.sum())
            advantage += int((mask & (sample.advantages != 0.0)).sum())
    return active, advantage


@dataclass
class RunProtocol:
    """Per-run state of the ``event_order`` and ``accumulation_totals`` rules."""

    next_index: int = 1
    completed_calls: int = 0  # forward_backward calls whose chunks have all arrived
    open_group: GroupProgress | None = None
    initialized: bool = False
    notes: list[str] = field(default_factory=list)

    def _close_group(self) -> None:
        group = self.open_group
        if group is None:
            return
        self.open_group = None
        if group.event_type == "trainer.forward_backward":
            self.completed_calls += 1

    def admit(self, event_type: str, index: int, step: int) -> None:
        """Check an event's place in the run (called in submission order)."""
        expected = self.next_index
        self.next_index = index + 1
        if index != expected:
            raise ProtocolViolation("event_order", f"event index {index}, expected {expected}")
        if event_type == "trainer.init_run":
            if self.initialized or index != 1:
                raise ProtocolViolation("event_order", "trainer.init_run must be the run's first event, once")
            self.initialized = True
        elif not self.initialized:
            raise ProtocolViolation("event_order", f"{event_type} before trainer.init_run")
        group = self.open_group
        continuing = group is not None and group.event_type == event_type and group.step == step
        if group is not None and not continuing:
            self._close_group()
            raise ProtocolViolation(
                "accumulation_totals",
                f"the {group.event_type} call at step {group.step} sent {group.samples} of its "
                f"{group.totals[0]} samples before {event_type} arrived",
            )
        if not continuing and step != self.completed_calls:
            raise ProtocolViolation(
                "event_order", f"{event_type} carries step {step}, but "
                f"{plural(self.completed_calls, 'forward_backward call')} came before it"
            )

    def receive_chunk(self, event_type: str, step: int, totals: tuple[int, int, int],
                      samples: Sequence[PolicySample], loss_fn: str) -> None:
        """Account one forward/forward_backward chunk against its call's totals."""
        group = self.open_group
        if group is None:
            group = self.open_group = GroupProgress(event_type, step, totals)
        elif group.totals != totals:
            self._close_group()
            raise ProtocolViolation(
                "accumulation_totals", f"chunk totals {totals} differ from the call's first chunk {group.totals}"
            )
        active, advantage = counted(samples, loss_fn)
        group.samples += len(samples)
        group.active += active
        group.advantage += advantage
        received = (group.samples, group.active, group.advantage)
        if group.samples > totals[0] or group.active > totals[1] or group.advantage > totals[2]:
            self._close_group()
            raise ProtocolViolation(
                "accumulation_totals",
                f"received (samples, active, advantage tokens) {received} exceed the totals {totals}",
            )
        if group.complete:
            self._close_group()
            if received != totals:
                raise ProtocolViolation(
                    "accumulation_totals",
                    f"the call's chunks add up to (samples, active, advantage tokens) {received}, "
                    f"the totals say {totals}",
                )
