"""Checks a run makes before anything is paid for.

A first live run can fail in ways that only show up after its rollouts were sampled and
billed: a trajectory budget longer than the server accepts (``training_sample_too_long``
after the rollout), a tokenizer on the service that is not the one our token stitching was
built with, a tokenizer download that needs a network the machine does not have. Each check
here runs before the first sampling request and either passes, or stops the run with one
line that names the numbers, the flag and the fix.

Pure parts (``limits_from_capabilities``, ``fit_trajectory_budget``, ``tokenizer_differences``)
take plain values; ``read_server_limits`` and ``load_service_tokenizer`` are the two calls to
the service.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence, Sized
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Protocol
from searchr1.core.errors import UserError

from searchr1.core.observation.tokens import TemplateBoundaries
from searchr1.core.protocol import (
    TemplateDriftError,
    TurnKind,
    assistant_message,
    build_next_prompt,
    build_prompt,
    initial_messages,
    parse_assistant,
    template_boundaries,
    tool_message,
)
from searchr1.core.types import Tokenizer
from searchr1.basics.json_types import JsonObject
from searchr1.runtime.tokenizer import GENERATION_PROMPTS

if TYPE_CHECKING:
    from pytrio import ServiceClient, TrainingClient
    from pytrio.types.server_capabilities import GetServerCapabilitiesResponse, ModelOperationCapabilities

# Special tokens the protocol and the stitching rely on, looked up by name on both sides.
PROTOCOL_TOKENS = (
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_call>",
    "<tool_response>", "</tool_response>", "<think>", "</think>",
)
# Text whose encoding must agree (plain words, the no-think generation header, a tool call).
PROBE_TEXTS = (
    "Which country was the author of The Little Prince from?",
    GENERATION_PROMPTS[False],
    "<tool_call>\n<function=search>\n<parameter=query>\nSeine\n</parameter>\n</function>\n</tool_call>",
)


class ComparedTokenizer(Protocol):
    """What comparing two tokenizers reads of each (ours, and the one pytrio loads for the service)."""

    def __len__(self) -> int: ...
    def convert_tokens_to_ids(self, tokens: str) -> int | list[int]: ...
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...


class PreflightError(UserError, RuntimeError):
    """The run cannot finish a step as configured; the message says why and what to change."""


@dataclass(frozen=True)
class OperationLimits:
    available: bool
    max_batch_size: int | None
    max_tokens_per_request: int | None
    max_seq_len: int | None


@dataclass(frozen=True)
class ServerLimits:
    """What the service reports for one model (``None``: no known limit)."""

    model: str
    max_context_length: int | None
    training: OperationLimits
    sampling: OperationLimits

    def to_json(self) -> JsonObject:
        return asdict(self)


def limits_from_capabilities(capabilities: GetServerCapabilitiesResponse, base_model: str) -> ServerLimits:
    """The limits of ``base_model`` in a ``GetServerCapabilitiesResponse``."""
    models = list(getattr(capabilities, "supported_models", []) or [])
    for model in models:
        if model.model_name == base_model:
            def operation(value: ModelOperationCapabilities) -> OperationLimits:
                return OperationLimits(bool(value.available), value.max_batch_size,
                                       value.max_tokens_per_request, value.max_seq_len)

            return ServerLimits(base_model, model.max_context_length, operation(model.training),
                                operation(model.sampling))
    names = ", ".join(sorted(m.model_name for m in models)) or "none"
    raise PreflightError(f"--base-model {base_model!r} is not offered by this PyTRIO service (it offers: {names})")


def _bounds(limits: ServerLimits) -> list[tuple[int, str]]:
    """Every limit a whole trajectory must respect, with what to call it in a message."""
    named = [
        (limits.training.max_seq_len, "training max_seq_len"),
        (limits.training.max_tokens_per_request, "training max_tokens_per_request"),
        (limits.sampling.max_seq_len, "sampling max_seq_len"),
        (limits.max_context_length, "the model's context length"),
    ]
    return [(value, name) for value, name in named if value is not None]


@dataclass(frozen=True)
class BudgetFit:
    max_trajectory_tokens: int
    warnings: tuple[str, ...]


def fit_trajectory_budget(limits: ServerLimits, max_trajectory_tokens: int, *, clamp: bool,
                          group_size: int, flag: str = "--max-trajectory-tokens") -> BudgetFit:
    """Check (or, with ``clamp``, lower) one context's budget against the server limits: the
    whole trajectory's (``--max-trajectory-tokens``), or with ``--context fold`` the window
    (``flag`` ``--context-window``).

    A context is trained as one datum of up to ``max_trajectory_tokens - 1`` tokens and is
    sampled with prompts up to that length, so it must fit every training and sampling bound;
    a budget that does not would be rejected (``training_sample_too_long``) only after its
    rollout was paid for.
    """
    if not limits.training.available:
        raise PreflightError(f"{limits.model} is not available for training on this service right now")
    if not limits.sampling.available:
        raise PreflightError(f"{limits.model} is not available for sampling on this service right now")
    warnings: list[str] = []
    budget = max_trajectory_tokens
    exceeded = [(value, name) for value, name in _bounds(limits) if budget > value]
    if exceeded:
        value, name = min(exceeded)
        if not clamp:
            raise PreflightError(
                f"{flag} {budget} exceeds the server's {name} ({value}) for {limits.model}; "
                f"lower it to {value} or pass --clamp-to-server-limits")
        warnings.append(f"{flag} lowered from {budget} to {value} ({name} of {limits.model})")
        budget = value
    batch = limits.sampling.max_batch_size
    if batch is not None and group_size > batch:
        warnings.append(f"--group-size {group_size} is larger than the sampler's max_batch_size ({batch}); "
                        "the first turn asks for all of a group's samples in one request")
    return BudgetFit(budget, tuple(warnings))


def tokenizer_differences(ours: ComparedTokenizer, theirs: ComparedTokenizer) -> list[str]:
    """How the service's tokenizer differs from ours in what the protocol relies on: the
    vocabulary size (PyTRIO bounds token ids by it), the special tokens looked up by name,
    and the encoding of a few probe texts."""
    problems = []
    if len(ours) != len(theirs):
        problems.append(f"vocabulary size {len(theirs)} (ours {len(ours)})")
    for token in PROTOCOL_TOKENS:
        mine, other = ours.convert_tokens_to_ids(token), theirs.convert_tokens_to_ids(token)
        if mine != other:
            problems.append(f"{token} is id {other} (ours {mine})")
    for text in PROBE_TEXTS:
        if list(ours.encode(text, add_special_tokens=False)) != list(theirs.encode(text, add_special_tokens=False)):
            problems.append(f"{text[:30]!r} encodes differently")
    return problems


def read_server_limits(service: ServiceClient, base_model: str) -> ServerLimits:
    """Ask the service for ``base_model``'s limits (one control call, nothing billed)."""
    return limits_from_capabilities(service.get_server_capabilities(), base_model)


def load_service_tokenizer(training_client: TrainingClient) -> ComparedTokenizer:
    """The tokenizer PyTRIO will load inside the first ``forward_backward``, loaded now.

    pytrio fetches it from ModelScope (its local cache first); without a network and without a
    filled cache that fails with a ModelScope error, not a PyTrioError. Here it becomes one
    line, before a single sample is paid for."""
    try:
        return training_client.get_tokenizer()
    except Exception as error:  # noqa: BLE001 - any failure of the SDK's loader is reported the same way
        model = getattr(training_client, "model_id", "the model")
        raise PreflightError(
            f"PyTRIO could not load the tokenizer of {model} from ModelScope ({type(error).__name__}: "
            f"{str(error).splitlines()[0][:160] if str(error) else 'no message'}); connect this machine to "
            "modelscope.cn once, or fill the ModelScope cache ($MODELSCOPE_CACHE) from a machine that can"
        ) from None


def hand_over_vocabulary_size(training_client: TrainingClient, theirs: Sized) -> None:
    """pytrio loads the tokenizer a second time inside the first ``forward_backward``, only for its
    length (``TrainingClient._tokenizer_vocab_size``, a ``functools.cached_property``): about a
    second on every start. The length of the tokenizer just loaded through the same SDK call
    fills that cache, as the property itself would; an SDK without the property is left alone."""
    if isinstance(getattr(type(training_client), "_tokenizer_vocab_size", None), functools.cached_property):
        training_client.__dict__.setdefault("_tokenizer_vocab_size", len(theirs))


def check_service_tokenizer(ours: ComparedTokenizer, training_client: TrainingClient) -> None:
    theirs = load_service_tokenizer(training_client)
    problems = tokenizer_differences(ours, theirs)
    if problems:
        raise PreflightError(
            "the service's tokenizer for " + str(getattr(training_client, "model_id", "the model"))
            + " differs from the local Qwen3.5 tokenizer the protocol was built with: " + "; ".join(problems))
    hand_over_vocabulary_size(training_client, theirs)


def describe(limits: ServerLimits) -> Sequence[str]:
    """Human lines for ``--preflight-only``."""
    def fmt(op: OperationLimits) -> str:
        return (f"available={op.available} max_seq_len={op.max_seq_len} "
                f"max_tokens_per_request={op.max_tokens_per_request} max_batch_size={op.max_batch_size}")

    return [f"model {limits.model}: context length {limits.max_context_length}",
            f"  training: {fmt(limits.training)}", f"  sampling: {fmt(limits.sampling)}"]


PROBE_REASONING = "The question names a book; I need its author first."


def check_template(tokenizer: Tokenizer, *, thinking: bool = False) -> TemplateBoundaries:
    """Start-up self-check of the stitching invariants on a probe conversation, rendered as the run
    renders (``thinking``: each probe turn then reasons first, and the template must keep it).

    A live run with an unexpected template fails here in seconds, with the failing check
    named, instead of after a paid training step.
    """
    messages = initial_messages("Which country was the author of The Little Prince from?")
    prompt = build_prompt(tokenizer, messages, thinking=thinking)
    generation_prompt = tokenizer.encode(GENERATION_PROMPTS[thinking], add_special_tokens=False)
    if prompt[-len(generation_prompt):] != generation_prompt:
        block = "an open think block; was enable_thinking=True" if thinking else \
            "an empty think block; was enable_thinking=False"
        raise TemplateDriftError(f"the generation prompt does not end with {block} ignored?")
    boundaries = template_boundaries(tokenizer, thinking=thinking)
    turns = [
        "<tool_call>\n<function=search>\n<parameter=query>\nThe Little Prince author\n</parameter>\n</function>\n"
        "</tool_call>",
        "Now his nationality.\n\n<tool_call>\n<function=search>\n<parameter=query>\nAntoine de Saint-Exupery "
        "nationality\n</parameter>\n</function>\n</tool_call>",
    ]
    observations = ["[1] Title: The Little Prince\n    Content: A novella by Antoine de Saint-Exupery.",
                    "He was a French writer."]
    tokens = prompt
    for index, (said, observation) in enumerate(zip(turns, observations), start=1):
        text = f"{PROBE_REASONING}\n</think>\n\n{said}" if thinking else said
        parsed = parse_assistant(text, thinking=thinking)
        if parsed.kind != TurnKind.TOOL:
            raise TemplateDriftError(f"probe tool call {index} does not parse as a search call")
        completion = tokenizer.encode(text, add_special_tokens=False) + list(boundaries.closing[:1])
        tool = tool_message(f"probe-{index}", observation)
        assistant = assistant_message(parsed.text, parsed.reasoning)
        tokens = build_next_prompt(tokenizer, messages, assistant, tokens, completion, tool, thinking=thinking)
        messages = messages + [assistant, tool]
    if tokens != build_prompt(tokenizer, messages, thinking=thinking):
        raise TemplateDriftError(
            "stitched tokens differ from a full render of the same two-search conversation"
        )
    return boundaries

