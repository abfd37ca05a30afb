"""An LLM judge (``eval --judge MODEL``): does the prediction mean the same as a gold answer?
Reported as ``judge/...`` beside EM, F1 and cover EM; in training, mixed into the reward with
``train --judge MODEL --judge-weight W`` (:mod:`searchr1.training.judging`).

Who judges:

* ``twin`` (offline only): the offline twin, through the real pytrio sampling client. The twin
  recognises the judge prompt and answers by a fixed rule (:mod:`searchr1.twin.judge`), so an
  offline judgement is the twin's, not a model's;
* ``deepseek-…`` (e.g. ``deepseek-chat``): the DeepSeek chat API with ``DEEPSEEK_API_KEY``;
  ``--judge-cassette`` replays its answers offline (:class:`~searchr1.search.replay.CassetteTransport`)
  or, live, records them (no key is ever written);
* any other name: that PyTRIO model, sampled greedily with the prompt below.

The prompt (version JUDGE_PROMPT_VERSION) asks for one word, ``yes`` or ``no``; a reply whose
first word is neither counts as ``no`` and is kept verbatim. A trajectory that gave no answer is
judged ``no`` without asking. Judgements are cached in a JSONL file keyed by the sha256 of
(question, gold answers, prediction, judge model, prompt version): a rerun, a resumed eval or
another eval of the same predictions asks nothing twice.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from searchr1.core.reward import ANSWER_PATTERN
from searchr1.core.types import SamplingClient
from searchr1.basics.json_types import JsonObject, as_list
from searchr1.run.usage import JudgeUsage

if TYPE_CHECKING:
    import httpx

    from searchr1.basics.secrets import Secret

JUDGE_PROMPT_VERSION = 1
JUDGE_PROMPT_HEADER = "You are judging a question-answering system."
JUDGE_PROMPT = (
    JUDGE_PROMPT_HEADER + " Decide whether the PREDICTION means the same as any of the GOLD "
    "ANSWERS for the QUESTION: the same entity, number, date or fact, allowing other wording, "
    "abbreviations, extra qualifying detail and spelling variants. A prediction that is vaguer, names "
    "another thing, or hedges between several is not the same.\n"
    "Reply with one word: yes or no.\n\n"
    "QUESTION: {question}\n"
    "GOLD ANSWERS: {gold}\n"
    "PREDICTION: {prediction}\n"
)
TWIN_JUDGE = "twin"
DEEPSEEK_PREFIX = "deepseek-"
DEEPSEEK_URL = "https://api.deepseek.com/chat/completions"
JUDGE_MAX_TOKENS = 8
DEFAULT_CACHE = Path("runs/judge-cache.jsonl")


def judge_prompt(question: str, gold: Sequence[str], prediction: str) -> str:
    return JUDGE_PROMPT.format(question=question.strip(), gold=json.dumps(list(gold), ensure_ascii=False),
                               prediction=prediction.strip())


def parse_verdict(reply: str) -> bool:
    """``yes`` (any case, any punctuation around it) as the first word; anything else is no."""
    words = re.findall(r"[A-Za-z]+", reply)
    return bool(words) and words[0].lower() == "yes"


def prediction_of(record: Mapping[str, object]) -> str | None:
    """The answer a trajectory record gave (its last ``Answer:`` line), or None."""
    if record.get("termination") != "answer":
        return None
    found = ANSWER_PATTERN.findall(str(record.get("final_text") or ""))
    return found[-1].strip() if found and found[-1].strip() else None


@dataclass(frozen=True)
class Judgement:
    correct: bool
    reply: str  # the judge's words ("" when nothing was asked)
    model: str
    prompt_version: int
    cached: bool = False
    asked: bool = True  # False: no answer to judge


def cache_key(question: str, gold: Sequence[str], prediction: str, model: str, version: int) -> str:
    payload = json.dumps([question, list(gold), prediction, model, version], ensure_ascii=False)
    return hashlib.sha256(payload.encode()).hexdigest()


class JudgeCache:
    """Judgements by :func:`cache_key`, in a JSONL file (appended and flushed as they come)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.entries: dict[str, JsonObject] = {}
        if path is not None and path.is_file():
            for line in path.read_text("utf-8").splitlines():
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a torn last line
                if isinstance(entry, dict) and isinstance(entry.get("key"), str):
                    self.entries[entry["key"]] = entry

    def get(self, key: str) -> JsonObject | None:
        return self.entries.get(key)

    def put(self, key: str, correct: bool, reply: str) -> None:
        entry: JsonObject = {"key": key, "correct": correct, "reply": reply}
        self.entries[key] = entry
        if self.path is not None:
            from searchr1.basics.fileio import append_text

            self.path.parent.mkdir(parents=True, exist_ok=True)
            append_text(self.path, json.dumps(entry, ensure_ascii=False) + "\n")


class JudgeBackend(Protocol):
    model: str
    service: str  # who answers, as usage names it (searchr1.run.usage.JUDGE_SERVICES)
    usage: JudgeUsage  # the requests it answered and their tokens

    async def ask(self, prompt: str) -> str: ...


class Judge:
    """Judges records with ``backend``, through ``cache``; at most ``concurrency`` asks at once."""

    def __init__(self, backend: JudgeBackend, cache: JudgeCache, *, concurrency: int = 8) -> None:
        self.backend = backend
        self.cache = cache
        self.model = backend.model
        self._slots = asyncio.Semaphore(concurrency)

    @property
    def config(self) -> dict[str, object]:
        return {"model": self.model, "prompt_version": JUDGE_PROMPT_VERSION}

    async def judge(self, question: str, gold: Sequence[str], prediction: str | None) -> Judgement:
        if prediction is None:
            return Judgement(False, "", self.model, JUDGE_PROMPT_VERSION, asked=False)
        key = cache_key(question, gold, prediction, self.model, JUDGE_PROMPT_VERSION)
        hit = self.cache.get(key)
        if hit is not None:
            return Judgement(bool(hit["correct"]), str(hit.get("reply", "")), self.model, JUDGE_PROMPT_VERSION,
                             cached=True)
        async with self._slots:
            reply = (await self.backend.ask(judge_prompt(question, gold, prediction))).strip()
        correct = parse_verdict(reply)
        self.cache.put(key, correct, reply)
        return Judgement(correct, reply, self.model, JUDGE_PROMPT_VERSION)

    def judged(self, record: Mapping[str, object]) -> bool:
        """Whether ``record`` already holds this judge's judgement."""
        held = record.get("judge")
        return (isinstance(held, Mapping) and held.get("model") == self.model
                and held.get("prompt_version") == JUDGE_PROMPT_VERSION)

    async def annotate(self, records: Sequence[MutableMapping[str, object]]) -> int:
        """Add ``record["judge"]`` to every record that lacks this judge's judgement; returns
        how many records that was."""
        todo = [r for r in records if not self.judged(r)]

        async def one(record: MutableMapping[str, object]) -> None:
            gold = [str(a) for a in as_list(record.get("answers", []), "answers")]
            judgement = await self.judge(str(record.get("question", "")), gold, prediction_of(record))
            record["judge"] = asdict(judgement)

        await asyncio.gather(*(one(r) for r in todo))
        return len(todo)


# --- backends -----------------------------------------------------------------------------


class JudgeTokenizer(Protocol):
    """The tokenizer calls the PyTRIO judge makes (a ``transformers`` fast tokenizer has them): its
    prompt is one user message, rendered without tools."""

    def apply_chat_template(self, conversation: list[dict[str, str]], *, tokenize: bool, add_generation_prompt: bool,
                            enable_thinking: bool, return_dict: bool) -> object: ...  # token ids, some shape
    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str: ...


class PyTrioJudge:
    """A PyTRIO model as the judge (the offline twin answers the judge prompt by its rule)."""

    service = "pytrio"

    def __init__(self, sampling_client: SamplingClient, tokenizer: JudgeTokenizer, model: str) -> None:
        self.sampler = sampling_client
        self.tokenizer = tokenizer
        self.model = model
        self.usage = JudgeUsage()

    async def ask(self, prompt: str) -> str:
        import pytrio as trio

        rendered = self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=True,
                                                      add_generation_prompt=True, enable_thinking=False,
                                                      return_dict=False)
        ids = rendered.tolist() if hasattr(rendered, "tolist") else rendered
        if not isinstance(ids, list):
            raise TypeError(f"the chat template gave {type(ids).__name__}, not token ids")
        tokens = [int(t) for t in ids]
        params = trio.SamplingParams(max_tokens=JUDGE_MAX_TOKENS, temperature=0.0, top_p=1.0, seed=0)
        response = await self.sampler.sample_async(prompt=trio.ModelInput.from_ints(tokens), num_samples=1,
                                                   sampling_params=params, return_text=True)
        sequence = response.sequences[0]
        self.usage.requests += 1
        self.usage.prompt_tokens += len(tokens)
        self.usage.generated_tokens += len(sequence.tokens)
        text = getattr(sequence, "text", None)
        if text is None:
            text = self.tokenizer.decode(list(sequence.tokens), skip_special_tokens=True)
        return str(text)


class DeepSeekJudge:
    """The DeepSeek chat API as the judge (``temperature`` 0, a few tokens)."""

    service = "deepseek"

    def __init__(self, model: str, client: httpx.AsyncClient, api_key: Secret | None) -> None:
        self.model = model
        self.usage = JudgeUsage()
        self.client = client  # an httpx.AsyncClient (its transport replays a cassette offline)
        self._key = api_key  # a searchr1.basics.secrets.Secret, or None when replaying

    async def ask(self, prompt: str) -> str:
        headers = {"Content-Type": "application/json"}
        if self._key is not None:
            headers["Authorization"] = f"Bearer {self._key.reveal()}"
        body = {"model": self.model, "messages": [{"role": "user", "content": prompt}], "temperature": 0.0,
                "max_tokens": JUDGE_MAX_TOKENS, "stream": False}
        import httpx

        from searchr1.search.replay import CassetteMissError

        try:
            response = await self.client.post(DEEPSEEK_URL, content=json.dumps(body, ensure_ascii=False).encode(),
                                              headers=headers)
        except httpx.HTTPError as error:
            raise JudgeError(f"the DeepSeek judge could not be reached ({type(error).__name__}); "
                             "rerun the same command to resume") from None
        except CassetteMissError as miss:  # replaying: this prompt was never recorded
            raise JudgeError(f"the judge cassette {miss.cassette} holds no answer to this prompt (recorded over "
                             "other answers); record it again live with --judge-cassette") from None
        self.usage.requests += 1
        if response.status_code >= 400:
            raise JudgeError(f"the DeepSeek judge answered HTTP {response.status_code}")
        try:
            reply = response.json()
            used = reply.get("usage") or {}
            self.usage.prompt_tokens += int(used.get("prompt_tokens", 0))
            self.usage.generated_tokens += int(used.get("completion_tokens", 0))
            return str(reply["choices"][0]["message"]["content"])
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            raise JudgeError("the DeepSeek judge's reply has no choices[0].message.content") from None

    async def aclose(self) -> None:
        await self.client.aclose()


class JudgeError(RuntimeError):
    """The judge could not be asked or did not answer; the message says why (never a key)."""


def cache_path(value: str | None) -> Path | None:
    """``--judge-cache`` (``off``: none) [default: DEFAULT_CACHE]."""
    if value is None:
        return DEFAULT_CACHE
    return None if value == "off" else Path(os.path.expanduser(value))
