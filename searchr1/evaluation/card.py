"""The comparability card of an evaluation: everything a reader needs to decide whether two
sets of numbers can be compared (the corpus and its version, the retriever, top-k, the turn
and token budgets, decoding, what each metric means and where its definition comes from, how
many questions each source had, which sources had too few to read alone, how the intervals were
computed).

Every eval summary carries one under ``card``; ``eval --protocol search-r1`` prints it, and each
published row has its own (:mod:`searchr1.evaluation.published`). :func:`card_differences`
lists the fields of two cards that change the numbers (every field except ``n_per_source`` and
``few_questions``, which describe the sample, and ``interval``, which says how the file's own
intervals were drawn and leaves the scores alone): ``compare`` refuses evaluations whose cards
differ in any of them.
"""

from __future__ import annotations

from collections.abc import Mapping

from searchr1.evaluation.intervals import FEW_QUESTIONS, describe_rules, few_questions
from searchr1.evaluation.numbers import int_of

CARD_VERSION = 1
# Card fields that describe the sample or how its intervals were drawn, not the setting: they may
# differ between comparable cards (a file written with an older interval rule compares with a new one).
DESCRIPTIVE_FIELDS = frozenset({"n_per_source", "card_version", "interval", "few_questions"})

METRIC_DEFINITIONS: dict[str, dict[str, str]] = {
    "em": {
        "definition": "1 when the normalised answer equals a normalised gold answer (lower case, "
                      "punctuation, articles and extra white space removed), else 0; mean over questions",
        "source": "SQuAD's official scorer (Rajpurkar et al. 2016, arXiv 1606.05250), as used by "
                  "Search-R1 (Jin et al. 2025, arXiv 2503.09516)",
    },
    "f1": {
        "definition": "token F1 of the normalised answer against each gold answer (tokens counted with "
                      "multiplicity), the best over the gold answers; mean over questions",
        "source": "SQuAD's official scorer (Rajpurkar et al. 2016, arXiv 1606.05250)",
    },
    "cover_em": {
        "definition": "1 when a normalised gold answer occurs inside the normalised answer on whole-token "
                      "boundaries, else 0; mean over questions",
        "source": "Search-R1's substring EM (Jin et al. 2025, arXiv 2503.09516; its evaluation code)",
    },
}
JUDGE_DEFINITION = {
    "definition": "1 when the judge model says the prediction means the same as a gold answer, else 0; "
                  "mean over questions (the prompt is in docs/after-training.md; its version is below)",
    "source": "LLM-as-judge answer equivalence, as in ASearcher and R1-Searcher",
}


def interval_method() -> str:
    return describe_rules()


def few_questions_field(n_per_source: Mapping[str, int]) -> dict[str, object]:
    """The card's ``few_questions``: the threshold and the sources under it, which every table
    marks (their intervals are wide; one question moves them by a tenth or more)."""
    return {"under": FEW_QUESTIONS, "sources": [s for s, n in n_per_source.items() if few_questions(n)]}


def table(record: Mapping[str, object], name: str) -> Mapping[str, object]:
    """A table of a config or a card (``rollout``, ``budgets``), empty when it has none."""
    value = record.get(name)
    return value if isinstance(value, Mapping) else {}


def _corpus(config: Mapping[str, object]) -> dict[str, object]:
    backend = config.get("search_backend")
    if backend == "local":
        index = str(config.get("search_index") or "")
        name, _, version = index.partition("@")
        return {"name": name.removeprefix("shipped:") or None, "version": version or None}
    if backend == "retriever":
        return {"name": "the retrieval server's corpus (wiki-18 under --protocol search-r1)", "version": None}
    if config.get("search_cassette"):
        return {"name": f"{backend} web search, replayed", "version": config.get("search_cassette")}
    return {"name": f"{backend} web search, live", "version": None}


def _retriever(config: Mapping[str, object]) -> str:
    backend = str(config.get("search_backend"))
    return {"local": "BM25 (searchr1.bm25)", "retriever": "an HTTP retrieval server (Search-R1's /retrieve)",
            "deepseek": f"DeepSeek web search ({config.get('search_model') or 'default model'})",
            "zhihu": "Zhihu search", "wikipedia": "the Wikipedia search API"}.get(backend, backend)


def eval_card(config: Mapping[str, object], metrics: Mapping[str, object]) -> dict[str, object]:
    """The card of an evaluation from its run configuration and its metrics (plain JSON)."""
    rollout, sampling = table(config, "rollout"), table(config, "sampling")
    definitions: dict[str, dict[str, object]] = {name: {**text} for name, text in METRIC_DEFINITIONS.items()}
    n_per_source = {key.split("/", 1)[1]: int_of(value, key) for key, value in sorted(metrics.items())
                    if key.startswith("questions/")}
    judge = config.get("judge")
    if isinstance(judge, Mapping):
        definitions["judge"] = {**JUDGE_DEFINITION, "model": judge.get("model"),
                                "prompt_version": judge.get("prompt_version")}
    return {
        "card_version": CARD_VERSION,
        "protocol": config.get("protocol"),
        "dataset_sha256": config.get("dataset_sha256"),
        "corpus": _corpus(config),
        "retriever": _retriever(config),
        "top_k": config.get("search_topk"),
        "budgets": {name: rollout.get(name) for name in (
            "max_search_calls", "max_assistant_turns", "max_assistant_tokens", "max_tool_response_tokens",
            "max_trajectory_tokens")},
        "decoding": {"temperature": sampling.get("temperature", rollout.get("temperature")),
                     "top_p": sampling.get("top_p", rollout.get("top_p")),
                     "samples_per_question": rollout.get("group_size")},
        "metrics": definitions,
        "n_per_source": n_per_source,
        "few_questions": few_questions_field(n_per_source),
        "interval": interval_method(),
    }


def _flatten(value: object, prefix: str = "") -> dict[str, object]:
    if isinstance(value, Mapping):
        flat: dict[str, object] = {}
        for key, item in value.items():
            flat.update(_flatten(item, f"{prefix}{key}."))
        return flat
    return {prefix.rstrip("."): value}


def card_differences(a: Mapping[str, object], b: Mapping[str, object]) -> list[str]:
    """``"field: a -> b"`` for every card field that changes the numbers and differs (sorted).
    A judge on one side only is no difference (the other numbers are the same); two judges
    that differ are."""
    left = _flatten({k: v for k, v in a.items() if k not in DESCRIPTIVE_FIELDS})
    right = _flatten({k: v for k, v in b.items() if k not in DESCRIPTIVE_FIELDS})
    judged = [any(k.startswith("metrics.judge.") for k in side) for side in (left, right)]
    if not all(judged):
        left, right = ({k: v for k, v in side.items() if not k.startswith("metrics.judge.")}
                       for side in (left, right))
    return [f"{key}: {left.get(key)!r} -> {right.get(key)!r}"
            for key in sorted(set(left) | set(right)) if left.get(key) != right.get(key)]


def format_card(card: Mapping[str, object]) -> str:
    """The card as indented lines for the console."""
    corpus, budgets, decoding = table(card, "corpus"), table(card, "budgets"), table(card, "decoding")
    lines = ["card:",
             f"  corpus      {corpus.get('name')} (version {corpus.get('version') or 'unstated'})",
             f"  retriever   {card.get('retriever')}, top-k {card.get('top_k') or 'the backend default'}",
             "  budgets     " + ", ".join(f"{k} {v}" for k, v in budgets.items() if v is not None),
             "  decoding    " + ", ".join(f"{k} {v}" for k, v in decoding.items() if v is not None)]
    n = table(card, "n_per_source")
    if n:
        lines.append("  questions   " + ", ".join(f"{k} {v}" for k, v in n.items()))
        few = [k for k, v in n.items() if isinstance(v, int) and few_questions(v)]
        if few:
            lines.append(f"  few         fewer than {FEW_QUESTIONS} questions: {', '.join(few)} (wide intervals)")
    metrics = table(card, "metrics")
    for name in metrics:
        text = table(metrics, name)
        lines.append(f"  {name:<11} {text.get('definition')} [{text.get('source')}]")
    lines.append(f"  intervals   {card.get('interval')}")
    return "\n".join(lines)
