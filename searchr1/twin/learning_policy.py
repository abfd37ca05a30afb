"""A small policy that really learns from the project's RL update: the twin's ``learning`` model.

What it is
    A softmax over whole assistant turns. At every turn the policy reads its prompt, finds the
    question and how much of the evidence that question needs the prompt already holds, and
    picks one of at most five *strategies*; each strategy is one full assistant turn in the
    project's protocol (Qwen3.5 XML tool call or an ``Answer:`` line), tokenised with the real
    tokenizer and ended with ``<|im_end|>``:

    ================  ===========================================================  ===========
    kind              the turn                                                     phases
    ================  ===========================================================  ===========
    ``search_next``   take the next hop's step: search its query, or, for a page   none, partial
                      hop whose lead search already showed, open its page when
                      the prompt's tool list declares ``open_page``
    ``repeat_search`` search the last hop's query again (wastes the budget)        partial, complete
    ``answer``        answer from what was found: the question's right answer      all
                      once every hop's passage is in the prompt, its plausible
                      wrong answer before that (with nothing found: a guess,
                      right for a known question: ``known.json``)
    ``json_call``     a JSON-style ``<tool_call>`` (invalid for Qwen3.5)           all
    ``no_answer``     a reply without an ``Answer:`` line                          all
    ================  ===========================================================  ===========

    The *phase* is ``none`` / ``partial`` / ``complete``: how many of the question's hops, in
    order, have their passage somewhere in the prompt after the user turn (none, some, all;
    one-hop questions have no ``partial``).

    Page questions (``searchr1/offline/pages.json``, over ``--backend local``): a page hop's
    search shows only the page's lead, and its evidence is a later passage of the page. With
    ``open_page`` declared, the next step after the lead is opening the page, which shows the
    evidence; with search alone, the next step searches the same query again and never finds
    it. Opening pages is therefore learnt through the same ``search_next`` cells as searching:
    the policy learns to take the next evidence step, and which tool that step uses follows
    from the tools the prompt offers (no parameter is added, so a run with ``search`` alone is
    the same policy, step for step, as before page questions existed).

Parameters
    ``params`` has shape ``(3, 5)``: one logit delta per (phase, kind), shared by every
    question, so what is learnt on the train questions transfers to the dev questions. The
    logits are ``BASE_LOGITS + params`` over the kinds valid in the phase (the other cells
    are unused and keep a zero gradient). ``initial_params()`` is zeros, so a fresh run is
    the base model, as a fresh LoRA adapter is. The base table is deliberately poor: it
    prefers guessing and answering from partial evidence (its greedy dev EM is 0, sampled
    about 5%), yet every behaviour keeps a probability above 0.1, so the RL signal has
    something to find.

Token-level exactness
    The candidates of a state sit in a trie of token ids. The logprob of token ``t`` at a
    node is ``log(mass of the candidates through the child for t / mass through the node)``
    (masses are softmax probabilities, computed as log-sum-exps of logits), so a candidate's
    token logprobs add up to its log-probability, sampling (draw a candidate, return its
    tokens) draws from exactly the distribution whose logprobs it returns, and the gradient
    is closed form: ``d logp / d logits = q_child - q_node``, where ``q_S`` is the softmax
    restricted to the candidates through ``S``. ``max_tokens`` cuts a candidate (then
    ``stopped=False``). ``temperature`` divides the logits; ``temperature == 0`` means the
    argmax candidate (ties go to the kind listed first above), whose tokens then have
    logprob 0.0. The same seed and prompt give the same draws; ``seed=None`` draws from
    fresh entropy, as a sampler without a seed does.

Training (``loss_and_grad``)
    Sees only what a real service receives: per datum the input tokens, the targets, the
    sampler's logprobs, the advantages (and cross-entropy weights), the loss name and the
    totals of the whole call. A *generated segment* starts right after each generation
    header in the inputs (``<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n``, or with thinking on
    ``<|im_start|>assistant\\n<think>\\n``, the candidates then writing a short reasoning first) and
    runs up to and including the next ``<|im_end|>`` (whether the sampler returned it or the
    environment appended it: it is the same token on the same trie path). Inside a segment,
    the target's exact logprob under ``params`` (at temperature 1, the model's own
    distribution) is computed on the trie of the state the segment's prompt is in. Outside
    segments (system prompt, question, observations, closing newlines) a target gets
    ``ENVIRONMENT_LOGPROB`` (0.0: the environment's tokens are given, not chosen) with zero
    gradient. A generated token that is not on the trie (and every later token of its
    segment) gets ``OFF_TRIE_LOGPROB`` (-30.0, far below any candidate) with zero gradient.
    Losses per active position (target ``!= -100``): every loss of
    :mod:`searchr1.core.objective` (``importance_sampling``, ``ppo``, ``cispo``, ``dro``,
    ``cross_entropy``) as a term and its derivative w.r.t. ``logp``; the sum is divided by
    ``totals.denominator(reduction)``.

No side channel
    The policy never sees a reward, which answer is right, or which candidate is good. Its
    "knowledge" is the offline question set's hop queries and passages (to write queries
    and recognise evidence) and the answer each strategy would produce in each phase (the
    first accepted answer after complete evidence, the plausible wrong one otherwise, except a
    guess at a known question, which is right: the base model's parametric knowledge). That
    searching every hop before answering pays, it must learn from the advantages alone.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from searchr1.core.objective import loss_terms, resolve_loss_config
from searchr1.runtime.tokenizer import GENERATION_PROMPTS, REASONING_CLOSE, Qwen35Tokenizer
from searchr1.offline import CALL
from searchr1.twin.mismatch import sampler_noise
from searchr1.twin.offline_world import WorldQuestion, load_worlds, question_key
from searchr1.twin.policy import IGNORE_INDEX, LossResult, PolicySample, Reduction, SampledSequence, Totals

KINDS: tuple[str, ...] = ("search_next", "repeat_search", "answer", "json_call", "no_answer")
PHASES: tuple[str, ...] = ("none", "partial", "complete")

# Which kinds exist in which phase (rows: PHASES, columns: KINDS).
VALID_KINDS = np.array(
    [
        [True, False, True, True, True],   # none: nothing to repeat
        [True, True, True, True, True],    # partial
        [False, True, True, True, True],   # complete: no next hop
    ]
)

# The base model's logits (rows: PHASES, columns: KINDS; unused cells are 0.0). At base it
# guesses half the time with nothing found (0.50), answers early from partial evidence (0.44),
# searches the next hop with probability 0.20, and answers once all is found with 0.61.
BASE_LOGITS = np.array(
    [
        [0.0, 0.0, 0.9, -0.2, -0.4],
        [0.0, -0.3, 0.8, -0.6, -0.6],
        [0.0, -0.4, 1.0, -0.6, -0.6],
    ]
)

ENVIRONMENT_LOGPROB = 0.0
OFF_TRIE_LOGPROB = -30.0

GENERATION_HEADER, THINKING_HEADER = GENERATION_PROMPTS[False], GENERATION_PROMPTS[True]
STOP_TOKEN = "<|im_end|>"
_USER_HEADER = "<|im_start|>user\n"
_OPENING = "I need evidence for this."
_OPEN_PAGE = ("The page should say more.\n\n<tool_call>\n<function=open_page>\n<parameter=page>\n{page}\n"
              "</parameter>\n</function>\n</tool_call>")
_OPEN_PAGE_DECLARED = '"name": "open_page"'  # how the template lists the tool in the system prompt


class UnknownQuestionError(ValueError):
    """A prompt's question is not in the offline question set the policy knows."""


class PromptFormatError(ValueError):
    """A prompt is not a conversation that ends with a generation header (thinking off or on)."""


# --------------------------------------------------------------------------- candidates


def phase_index(found: int, hops: int) -> int:
    """0 (none), 1 (partial) or 2 (complete) for ``found`` of ``hops`` hops."""
    if found <= 0:
        return 0
    return 2 if found >= hops else 1


def candidate_text(question: WorldQuestion, found: int, kind: str, *, open_next: bool = False) -> str:
    """The assistant turn of ``kind`` when the first ``found`` hops are in the prompt (pure);
    ``open_next``: the next hop's page is to be opened rather than searched. A long-horizon
    question's turns first write down what was found so far (its hops' notes), so that what a
    folded context no longer shows stays in the turns themselves."""
    noted = [hop.note for hop in question.hops[:found] if hop.note]
    action = _action_text(question, found, kind, open_next=open_next)
    return f"Notes: {'; '.join(noted)}.\n\n{action}" if noted else action


def _action_text(question: WorldQuestion, found: int, kind: str, *, open_next: bool = False) -> str:
    hops = question.hops
    complete = found >= len(hops)
    next_query = hops[min(found, len(hops) - 1)].query
    if kind == "search_next" and not complete:
        if open_next:
            return _OPEN_PAGE.format(page=hops[found].title)
        return f"{_OPENING}\n\n" + CALL.format(query=next_query)
    if kind == "repeat_search" and found > 0:
        return "Let me run that search once more.\n\n" + CALL.format(query=hops[found - 1].query)
    if kind == "answer":
        if complete:
            return f"The passages agree.\n\nAnswer: {question.answers[0]}"
        if found:
            return f"The first passage points to this.\n\nAnswer: {question.wrong}"
        guess = question.answers[0] if question.known else question.wrong  # what the base model knows
        return f"I am fairly sure already.\n\nAnswer: {guess}"
    if kind == "json_call":
        payload = json.dumps({"name": "search", "arguments": {"query": next_query}})
        return f"{_OPENING}\n\n<tool_call>\n{payload}\n</tool_call>"
    if kind == "no_answer":
        return "I cannot tell without more context."
    raise ValueError(f"kind {kind!r} does not exist when {found} of {len(hops)} hops are found")


def reasoning_text(question: WorldQuestion, found: int, kind: str) -> str:
    """With thinking on, the short reasoning a turn of ``kind`` writes before it acts (pure): what
    the prompt holds and what the turn will do about it. It carries no knowledge of its own: the
    same words for every question at the same point, so the turn's choice is learnt as without
    thinking, and the reasoning only costs tokens."""
    hops = len(question.hops)
    have = f"I have {found} of the {hops} facts this question needs."
    plans = {"search_next": "I look for the next one.", "repeat_search": "The last search may show more.",
             "answer": "That is enough to answer.", "json_call": "I call the search tool.",
             "no_answer": "I cannot say yet."}
    return f"{have} {plans[kind]}"


@dataclass
class TrieNode:
    """The candidates (indices into the state's list) whose tokens pass through this node."""

    members: tuple[int, ...]
    children: dict[int, TrieNode] = field(default_factory=dict)


def build_trie(sequences: Sequence[Sequence[int]]) -> TrieNode:
    """A trie of token sequences; no sequence may be a prefix of another (each ends with the
    stop token, so only identical sequences could be)."""
    root = TrieNode(tuple(range(len(sequences))))
    for index, tokens in enumerate(sequences):
        node = root
        for token in tokens:
            child = node.children.get(token)
            if child is None:
                child = node.children[token] = TrieNode(())
            child.members += (index,)
            node = child
        if node.children:
            raise ValueError(f"candidate {index} is a prefix of another candidate")
    for index, tokens in enumerate(sequences):
        for other in range(index):
            if list(sequences[other]) == list(tokens):
                raise ValueError(f"candidates {other} and {index} have the same tokens")
    return root


@dataclass(frozen=True)
class PolicyState:
    """Where a prompt is: the question, how many hops are found, and the candidate turns."""

    question: WorldQuestion
    found: int
    phase: int
    open_next: bool  # search_next opens the next hop's page
    kinds: tuple[int, ...]  # indices into KINDS, in KINDS order
    texts: tuple[str, ...]
    tokens: tuple[tuple[int, ...], ...]
    trie: TrieNode


def _logsumexp(values: np.ndarray) -> float:
    top = float(values.max())
    return top + float(np.log(np.exp(values - top).sum()))


def _restricted_softmax(logits: np.ndarray, members: Sequence[int]) -> np.ndarray:
    """``softmax(logits)`` restricted to ``members`` (zeros elsewhere): ``d lse(S) / d logits``."""
    out = np.zeros_like(logits)
    chosen = logits[list(members)]
    weights = np.exp(chosen - chosen.max())
    out[list(members)] = weights / weights.sum()
    return out


def path_logprobs(trie: TrieNode, logits: np.ndarray, tokens: Sequence[int]) -> list[float]:
    """Per-token logprobs of ``tokens`` along the trie (every token must be on it)."""
    out = []
    node = trie
    mass = _logsumexp(logits[list(node.members)])
    for token in tokens:
        node = node.children[token]
        child_mass = _logsumexp(logits[list(node.members)])
        out.append(child_mass - mass)
        mass = child_mass
    return out


# --------------------------------------------------------------------------- the policy


class LearningPolicy:
    """The twin's ``learning`` model (see the module docstring). Satisfies ``TwinPolicy``."""

    kind = "learning-search-strategy-v1"

    def __init__(
        self,
        tokenizer: Qwen35Tokenizer,
        questions: Sequence[WorldQuestion] | None = None,
        *,
        base_logits: np.ndarray = BASE_LOGITS,
        state_cache_size: int = 4096,
    ) -> None:
        base = np.asarray(base_logits, dtype=np.float64)
        if base.shape != (len(PHASES), len(KINDS)) or not np.all(np.isfinite(base)):
            raise ValueError(f"base_logits must be a finite {len(PHASES)}x{len(KINDS)} table, got shape {base.shape}")
        self.base_logits = base
        self.tokenizer = tokenizer
        self.questions = tuple(load_worlds() if questions is None else questions)
        self._by_question = {question_key(q.question): q for q in self.questions}
        self._header = tuple(tokenizer.encode(GENERATION_HEADER, add_special_tokens=False))
        self._thinking_header = tuple(tokenizer.encode(THINKING_HEADER, add_special_tokens=False))
        self._stop = int(tokenizer.convert_tokens_to_ids(STOP_TOKEN))
        self._candidates = lru_cache(maxsize=None)(self._build_candidates)
        self._state_of = lru_cache(maxsize=state_cache_size)(self._read_state)

    # -- TwinPolicy ---------------------------------------------------------------------

    def initial_params(self) -> np.ndarray:
        return np.zeros((len(PHASES), len(KINDS)), dtype=np.float64)

    def sample(
        self,
        params: np.ndarray,
        prompt: Sequence[int],
        num_samples: int,
        *,
        max_tokens: int,
        seed: int | None,
        temperature: float,
        logit_noise: float = 0.0,
    ) -> list[SampledSequence]:
        """``num_samples`` turns drawn for ``prompt``; ``logit_noise``: the sampler-learner mismatch
        fault's scale (:mod:`searchr1.twin.mismatch`), draws and logprobs from the perturbed logits."""
        if num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples}")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        if not temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        self._check_params(params)
        prompt = [int(t) for t in prompt]
        if not any(tuple(prompt[-len(header):]) == header for header in (self._header, self._thinking_header)):
            raise PromptFormatError(
                "learning policy: the prompt does not end with a generation header, thinking off "
                f"{GENERATION_HEADER!r} or on {THINKING_HEADER!r}"
            )
        state = self.state(prompt)
        logits = self.logits(params, state) + sampler_noise(prompt, state.tokens, logit_noise)
        if temperature == 0.0:
            chosen = [int(np.argmax(logits))] * num_samples
            paths = {chosen[0]: [0.0] * len(state.tokens[chosen[0]])}
        else:
            tempered = logits / temperature
            probabilities = np.exp(tempered - _logsumexp(tempered))
            chosen = [int(i) for i in self._rng(prompt, seed).choice(len(logits), size=num_samples, p=probabilities)]
            paths = {i: path_logprobs(state.trie, tempered, state.tokens[i]) for i in set(chosen)}
        out = []
        for index in chosen:
            tokens = list(state.tokens[index])
            stopped = len(tokens) <= max_tokens
            out.append(SampledSequence(tokens[:max_tokens], paths[index][:max_tokens], stopped))
        return out

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
        config = resolve_loss_config(loss_fn, loss_config)
        denominator = totals.denominator(reduction)
        self._check_params(params)
        grad = np.zeros((len(PHASES), len(KINDS)), dtype=np.float64)
        loss_sum = 0.0
        token_count = 0
        all_logprobs = []
        for sample in samples:
            logp, slopes = self.target_logprobs(params, sample.inputs, sample.targets)
            all_logprobs.append(logp)
            active = sample.active
            if not active.any():
                continue
            terms, dterms = loss_terms(loss_fn, config, logp, sample.old_logprobs, sample.advantages,
                                       sample.weights)
            loss_sum += float(terms[active].sum())
            token_count += int(active.sum())
            for position, phase, slope in slopes:
                grad[phase] += dterms[position] * slope
        return LossResult(
            loss=loss_sum / denominator,
            grad=grad / denominator,
            loss_sum=loss_sum,
            token_count=token_count,
            logprobs=all_logprobs,
        )

    # -- reading prompts ----------------------------------------------------------------

    def state(self, prompt: Sequence[int] | np.ndarray) -> PolicyState:
        """The state of a prompt that ends with the generation header (cached)."""
        return self._state_of(np.asarray(prompt, dtype=np.int64).tobytes())

    def _read_state(self, prompt_bytes: bytes) -> PolicyState:
        tokens = np.frombuffer(prompt_bytes, dtype=np.int64).tolist()
        text = self.tokenizer.decode(tokens, skip_special_tokens=False)
        start = text.find(_USER_HEADER)
        if start < 0:
            raise PromptFormatError("learning policy: the prompt holds no user turn")
        question_key_text, _, after = text[start + len(_USER_HEADER):].partition("<|im_end|>")
        question = self._by_question.get(question_key(question_key_text))
        if question is None:
            raise UnknownQuestionError(
                f"learning policy: the prompt's question {question_key_text.strip()!r} is not one of "
                f"the {len(self.questions)} offline questions it knows (searchr1/offline/questions.json)"
            )
        found = 0
        for hop in question.hops:  # found: its passage is shown, or its note was written down
            if question_key(hop.text) not in after and not (hop.note and hop.note in after):
                break
            found += 1
        open_next = (found < len(question.hops) and question.hops[found].is_page
                     and question_key(question.hops[found].lead) in after and _OPEN_PAGE_DECLARED in text[:start])
        thinking = tuple(tokens[-len(self._thinking_header):]) == self._thinking_header
        return self._candidates(question, found, open_next, thinking)

    def _build_candidates(self, question: WorldQuestion, found: int, open_next: bool = False,
                          thinking: bool = False) -> PolicyState:
        """The state's candidate turns; with ``thinking`` each writes its reasoning first."""
        phase = phase_index(found, len(question.hops))
        kinds = tuple(int(k) for k in np.flatnonzero(VALID_KINDS[phase]))
        texts = tuple(candidate_text(question, found, KINDS[k], open_next=open_next) for k in kinds)
        if thinking:
            texts = tuple(reasoning_text(question, found, KINDS[k]) + REASONING_CLOSE + text
                          for k, text in zip(kinds, texts))
        tokens = tuple(
            tuple(self.tokenizer.encode(text, add_special_tokens=False)) + (self._stop,) for text in texts
        )
        try:
            trie = build_trie(tokens)
        except ValueError as error:
            raise ValueError(f"learning policy: question {question.id} ({found} hops found): {error}") from None
        return PolicyState(question, found, phase, open_next, kinds, texts, tokens, trie)

    # -- distributions ------------------------------------------------------------------

    def _check_params(self, params: np.ndarray) -> None:
        if np.shape(params) != (len(PHASES), len(KINDS)):
            raise ValueError(
                f"learning policy params must have shape {(len(PHASES), len(KINDS))}, got {np.shape(params)}"
            )

    def logits(self, params: np.ndarray, state: PolicyState) -> np.ndarray:
        """Logits of the state's candidates (in ``state.kinds`` order) at temperature 1."""
        self._check_params(params)
        row = self.base_logits[state.phase] + np.asarray(params, dtype=np.float64)[state.phase]
        return row[list(state.kinds)]

    def kind_probabilities(self, params: np.ndarray, prompt: Sequence[int]) -> dict[str, float]:
        """The probability of each candidate kind for this prompt (temperature 1)."""
        state = self.state(prompt)
        logits = self.logits(params, state)
        probabilities = np.exp(logits - _logsumexp(logits))
        return {KINDS[k]: float(p) for k, p in zip(state.kinds, probabilities)}

    def _rng(self, prompt: Sequence[int], seed: int | None) -> np.random.Generator:
        if seed is None:
            return np.random.default_rng()
        digest = hashlib.blake2b(np.asarray(prompt, dtype=np.int64).tobytes(), digest_size=8).digest()
        return np.random.default_rng([int(seed) & (2**64 - 1), int.from_bytes(digest, "big")])

    def target_logprobs(
        self, params: np.ndarray, inputs: np.ndarray, targets: np.ndarray
    ) -> tuple[np.ndarray, list[tuple[int, int, np.ndarray]]]:
        """Per-position logprobs of ``targets`` (``inputs[:i + 1]`` predicts ``targets[i]``;
        0.0 where the target is -100) and, for every generated on-trie position whose
        logprob depends on ``params``, ``(position, phase, d logp / d params[phase])``."""
        inputs = np.asarray(inputs, dtype=np.int64)
        targets = np.asarray(targets, dtype=np.int64)
        out = np.full(len(targets), ENVIRONMENT_LOGPROB, dtype=np.float64)
        slopes: list[tuple[int, int, np.ndarray]] = []
        for start in self._segment_starts(inputs):
            state = self.state(inputs[: start + 1])
            logits = self.logits(params, state)
            row_index = list(state.kinds)
            node: TrieNode | None = state.trie
            position = start
            while position < len(targets):
                if position > start:
                    if int(inputs[position]) == self._stop:
                        break  # the segment ended with the previous target
                    node = None if node is None else node.children.get(int(inputs[position]))
                target = int(targets[position])
                child = None if node is None else node.children.get(target)
                if target == IGNORE_INDEX:
                    out[position] = 0.0
                elif child is None:
                    out[position] = OFF_TRIE_LOGPROB
                else:
                    assert node is not None
                    if len(child.members) == len(node.members):
                        out[position] = 0.0  # the node has one way on: certain, no gradient
                    else:
                        out[position] = _logsumexp(logits[list(child.members)]) - _logsumexp(logits[list(node.members)])
                        slope = np.zeros(len(KINDS))
                        slope[row_index] = (
                            _restricted_softmax(logits, child.members) - _restricted_softmax(logits, node.members)
                        )
                        slopes.append((position, state.phase, slope))
                position += 1
        out[targets == IGNORE_INDEX] = 0.0
        return out, slopes

    def _segment_starts(self, inputs: np.ndarray) -> list[int]:
        """Positions ``e`` where ``inputs[: e + 1]`` ends with a generation header (thinking off
        or on: a datum holds one kind, and neither header ends inside the other)."""
        starts: set[int] = set()
        for header in (self._header, self._thinking_header):
            width = len(header)
            starts.update(int(e) for e in np.flatnonzero(inputs == header[-1])
                          if e + 1 >= width and tuple(inputs[e + 1 - width: e + 1].tolist()) == header)
        return sorted(starts)
