"""The twin as a judge: a deterministic answer to the eval judge prompt
(:mod:`searchr1.evaluation.judge`), so that ``eval --judge twin`` runs offline through the real
pytrio sampling client.

The rule: after SQuAD normalisation (lower case; punctuation, articles and extra white space
removed), the twin says ``yes`` when, for some gold answer, every gold token occurs in the
prediction, or every prediction token occurs in the gold answer and they are at least half of
its tokens; otherwise ``no``. So "Spielberg" for "Arnold Spielberg" is yes, "Max Spielberg" is
no, and "Steven Spielberg's father Arnold Spielberg" is yes.

A prompt is the judge prompt when its opening (the first user turn, no system prompt) holds the
prompt's first sentence and
carries its QUESTION / GOLD ANSWERS / PREDICTION lines; any other prompt goes to the twin's
policy as before.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from searchr1.core.types import Tokenizer
from searchr1.twin.policy import SampledSequence

HEADER = "You are judging a question-answering system."  # JUDGE_PROMPT_HEADER, kept in step by a test
_FIELDS = re.compile(r"GOLD ANSWERS: (?P<gold>\[.*?\])\nPREDICTION: (?P<prediction>[^\n]*?)(?:<\|im_end\|>|\n|$)", re.S)


def rule(gold: Sequence[str], prediction: str) -> bool:
    from searchr1.core.reward import normalize_answer

    said = normalize_answer(prediction).split()
    for answer in gold:
        wanted = normalize_answer(answer).split()
        if not wanted:
            continue
        if all(token in said for token in wanted):
            return True
        if said and all(token in wanted for token in said) and 2 * len(said) >= len(wanted):
            return True
    return False


def judge_reply(tokenizer: Tokenizer, prompt: Sequence[int], num_samples: int,
                end_of_turn: int) -> list[SampledSequence] | None:
    """The twin's verdict on a judge prompt (``num_samples`` copies), or None for any other prompt."""
    if HEADER not in tokenizer.decode(list(prompt[:32]), skip_special_tokens=False):  # cheap: the opening only
        return None
    text = tokenizer.decode(list(prompt), skip_special_tokens=False)
    match = _FIELDS.search(text)
    if match is None:
        return None
    try:
        gold = [str(a) for a in json.loads(match["gold"])]
    except (json.JSONDecodeError, TypeError):
        return None
    verdict = "yes" if rule(gold, match["prediction"]) else "no"
    tokens = [int(t) for t in tokenizer.encode(verdict, add_special_tokens=False)] + [end_of_turn]
    return [SampledSequence(list(tokens), [0.0] * len(tokens), True) for _ in range(num_samples)]
