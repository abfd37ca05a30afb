"""What the core works on: a question (``SearchExample``), what a tool call returns
(``SearchResult``), and the record of one multi-turn rollout (``Trajectory``: its turns and the
calls they made): exactly the tokens that were sampled, plus what the environment said.
Messages are kept only for logs and for the chat template. What the algorithm allows one rollout
is :mod:`searchr1.core.budgets`."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal, NotRequired, Protocol, Self, TypedDict


if TYPE_CHECKING:
    from pytrio.types import (APIFuture, AdamParams, Datum, ForwardBackwardOutput, ModelInput, OptimStepResponse,
                              SampleResponse, SamplingParams, SaveWeightsForSamplerResponse, SaveWeightsResponse)

JsonValue = str | int | float | bool | None | list["JsonValue"] | dict[str, "JsonValue"]
JsonObject = dict[str, JsonValue]  # a JSON object: the search tool's schema, a record as written


@dataclass(frozen=True)
class SearchExample:
    """One question with its reference answers."""

    id: str
    question: str
    answers: tuple[str, ...]
    data_source: str


@dataclass(frozen=True)
class SearchItem:
    """One result as the model reads it; ``ident``: the passage id ``open_page`` takes (local, retriever)."""

    title: str
    content: str
    source: str | None = None
    url: str | None = None
    ident: str | None = None


@dataclass(frozen=True)
class SearchResult:
    """Outcome of one tool call. ``ok=False`` carries a short, sanitised ``error`` (failure class
    and status; never a response body, never a secret). ``cached``: no request was made.
    ``attempts``: requests sent to the service for this call (0: none); ``usage``: what the service
    reported consuming (DeepSeek's tokens), failed attempts included."""

    ok: bool
    items: tuple[SearchItem, ...] = ()
    latency: float = 0.0
    status: int | None = None
    error: str | None = None
    cached: bool = False
    attempts: int = 0
    usage: ReportedUsage | None = None


class Counts:
    """Base of a dataclass of counts: ``a.add(b)`` adds each field of ``b`` into ``a`` with ``+``."""
    def add(self, other: Self) -> None:
        for name, value in vars(other).items():
            setattr(self, name, getattr(self, name) + value)


@dataclass
class ReportedUsage(Counts):
    """Tokens and searches a search service reported for one call (summed over its attempts)."""

    input_tokens: int = 0
    cache_read_input_tokens: int = 0
    output_tokens: int = 0
    web_search_requests: int = 0


class Termination(StrEnum):
    """Why a trajectory ended; exactly one per finished trajectory (the values are what metrics
    names and files hold)."""

    ANSWER = "answer"                    # the model answered: no tool call, one non-empty Answer: line
    NO_ANSWER = "no_answer"              # a reply with no tool call and no scorable Answer: line
    INVALID = "invalid"                  # malformed or disallowed tool call (with invalid_calls=end)
    SEARCH_BUDGET = "search_budget"      # a valid tool call after its tool's budget (search's or another's) was spent
    TURN_BUDGET = "turn_budget"          # a valid tool call on the last allowed assistant turn
    TOKEN_BUDGET = "token_budget"        # no room left in the trajectory for another assistant turn
    TOOL_OVERFLOW = "tool_overflow"      # the observation could not be fitted (the lab port's behaviour, opt-in)
    SEARCH_ERROR = "search_error"        # the search result could not be turned into an observation at all
    SAMPLER_ERROR = "sampler_error"      # sampling failed after retries
    PROMPT_TOO_LONG = "prompt_too_long"  # the initial prompt alone exceeds the trajectory budget


class Exclusion(StrEnum):
    """Why a trajectory with completion tokens sends no datum (the values are what files hold)."""

    DEGENERATE_GROUP = "degenerate_group"  # all rewards in its group are equal: no signal
    ENV_FAILURE_GROUP = "env_failure_group"  # a search or sampler failure hit its group
    SAMPLER_ERROR = "sampler_error"  # with kept env failures: its own sampling failed (out of the mean)
    SURPLUS_GROUP = "dynamic_sampling_surplus"  # a group with a signal beyond dynamic sampling's batch


@dataclass(frozen=True)
class RewardResult:
    """Every score of one answer (:mod:`searchr1.core.reward`); ``reward`` is the one trained on."""

    reward: float
    valid_format: bool
    exact_match: bool
    answer: str | None
    f1: float = 0.0
    cover_em: bool = False


@dataclass(frozen=True)
class Verdict:
    """A judge's verdict on a trajectory's answer (``--judge``: the harness's plug-in sets it before
    the reward terms): ``correct``, or the ``error`` that kept the judge from answering, an
    environment failure and never a reward; ``record``: what the transcripts keep of it."""

    correct: bool
    error: str | None = None
    record: JsonObject = field(default_factory=dict)


DEFAULT_MAX_TRAJECTORY_TOKENS = 8192  # the lab port's whole-sequence budget, also the training datum limit
FORMAT_PENALTY = -0.1  # the reward of a format failure, and of a trajectory that did not answer
NOT_ANSWERED = RewardResult(FORMAT_PENALTY, False, False, None)
MAX_TOKENS = 262_144  # Qwen3.5's context: no token budget can be larger


class Message(TypedDict):
    """One chat message as the chat template reads it; a tool message also names its call."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str
    tool_call_id: NotRequired[str]
    name: NotRequired[str]
    reasoning_content: NotRequired[str]  # an assistant turn's reasoning (thinking on)


@dataclass
class CallRecord:
    """One tool call as the environment answered it (for the transcripts, the metrics and the
    environment-failure rule). ``query`` is the call as shown: a search's query, another tool's
    arguments as written; for a refused call (``refused``: it ran nothing, the model read why,
    ``invalid_calls=observe``) the function it named, which is also its ``tool``."""

    query: str
    ok: bool
    observation: str               # the tool-message text the model was shown
    items: int = 0
    error: str | None = None
    cached: bool = False
    truncated: bool = False        # the first item was truncated to fit the budget
    tool: str = field(kw_only=True)
    refused: bool = False


@dataclass
class Turn:
    """One assistant turn, the unit the update trains on: the tokens it was sampled on, exactly
    what the sampler returned, which weights sampled it, the calls it made with their results,
    an optional reward of its own, and the advantage each of its completion tokens carries."""

    prompt_tokens: list[int]       # the whole model input before this turn
    completion_tokens: list[int]   # exactly what the sampler returned
    logprobs: list[float]          # sampler (old-policy) logprob per completion token
    text: str
    stop_reason: str = "stop"
    sampler: int = 0               # the weights that sampled it: training steps finished before
    calls: list[CallRecord] = field(default_factory=list)
    reward: float | None = None    # a reward earned by this turn alone (None: only the trajectory's)
    advantage: float = 0.0         # what its completion tokens carry (set with the trajectory's)
    step_group: int = 0            # turns in its GiGPO step group (0: no step credit was given)
    context: int = 0               # the context it was sampled in: 0, then one more after each fold


@dataclass
class Trajectory:
    """One rollout of one question: its turns, the conversation as the chat template reads it, how
    it ended, its reward and its group-relative ``advantage``."""

    example: SearchExample
    question_index: int
    group_index: int
    messages: list[Message]
    turns: list[Turn] = field(default_factory=list)
    next_prompt_tokens: list[int] | None = None
    whole_tokens: int = 0  # its length so far: the first prompt and every turn's new tokens (core.context)
    folds: int = 0  # how often its context folded (--context fold)
    final_text: str = ""
    termination: Termination | None = None
    # Set by scoring (:func:`searchr1.core.reward.score_trajectories`); None until then, and for
    # a trajectory whose sampling failed (its reward is then the placeholder FORMAT_PENALTY).
    reward_result: RewardResult | None = None
    shaping: float = 0.0  # reward terms added to the answer's score (--length-reward: core.reward)
    verdict: Verdict | None = None  # the judge's, on its answer (--judge-weight: core.shaping)
    advantage: float = 0.0  # group-relative: its reward against its siblings' (core.advantage)
    excluded: Exclusion | None = None  # why it sends no datum although it has completion tokens

    def credit(self, advantage: float) -> None:
        """Trajectory-level credit: ``advantage`` is the trajectory's, and every turn carries it."""
        self.advantage = advantage
        for turn in self.turns:
            turn.advantage = advantage

    @property
    def calls(self) -> list[CallRecord]:
        """Every tool call of every turn, in the order they ran."""
        return [call for turn in self.turns for call in turn.calls]

    @property
    def done(self) -> bool:
        return self.termination is not None

    @property
    def sampler_error(self) -> bool:
        return self.termination == Termination.SAMPLER_ERROR

    @property
    def search_calls(self) -> int:
        return self.calls_of("search")

    def calls_of(self, tool: str) -> int:
        """Calls of ``tool`` the environment answered (refused calls are not counted)."""
        return sum(call.tool == tool and not call.refused for call in self.calls)

    @property
    def env_error(self) -> bool:
        """A tool or the judge failed (the policy is not to blame; a refused call is the policy's own)."""
        return self.judge_failed or any(not call.ok and not call.refused for call in self.calls)

    @property
    def judge_failed(self) -> bool:
        return self.verdict is not None and self.verdict.error is not None

    @property
    def score(self) -> RewardResult:
        """Every score of its answer (those of an unanswered trajectory until it is scored)."""
        return self.reward_result or NOT_ANSWERED

    @property
    def reward(self) -> float:
        """What it is trained on: its answer's score plus any reward terms (``shaping``)."""
        return self.score.reward + self.shaping

    def finish(self, reason: Termination, final_text: str | None = None) -> None:
        reason = Termination(reason)  # refuses an unknown reason
        if self.termination is not None:
            raise RuntimeError(
                f"trajectory q{self.question_index}/g{self.group_index} already ended "
                f"({self.termination}); cannot end it again as {reason}"
            )
        self.termination = reason
        if final_text is not None:
            self.final_text = final_text

    @property
    def total_tokens(self) -> int:
        """Length of the full token sequence (last prompt + last completion)."""
        if not self.turns:
            return 0
        last = self.turns[-1]
        return len(last.prompt_tokens) + len(last.completion_tokens)


# -- what the core asks of the outside world (a Hugging Face fast tokenizer, pytrio's clients) --


class Tokenizer(Protocol):
    """The tokenizer calls the core makes (``transformers``' fast tokenizers have them all)."""

    eos_token: str | None

    def apply_chat_template(self, conversation: list[Message], *, tools: list[JsonObject], tokenize: bool,
                            add_generation_prompt: bool, enable_thinking: bool,
                            return_dict: bool = ...) -> Any: ...  # the text, or token ids in some shape
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...
    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str: ...
    def get_added_vocab(self) -> dict[str, int]: ...
    def __len__(self) -> int: ...


class SampledSequence(Protocol):
    """One sequence of a sampling response (pytrio's ``SampledSequence``)."""

    tokens: list[int]
    logprobs: list[float]
    text: str | None


class SamplingClient(Protocol):
    """pytrio's ``SamplingClient`` as the rollout and the KL penalty use it."""

    async def sample_async(self, prompt: ModelInput, num_samples: int = ..., sampling_params: SamplingParams = ...,
                           include_prompt_logprobs: bool = ..., return_text: bool = ...) -> SampleResponse: ...


class TrainingClient(Protocol):
    """pytrio's ``TrainingClient`` as the update, the checkpoints and the samplers use it."""

    async def forward_backward_async(self, data: list[Datum], loss_fn: str = ...,
                                     loss_fn_config: dict[str, object] | None = ...) -> APIFuture[ForwardBackwardOutput]: ...
    async def forward_async(self, data: list[Datum], loss_fn: str = ...,
                            loss_fn_config: dict[str, object] | None = ...) -> APIFuture[ForwardBackwardOutput]: ...
    async def optim_step_async(self, adam_params: AdamParams) -> APIFuture[OptimStepResponse]: ...
    async def save_state_async(self, name: str, ttl_seconds: int | None = ...,
                               overwrite: bool = ...) -> APIFuture[SaveWeightsResponse]: ...
    async def save_weights_for_sampler_async(self, name: str,
                                             ttl_seconds: int | None = ...) -> APIFuture[SaveWeightsForSamplerResponse]: ...
    async def save_weights_and_get_sampling_client_async(self) -> SamplingClient: ...
    async def create_sampling_client_async(self, model_path: str) -> SamplingClient: ...


class ServiceClient(Protocol):
    """pytrio's ``ServiceClient``: where training and base-model sampling clients come from."""

    def create_lora_training_client(self, base_model: str, rank: int = ..., seed: int | None = ..., train_mlp: bool = ...,
                                    train_attn: bool = ..., train_unembed: bool = ...) -> TrainingClient: ...
    def create_training_client_from_state_with_optimizer(self, path: str) -> TrainingClient: ...
    async def create_sampling_client_async(self, *, base_model: str) -> SamplingClient: ...
