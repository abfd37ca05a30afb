"""Explicit fault injection for chaos tests of the training loop.

Calls are numbered from 1 per :class:`~searchr1.fake_trio.FakeServiceClient` (i.e. per
process), counting every training client it created: after a rebuild from a checkpoint the
numbering continues, so "call 3 fails" happens once, as a transient server fault would.

* ``fail_forward_backward_calls``: that ``forward_backward`` call is accepted, but its
  future raises ``EventFailedError`` and no gradient is accumulated. The client stays usable
  (as pytrio when the call was a single chunk).
* ``break_run_on_forward_backward_calls``: that call's future raises ``EventFailedError``
  AND the client becomes permanently broken: every later call on it raises
  ``PyTrioError(code="training.run_broken")`` synchronously (pytrio §4.3). Recovery is a new
  client from the last ``save_state`` checkpoint.
* ``fail_optim_step_calls``: that ``optim_step``'s future raises ``EventFailedError``; the
  accumulated gradient is kept, weights and optimiser state are unchanged.
* ``fail_sample_calls``: that ``sample``/``sample_async``/``compute_logprobs`` call (counted
  over all sampling clients) raises a retryable ``ActorAPIError(code="actor.request_failed")``
  through its future (``sample_async``: raised by the await).
"""

from __future__ import annotations

from dataclasses import dataclass, field

INJECTED_FAILURE_CODE = "fake.injected_failure"


@dataclass(frozen=True)
class FakeFaults:
    fail_forward_backward_calls: frozenset[int] = field(default_factory=frozenset)
    break_run_on_forward_backward_calls: frozenset[int] = field(default_factory=frozenset)
    fail_optim_step_calls: frozenset[int] = field(default_factory=frozenset)
    fail_sample_calls: frozenset[int] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        for name in (
            "fail_forward_backward_calls",
            "break_run_on_forward_backward_calls",
            "fail_optim_step_calls",
            "fail_sample_calls",
        ):
            calls = frozenset(getattr(self, name))
            if any(not isinstance(c, int) or c < 1 for c in calls):
                raise ValueError(f"FakeFaults.{name}: call numbers start at 1, got {sorted(calls)}")
            object.__setattr__(self, name, calls)
