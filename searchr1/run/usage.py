"""What a run used: tokens, requests and saves, counted from what was sent and received.

One :class:`Usage` per unit of work (a batch's rollout, a step's update, a whole run), added
together with :meth:`Usage.add` (:class:`searchr1.core.types.Counts`: field by field, the
per-backend and per-tool tables key by key). Every metrics line carries the step's usage as
``usage/<kind>`` and the run's running total as ``usage/total_<kind>`` (:func:`usage_metrics`); a
resumed run starts its totals from the last line before its first step (:func:`totals_before`), so a
resumed run's totals equal an uninterrupted run's.

Kinds (``usage/...``):

- ``sample_requests``, ``sample_prompt_tokens``, ``sample_generated_tokens``: the rollout's
  sampling requests that were answered; a request's prompt counts once whatever its
  ``num_samples``, every returned sequence's tokens count as generated.
- ``train_tokens``: tokens sent to ``forward_backward`` (the datums' model inputs).
- ``forward_backward_calls``, ``optim_steps``: training calls.
- ``forward_calls``, ``forward_tokens``: ``--correction``'s ``forward`` of the step's datums (the
  learner's logprobs before the update); only a run that makes them carries them.
- ``kl_requests``, ``kl_prompt_tokens``, ``kl_generated_tokens``: the base model's
  prompt-logprob requests of ``--kl-coef`` (each asks for one generated token too).
- ``weight_saves`` (sampler weights: each sampler, counted with the first batch that samples on
  it, and each checkpoint's weights, counted with the step it follows), ``state_saves`` (each
  checkpoint's optimizer state).
- Search, per backend ``<b>``: ``search_<b>_calls`` (calls the rollout made),
  ``search_<b>_requests`` (calls sent to the service: neither the cache nor another call's
  request answered them; that request may be in flight, and offline, where the backend
  remembers every answer of the run, it may also have finished), and the backend's billing units:
  DeepSeek ``search_deepseek_input_tokens``, ``..._cache_read_input_tokens``,
  ``..._output_tokens``, ``..._web_searches`` as its API reports them (failed attempts
  included); Zhihu ``search_zhihu_quota_units`` (one per answered request); Wikipedia
  ``search_wikipedia_http_requests`` (every attempt, retries included).
- Each declared tool other than search ``<t>`` (``--tools``), named by its declaration:
  ``tool_<t>_calls`` (calls that reached its backend: a refused call never does),
  ``tool_<t>_requests`` and ``tool_<t>_http_requests`` (calls sent to a service, and every attempt),
  and ``tool_<t>_<unit>s`` (calls answered, counted in the unit the tool declares: ``open_page``
  counts ``pages``).
- The judge of ``--judge-weight``, per service ``<j>`` (``pytrio``: the twin or a PyTRIO model;
  ``deepseek``): ``judge_<j>_calls`` (answers judged), ``judge_<j>_requests`` (those the cache did
  not answer), ``judge_<j>_prompt_tokens`` and ``judge_<j>_generated_tokens`` (the requests' tokens,
  as sampled or as DeepSeek reports them). A run without a judge has none of these keys; they are
  priced like search (``[judge.<j>.per_million_tokens]``) and not model tokens of ``--budget-tokens``.

The work of off-policy batches rolling out ahead of a stop is dropped with them and redone on
resume; it is counted once, in the step that trains it. Likewise the sampler a stopping step
already saved for the next one is saved again by the resumed run and counted there, once. So a
run's totals are what an uninterrupted run would use; a stopped and resumed run made that
dropped work too (the service's bill, like the twin's own count, has it).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Protocol, TypedDict, TypeVar

from searchr1.core.tools import DECLARED, ToolBackend, ToolCall
from searchr1.core.types import Counts, SamplingClient, SearchResult

if TYPE_CHECKING:
    from pytrio.types import ModelInput, SampleResponse, SamplingParams

PREFIX = "usage/"
_NESTED = ("search", "tools", "judge")  # the per-backend, per-tool and per-judge tables of Usage
_ONLY_WHEN_MADE = ("forward_calls", "forward_tokens")  # a run without --correction writes none
TOTAL = "total_"


class Billing(enum.Enum):
    """The unit a search backend bills by (beyond the request itself)."""

    TOKENS = "tokens"  # DeepSeek: input and output tokens of the search model
    QUOTA = "quota"  # Zhihu: daily quota units per key
    HTTP_REQUESTS = "http_requests"  # Wikipedia: every HTTP request counts against the rate limits
    NONE = "none"  # local BM25, a retriever of one's own


BACKEND_BILLING = {"deepseek": Billing.TOKENS, "zhihu": Billing.QUOTA, "wikipedia": Billing.HTTP_REQUESTS}


CountsT = TypeVar("CountsT", bound=Counts)


class CountsTable(dict[str, CountsT]):
    """Counts by name (a search backend's, a tool's) that add up key by key: ``a + b`` is a new
    table holding, for each name in either, the sum of their counts (a missing one is zero)."""

    def __add__(self, other: Mapping[str, CountsT]) -> CountsTable[CountsT]:
        out: CountsTable[CountsT] = CountsTable()
        for table in (self, other):
            for name, counts in table.items():
                out.setdefault(name, type(counts)()).add(counts)
        return out


@dataclass
class SearchUsage(Counts):
    """One backend's searches."""

    calls: int = 0
    requests: int = 0
    input_tokens: int = 0
    cache_read_input_tokens: int = 0
    output_tokens: int = 0
    web_searches: int = 0
    quota_units: int = 0
    http_requests: int = 0

    def kinds(self, backend: str) -> dict[str, int]:
        """``search_<backend>_<unit>`` -> count, the units ``backend`` bills by."""
        out = {"calls": self.calls, "requests": self.requests}
        billing = BACKEND_BILLING.get(backend, Billing.NONE)
        if billing is Billing.TOKENS:
            out.update(input_tokens=self.input_tokens, cache_read_input_tokens=self.cache_read_input_tokens,
                       output_tokens=self.output_tokens, web_searches=self.web_searches)
        elif billing is Billing.QUOTA:
            out["quota_units"] = self.quota_units
        elif billing is Billing.HTTP_REQUESTS:
            out["http_requests"] = self.http_requests
        return {f"search_{backend}_{unit}": value for unit, value in out.items()}


@dataclass
class ToolUsage(Counts):
    """One declared tool's calls (search has :class:`SearchUsage`, per backend)."""

    calls: int = 0
    requests: int = 0
    http_requests: int = 0
    units: int = 0  # answered calls, in the unit the tool declares

    def kinds(self, tool: str) -> dict[str, int]:
        """``tool_<tool>_<count>`` -> count; ``units`` is named by the declared unit (``pages``)."""
        return {f"tool_{tool}_calls": self.calls, f"tool_{tool}_requests": self.requests,
                f"tool_{tool}_http_requests": self.http_requests, f"tool_{tool}_{unit_kind(tool)}": self.units}


JUDGE_SERVICES = ("pytrio", "deepseek")  # who answers a judge: the twin or a PyTRIO model, DeepSeek's API


@dataclass
class JudgeUsage(Counts):
    """The judge's work (``--judge-weight``): answers judged, requests sent and their tokens."""

    calls: int = 0
    requests: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0

    def kinds(self, service: str) -> dict[str, int]:
        """``judge_<service>_<count>`` -> count."""
        return {f"judge_{service}_{name}": value for name, value in vars(self).items()}


def unit_kind(tool: str) -> str:
    """The usage name of what one answered call of ``tool`` counts as: its declared unit, plural."""
    spec = DECLARED.get(tool)
    return f"{spec.unit}s" if spec is not None else "units"


@dataclass
class Usage(Counts):
    """Counts of one unit of work; :meth:`as_metrics` names them ``usage/<kind>``."""

    sample_requests: int = 0
    sample_prompt_tokens: int = 0
    sample_generated_tokens: int = 0
    train_tokens: int = 0
    forward_backward_calls: int = 0
    optim_steps: int = 0
    forward_calls: int = 0
    forward_tokens: int = 0
    kl_requests: int = 0
    kl_prompt_tokens: int = 0
    kl_generated_tokens: int = 0
    weight_saves: int = 0
    state_saves: int = 0
    search: CountsTable[SearchUsage] = field(default_factory=CountsTable)
    tools: CountsTable[ToolUsage] = field(default_factory=CountsTable)
    judge: CountsTable[JudgeUsage] = field(default_factory=CountsTable)

    def __post_init__(self) -> None:
        self.search, self.tools = CountsTable(self.search), CountsTable(self.tools)  # a plain dict given
        self.judge = CountsTable(self.judge)

    def searched(self, backend: str) -> SearchUsage:
        return self.search.setdefault(backend, SearchUsage())

    def map(self, change: Callable[[float], float]) -> Usage:
        """A new usage with ``change`` applied to every count (a mean step, a projection): its counts
        may be fractions, so they are set field by field rather than passed as the ints they declare."""
        out = _mapped(Usage(), self, change, skip=_NESTED)
        for backend, searched in self.search.items():
            out.search[backend] = _mapped(SearchUsage(), searched, change)
        for tool, used in self.tools.items():
            out.tools[tool] = _mapped(ToolUsage(), used, change)
        for service, judged in self.judge.items():
            out.judge[service] = _mapped(JudgeUsage(), judged, change)
        return out

    def tool(self, name: str) -> ToolUsage:
        return self.tools.setdefault(name, ToolUsage())

    def kinds(self) -> dict[str, int]:
        """Every count by kind name (search kinds per backend, tool kinds per tool)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)
               if f.name not in _NESTED and (f.name not in _ONLY_WHEN_MADE or getattr(self, f.name))}
        for backend in sorted(self.search):
            out.update(self.search[backend].kinds(backend))
        for tool in sorted(self.tools):
            out.update(self.tools[tool].kinds(tool))
        for service in sorted(self.judge):
            out.update(self.judge[service].kinds(service))
        return out

    def as_metrics(self, prefix: str = "") -> dict[str, float]:
        """``usage/<prefix><kind>`` -> count, as a metrics line carries them."""
        return {f"{PREFIX}{prefix}{kind}": float(value) for kind, value in self.kinds().items()}

    @property
    def tokens(self) -> int:
        """Every model token this usage paid for (sampled, trained, KL); the unit of ``--budget-tokens``."""
        return (self.sample_prompt_tokens + self.sample_generated_tokens + self.train_tokens
                + self.forward_tokens + self.kl_prompt_tokens + self.kl_generated_tokens)

    @classmethod
    def from_kinds(cls, kinds: Mapping[str, float]) -> Usage:
        """The inverse of :meth:`kinds` (a metrics line's counts, without the prefix)."""
        usage = cls()
        plain = {f.name for f in fields(cls) if f.name not in _NESTED}
        units = {f.name for f in fields(SearchUsage)}
        for kind, value in kinds.items():
            if kind in plain:
                setattr(usage, kind, int(value))
            elif kind.startswith("search_"):
                backend, unit = _split_search_kind(kind[len("search_"):], units)
                if backend:
                    setattr(usage.searched(backend), unit, int(value))
            elif kind.startswith("tool_"):
                tool, count = _split_tool_kind(kind[len("tool_"):])
                if tool:
                    setattr(usage.tool(tool), count, int(value))
            elif kind.startswith("judge_"):
                service, count = _split_search_kind(kind[len("judge_"):], JUDGE_COUNTS)
                if service:
                    setattr(usage.judge.setdefault(service, JudgeUsage()), count, int(value))
        return usage

    @classmethod
    def from_metrics(cls, line: Mapping[str, object], *, total: bool = False) -> Usage:
        """The step's (or, with ``total``, the run's) usage recorded in one metrics line."""
        head = PREFIX + (TOTAL if total else "")
        kinds: dict[str, float] = {}
        for key, value in line.items():
            if not key.startswith(head) or not isinstance(value, (int, float)):
                continue
            kind = key[len(head):]
            if not total and kind.startswith(TOTAL):
                continue
            kinds[kind] = value
        return cls.from_kinds(kinds)


JUDGE_COUNTS = {f.name for f in fields(JudgeUsage)}
CountsU = TypeVar("CountsU", bound=Counts)


def _mapped(out: CountsU, counts: CountsU, change: Callable[[float], float], skip: tuple[str, ...] = ()) -> CountsU:
    """``out`` holding ``change`` of every count of ``counts`` (the fields not in ``skip``)."""
    for name, value in vars(counts).items():
        if name not in skip:
            setattr(out, name, change(value))
    return out


def _split_search_kind(rest: str, units: set[str]) -> tuple[str, str]:
    """``deepseek_input_tokens`` -> (``deepseek``, ``input_tokens``); ("", "") if no unit matches."""
    for unit in sorted(units, key=len, reverse=True):
        if rest.endswith("_" + unit):
            return rest[: -len(unit) - 1], unit
    return "", ""


def _split_tool_kind(rest: str) -> tuple[str, str]:
    """``open_page_pages`` -> (``open_page``, ``units``); ("", "") for a kind no count of
    :class:`ToolUsage` names. A tool name may hold underscores, so the count is matched at the end."""
    for count in ("http_requests", "requests", "calls"):
        if rest.endswith("_" + count):
            return rest[: -len(count) - 1], count
    for tool in DECLARED:
        if rest == f"{tool}_{unit_kind(tool)}":
            return tool, "units"
    return "", ""



_SERVICE_SEARCH_UNITS = ("requests", "input_tokens", "cache_read_input_tokens", "output_tokens", "web_searches",
                         "quota_units", "http_requests")
_SERVICE_SEARCH_KEY = re.compile(r"^(usage|cost)/(total_)?(search_.+_(" + "|".join(_SERVICE_SEARCH_UNITS) + ")"
                                 r"|tool_.+_(requests|http_requests)|judge_.+_(requests|prompt_tokens|generated_tokens))$")


def depends_on_timing(key: str) -> bool:
    """Whether a ``usage/``/``cost/`` key counts what reached the search service, a tool's or the
    judge (its requests and what it billed, and the cost sums that include them): these depend on
    which answers the backend or the judge's cache already had. Live, that is the order concurrent
    searches ran in (single-flight merges identical queries only while one is in flight) and the
    persistent caches; offline, where the backend remembers every answer of the run, a resumed run
    starts remembering afresh, so it may ask again what the stopped one had asked. Two offline runs
    with the same seed agree on these keys too, unless they share a judge's cache file."""
    return bool(_SERVICE_SEARCH_KEY.match(key)) or key in ("cost/step", "cost/total")


def usage_metrics(step: Usage, total: Usage) -> dict[str, float]:
    """A metrics line's ``usage/<kind>`` (the step) and ``usage/total_<kind>`` (the run so far),
    with ``usage/model_tokens`` and ``usage/total_model_tokens`` (:attr:`Usage.tokens`)."""
    return {**step.as_metrics(), f"{PREFIX}model_tokens": float(step.tokens),
            **total.as_metrics(TOTAL), f"{PREFIX}{TOTAL}model_tokens": float(total.tokens)}


def question_usage_metrics(records: Iterable[Mapping[str, object]]) -> tuple[Usage, int, dict[str, float]]:
    """An evaluation's usage from its records (each question's usage rides on one of its records):
    the total, how many questions it covers, and ``usage/total_<kind>`` and ``usage/<kind>_per_question``."""
    total, questions = Usage(), 0
    for record in records:
        kinds = record.get("usage")
        if isinstance(kinds, Mapping):
            total.add(Usage.from_kinds(kinds))
            questions += 1
    metrics = {f"{PREFIX}{TOTAL}{kind}": float(value) for kind, value in total.kinds().items()}
    metrics[f"{PREFIX}{TOTAL}model_tokens"] = float(total.tokens)
    per = 1.0 / questions if questions else 0.0
    metrics.update({f"{PREFIX}{kind}_per_question": value * per for kind, value in total.kinds().items()})
    metrics[f"{PREFIX}model_tokens_per_question"] = total.tokens * per
    return total, questions, metrics


class SentDatum(Protocol):
    """A datum as the update sent it (:class:`searchr1.core.datum.TrainingDatum`): its token count."""

    @property
    def num_tokens(self) -> int: ...


def count_update(usage: Usage, datums: Sequence[SentDatum], forward_backward_calls: int, *,
                 forward_calls: int = 0) -> None:
    """A step's update: the datums' tokens sent to forward_backward, its calls and the optim_step;
    ``forward_calls``: ``--correction``'s forward of the same datums before it."""
    usage.train_tokens += sum(int(d.num_tokens) for d in datums)
    usage.forward_calls += forward_calls
    usage.forward_tokens += forward_calls * sum(int(d.num_tokens) for d in datums)
    usage.forward_backward_calls += forward_backward_calls
    usage.optim_steps += int(bool(datums))


def count_checkpoint(usage: Usage) -> None:
    """One checkpoint: the optimizer state and the sampler weights."""
    usage.state_saves += 1
    usage.weight_saves += 1


def line_step(line: Mapping[str, object], default: int | None = None) -> int:
    """A metrics line's ``step`` as :func:`int` reads it (``default`` when the line has none; without a
    default, a line without one is a KeyError)."""
    step = line["step"] if default is None else line.get("step", default)
    if not isinstance(step, int | float | str):
        raise TypeError(f"step: expected a number, got {type(step).__name__}")
    return int(step)


def totals_before(lines: Iterable[Mapping[str, object]], step: int) -> Usage:
    """The run's totals after the steps before ``step``: the last such metrics line's
    ``usage/total_*`` (zero when there is none)."""
    last: Mapping[str, object] | None = None
    for line in lines:
        if line_step(line, -1) < step and (last is None or line_step(line) >= line_step(last)):
            last = line
    return Usage() if last is None else Usage.from_metrics(last, total=True)


def step_means(lines: Iterable[Mapping[str, object]]) -> tuple[int, Usage]:
    """How many metrics lines carry usage, and the sum of their step usage."""
    count, summed = 0, Usage()
    for line in lines:
        if any(key.startswith(PREFIX) for key in line):
            count += 1
            summed.add(Usage.from_metrics(line))
    return count, summed


# -- counting hooks ----------------------------------------------------------------------------


def _prompt_length(prompt: ModelInput) -> int:
    length = getattr(prompt, "length", None)
    if isinstance(length, int):
        return length
    return len(prompt.to_ints())


def count_sample(usage: Usage, prompt: ModelInput, response: SampleResponse, *, kl: bool = False) -> None:
    """One answered sampling request: its prompt once, the tokens of every returned sequence."""
    generated = sum(len(sequence.tokens) for sequence in response.sequences)
    if kl:
        usage.kl_requests += 1
        usage.kl_prompt_tokens += _prompt_length(prompt)
        usage.kl_generated_tokens += generated
    else:
        usage.sample_requests += 1
        usage.sample_prompt_tokens += _prompt_length(prompt)
        usage.sample_generated_tokens += generated


class SampleOptions(TypedDict, total=False):
    """The options of ``sample_async`` besides the prompt (:class:`searchr1.core.types.SamplingClient`)."""

    num_samples: int
    sampling_params: SamplingParams
    include_prompt_logprobs: bool
    return_text: bool


class MeteredSampler:
    """A sampling client whose answered ``sample_async`` requests are counted into ``usage``
    (everything else is the client's own). Only the options a caller gave are passed on, so the
    client's own defaults hold for the others."""

    def __init__(self, sampler: SamplingClient, usage: Usage, *, kl: bool = False) -> None:
        self._sampler = sampler
        self._usage = usage
        self._kl = kl

    async def sample_async(self, prompt: ModelInput, num_samples: int | None = None,
                           sampling_params: SamplingParams | None = None, include_prompt_logprobs: bool | None = None,
                           return_text: bool | None = None) -> SampleResponse:
        options: SampleOptions = {}
        if num_samples is not None:
            options["num_samples"] = num_samples
        if sampling_params is not None:
            options["sampling_params"] = sampling_params
        if include_prompt_logprobs is not None:
            options["include_prompt_logprobs"] = include_prompt_logprobs
        if return_text is not None:
            options["return_text"] = return_text
        response = await self._sampler.sample_async(prompt=prompt, **options)
        count_sample(self._usage, prompt, response, kl=self._kl)
        return response

    def __getattr__(self, name: str) -> object:
        return getattr(self._sampler, name)


class Searcher(Protocol):
    """What :class:`MeteredSearch` counts the calls of: a search backend (:class:`searchr1.search.tool.SearchBackend`;
    its ``name``, when it has one, names its counts)."""

    async def search(self, query: str) -> SearchResult: ...


class MeteredSearch:
    """A search backend whose calls are counted into ``usage`` under the backend's name."""

    def __init__(self, backend: Searcher, usage: Usage) -> None:
        self._backend = backend
        self._usage = usage
        self.name: str = getattr(backend, "name", type(backend).__name__)

    async def search(self, query: str) -> SearchResult:
        result = await self._backend.search(query)
        count_search(self._usage.searched(self.name), result)
        return result

    def __getattr__(self, name: str) -> object:
        return getattr(self._backend, name)


class MeteredTool:
    """A declared tool's backend whose calls are counted into ``usage`` under the tool's name."""

    def __init__(self, tool: str, backend: ToolBackend, usage: Usage) -> None:
        self._tool = tool
        self._backend = backend
        self._usage = usage
        usage.tool(tool)  # a tool offered but never called counts its zeros

    async def call(self, call: ToolCall) -> SearchResult:
        result = await self._backend.call(call)
        used = self._usage.tool(self._tool)
        used.calls += 1
        attempts = int(getattr(result, "attempts", 0) or 0)
        used.requests += int(attempts > 0)
        used.http_requests += attempts
        used.units += int(bool(getattr(result, "ok", False)))
        return result

    def __getattr__(self, name: str) -> object:
        return getattr(self._backend, name)


def metered_tools(backends: Mapping[str, ToolBackend] | None, usage: Usage) -> dict[str, MeteredTool]:
    """Every tool backend of ``backends`` counted into ``usage``."""
    return {name: MeteredTool(name, backend, usage) for name, backend in (backends or {}).items()}


def count_search(searched: SearchUsage, result: SearchResult) -> None:
    """One search call: a request when the service was asked, and what the service billed."""
    searched.calls += 1
    attempts = int(getattr(result, "attempts", 0) or 0)
    if not attempts:
        return  # the cache, a shared in-flight request or a local refusal answered it
    searched.requests += 1
    searched.http_requests += attempts
    searched.quota_units += int(bool(getattr(result, "ok", False)))
    billed = getattr(result, "usage", None)
    if billed is not None:
        searched.input_tokens += billed.input_tokens
        searched.cache_read_input_tokens += billed.cache_read_input_tokens
        searched.output_tokens += billed.output_tokens
        searched.web_searches += billed.web_search_requests
