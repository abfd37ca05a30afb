"""The twin's ``scripted`` policy: replies from a scenario, trains a toy table.

Sampling answers from a :class:`~searchr1.twin.scenario.Scenario` and behaves like a
deterministic policy: the reply is a function of the prompt. It finds the question and the
turn by reading the prompt (decoded with the real tokenizer), tokenizes the scripted text,
appends ``<|im_end|>`` (or cuts at ``max_tokens``) and derives logprobs from a seed and the
prompt, so replies never depend on the order requests arrive in. Two samples that share
their history must script the same next turn (it refuses otherwise).

Training runs on a :class:`~searchr1.twin.toy_policy.ToyPolicy` table, so that every update
the server applies is exact and checkable. The two halves are independent: the script does
not change when the table does (the scripted policy does not learn), and its logprobs are
not the table's. That is enough for the offline plumbing; ``learning`` is the twin's policy
that really learns.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from searchr1.runtime.tokenizer import GENERATION_PROMPTS, REASONING_CLOSE, Qwen35Tokenizer
from searchr1.twin.policy import LossResult, PolicySample, Reduction, SampledSequence, Totals
from searchr1.twin.scenario import Scenario, ScenarioError, ScriptedQuestion, normalise
from searchr1.twin.toy_policy import ToyPolicy
from searchr1.basics.wording import plural

_ASSISTANT_HEADER, _THINKING_HEADER = GENERATION_PROMPTS[False], GENERATION_PROMPTS[True]
_EMPTY_REASONING = REASONING_CLOSE  # thinking off, what follows the open <think> of every turn
_USER_HEADER = "<|im_start|>user\n"
STOP_TOKEN = "<|im_end|>"


@dataclass(frozen=True)
class SampleCall:
    """What one request asked the script for (tests read these)."""

    question_id: str
    turn: int
    num_samples: int
    sample_indices: tuple[int, ...]
    max_tokens: int
    seed: int | None
    prompt_tokens: int
    time: float = 0.0  # time.monotonic() when the script was asked


def read_conversation(text: str) -> tuple[str, list[str]]:
    """The question and the assistant turns (text before each ``<|im_end|>``) of a prompt that ends
    with a generation prompt, thinking off or on (then a turn's text begins with its reasoning, as
    the model wrote it after the open ``<think>``)."""
    start = text.find(_USER_HEADER)
    if start < 0:
        raise ScenarioError("the prompt holds no user turn")
    question = text[start + len(_USER_HEADER):].split(STOP_TOKEN, 1)[0]
    thinking = not text.endswith(_ASSISTANT_HEADER)
    parts = text.split(_THINKING_HEADER)
    if len(parts) < 2 or parts[-1] != ("" if thinking else _EMPTY_REASONING):
        raise ScenarioError("the prompt does not end with an assistant generation prompt")
    turns = [part.removeprefix("" if thinking else _EMPTY_REASONING).split(STOP_TOKEN, 1)[0] for part in parts[1:-1]]
    return question, turns


class ScriptedPolicy:
    """Satisfies ``TwinPolicy``; see the module docstring."""

    def __init__(
        self,
        scenario: Scenario | Sequence[ScriptedQuestion],
        tokenizer: Qwen35Tokenizer,
        *,
        seed: int = 0,
        trainer: ToyPolicy | None = None,
    ) -> None:
        scripted = scenario.questions if isinstance(scenario, Scenario) else tuple(scenario)
        self._by_question = {normalise(q.example.question): q for q in scripted}
        self._tokenizer = tokenizer
        self._seed = seed
        self._stop = int(tokenizer.convert_tokens_to_ids(STOP_TOKEN))
        self.trainer = trainer or ToyPolicy(vocab_size=len(tokenizer), stop_token=self._stop)
        self.kind = f"scripted+{self.trainer.kind}"
        self._lock = threading.Lock()
        self.calls: list[SampleCall] = []
        self._reply_tokens: dict[str, tuple[int, ...]] = {}  # a scripted reply's tokens, encoded once

    # -- the reply, as a pure function of the prompt ------------------------------------

    def locate(self, tokens: Sequence[int], num_samples: int) -> tuple[ScriptedQuestion, int, list[int]]:
        """The scripted question, the turn and the sample indices a prompt asks for."""
        text = self._tokenizer.decode(list(tokens), skip_special_tokens=False)
        question_text, turns = read_conversation(text)
        scripted = self._by_question.get(normalise(question_text))
        if scripted is None:
            raise ScenarioError(
                f"no scripted question matches the prompt's question {question_text!r} "
                f"(turn {len(turns) + 1})"
            )
        qid, turn = scripted.example.id, len(turns)
        if turn == 0:
            if num_samples > len(scripted.samples):
                raise ScenarioError(
                    f"question {qid!r}: asked for {num_samples} samples on turn 1, "
                    f"the scenario scripts {len(scripted.samples)}"
                )
            return scripted, turn, list(range(num_samples))
        if num_samples != 1:
            raise ScenarioError(f"question {qid!r} turn {turn + 1}: later turns take num_samples=1")
        seen = [normalise(t) for t in turns]
        matching = [
            j for j, sample in enumerate(scripted.samples)
            if len(sample) >= turn and [normalise(t) for t in sample[:turn]] == seen
        ]
        if not matching:
            raise ScenarioError(
                f"question {qid!r} turn {turn + 1}: no scripted sample has the turns this prompt holds"
            )
        continuing = [j for j in matching if len(scripted.samples[j]) > turn]
        if not continuing:
            raise ScenarioError(
                f"question {qid!r} turn {turn + 1}: sample {matching[0]} has only "
                f"{plural(turn, 'scripted turn')} but the engine asked for another"
            )
        replies = {scripted.samples[j][turn] for j in continuing}
        if len(replies) > 1:
            raise ScenarioError(
                f"question {qid!r} turn {turn + 1}: samples {continuing} share their history but "
                "script different replies (a scripted policy must be a function of its prompt)"
            )
        return scripted, turn, [continuing[0]]

    def _sequence(self, prompt: Sequence[int], scripted: ScriptedQuestion, turn: int, j: int,
                  max_tokens: int) -> SampledSequence:
        text = scripted.samples[j][turn]
        encoded = self._reply_tokens.get(text)
        if encoded is None:
            encoded = self._reply_tokens[text] = tuple(self._tokenizer.encode(text, add_special_tokens=False))
        tokens = [*encoded, self._stop]
        stopped = len(tokens) <= max_tokens
        tokens = tokens[:max_tokens]
        digest = hashlib.blake2b(
            np.asarray(prompt, dtype=np.int64).tobytes() + f"/{self._seed}/{j}".encode(), digest_size=8
        ).digest()
        rng = np.random.default_rng(int.from_bytes(digest, "big"))
        logprobs = (-np.abs(rng.normal(0.0, 0.6, size=len(tokens)))).astype(np.float32)
        return SampledSequence(tokens, [float(x) for x in logprobs], stopped)

    # -- TwinPolicy ---------------------------------------------------------------------

    def initial_params(self) -> np.ndarray:
        return self.trainer.initial_params()

    def sample(
        self,
        params: np.ndarray,
        prompt: Sequence[int],
        num_samples: int,
        *,
        max_tokens: int,
        seed: int | None,
        temperature: float,
    ) -> list[SampledSequence]:
        prompt = [int(t) for t in prompt]
        scripted, turn, indices = self.locate(prompt, num_samples)
        with self._lock:
            self.calls.append(SampleCall(scripted.example.id, turn, num_samples, tuple(indices),
                                         max_tokens, seed, len(prompt), time.monotonic()))
        return [self._sequence(prompt, scripted, turn, j, max_tokens) for j in indices]

    def loss_and_grad(
        self,
        params: np.ndarray,
        samples: Sequence[PolicySample],
        *,
        loss_fn: str,
        reduction: Reduction,
        totals: Totals,
        loss_config: Mapping[str, object] | None = None,
    ) -> LossResult:
        return self.trainer.loss_and_grad(params, samples, loss_fn=loss_fn, reduction=reduction,
                                          totals=totals, loss_config=loss_config)
