"""Question/answer examples: the unit of work for rollouts, training and evaluation.

Two halves live here:

* **Preparation** turns the Search-R1 parquet release (FlashRAG rows: ``id, question,
  golden_answers, data_source, prompt, ability, reward_model, extra_info``) into three small
  JSONL files plus a manifest. The parquet reading and the download are the only I/O; cleaning,
  overlap removal and dev selection are pure functions over rows and examples.
* **Loading and batching** reads those JSONL files back with row-level validation and hands the
  trainer and the evaluator deterministic orders (seeded shuffle, wrap-around cursor batches,
  a source-balanced subset for ``--limit``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
import socket
import tempfile
import unicodedata
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict
from urllib.parse import urlsplit

from searchr1.core.errors import UserError
from searchr1.core.types import SearchExample
from searchr1.basics.fileio import file_sha256, follow_umask, naming, removing_new_directories
from searchr1.basics.jsonl import iter_json_lines
from searchr1.basics import invocation


class DataError(UserError, ValueError):
    """A dataset file or row is unusable. The message names the file (and line) and the field."""

    resumable = False  # a failed download whose bytes are kept for the next run to continue


# --- the pinned source ---------------------------------------------------------------------

DATASET_ID = "zhuangzhuang2023/nq_hotpotqa_train"  # ModelScope mirror of PeterJinGo/nq_hotpotqa_train
DATASET_REVISION = "aa2da0496c1b1a50a66af7acabdf09c07a0cb79e"  # the revision the lab port used
RAW_FILES = {"train": "train.parquet", "test": "test.parquet"}
# Columns we read; the others (prompt, ability, extra_info, metadata) carry nothing we need.
RAW_COLUMNS = ("id", "question", "golden_answers", "data_source", "reward_model")

# The seven benchmarks of the test split, in the order the release lists them.
EVAL_SOURCES = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")

DEFAULT_DEV_PER_SOURCE = 10
DEFAULT_SEED = 42
MANIFEST_NAME = "manifest.json"
QUESTION_KEY_RULE = (
    "Unicode NFKC, casefold, every Unicode punctuation character (category P*) replaced by a "
    "space, whitespace runs collapsed, ends stripped"
)

# --- cleaning (pure) ----------------------------------------------------------------------


def clean_answers(value: object) -> tuple[str, ...]:
    """A bare string becomes a one-answer tuple; a list/tuple keeps its items as stripped
    strings; anything else (None, dict, scalar) yields nothing. Empty strings are dropped and
    duplicates removed keeping the first occurrence, so the reward sees each gold once."""
    if isinstance(value, str):
        items: Iterable[object] = [value]
    elif isinstance(value, (list, tuple)):
        items = value
    else:
        return ()
    seen: dict[str, None] = {}
    for item in items:
        if item is None:
            continue
        text = str(item).strip()
        if text:
            seen.setdefault(text, None)
    return tuple(seen)


def extract_answers(row: Mapping[str, object]) -> tuple[str, ...]:
    """Gold answers from ``golden_answers``; when that yields nothing, from
    ``reward_model.ground_truth.target`` (the copy the official reward reads). A ground truth
    that is not a dict is taken as the answers themselves."""
    answers = clean_answers(row.get("golden_answers"))
    if answers:
        return answers
    reward_model = row.get("reward_model")
    if not isinstance(reward_model, Mapping):
        return ()
    truth = reward_model.get("ground_truth")
    if isinstance(truth, Mapping):
        truth = truth.get("target")
    return clean_answers(truth)


def question_key(question: str) -> str:
    """The normal form used to decide that two questions are the same (see QUESTION_KEY_RULE).

    Punctuation is dropped because the release appends ``?`` to questions that lack one, and
    casefolding/NFKC because the same question reaches several benchmarks with different
    capitalisation or Unicode forms; a train copy of an eval question in any of these spellings
    would leak the answer into training."""
    text = unicodedata.normalize("NFKC", question).casefold()
    text = "".join(" " if unicodedata.category(ch).startswith("P") else ch for ch in text)
    return " ".join(text.split())


def normalize_row(row: Mapping[str, object], *, fallback_id: str) -> SearchExample | str:
    """One raw row -> a SearchExample, or the reason it is dropped
    (``"missing_question"`` / ``"missing_answers"``).

    The id is prefixed with the source because the release reuses ids across benchmarks
    (every test benchmark starts at ``test_0``, both train sources at ``train_0``); eval records
    and resume logic key on it."""
    question = str(row.get("question") or "").strip()
    if not question:
        return "missing_question"
    answers = extract_answers(row)
    if not answers:
        return "missing_answers"
    source = str(row.get("data_source") or "").strip() or "unknown"
    raw_id = str(row.get("id") or "").strip() or fallback_id
    return SearchExample(id=f"{source}/{raw_id}", question=question, answers=answers, data_source=source)


@dataclass
class CleanSplit:
    examples: list[SearchExample]
    dropped: Counter[str]


def clean_rows(rows: Iterable[Mapping[str, object]], split: str) -> CleanSplit:
    """Normalise every row, counting drops by reason. Ids are made unique within the split
    (a repeated id gets ``~2``, ``~3``… appended) so no two examples share one."""
    examples: list[SearchExample] = []
    dropped: Counter[str] = Counter()
    used: set[str] = set()
    for index, row in enumerate(rows):
        result = normalize_row(row, fallback_id=f"{split}_row{index}")
        if isinstance(result, str):
            dropped[result] += 1
            continue
        example, n = result, 1
        while example.id in used:
            n += 1
            example = SearchExample(f"{result.id}~{n}", result.question, result.answers, result.data_source)
        used.add(example.id)
        examples.append(example)
    return CleanSplit(examples, dropped)


def remove_overlap(
    examples: Sequence[SearchExample], held_out: Iterable[SearchExample]
) -> tuple[list[SearchExample], int]:
    """Drop every example whose question_key also occurs in ``held_out``; return the kept
    examples (order preserved) and how many were dropped. Train gives way to test: the
    benchmarks stay intact and comparable with published numbers."""
    banned = {question_key(e.question) for e in held_out}
    kept = [e for e in examples if question_key(e.question) not in banned]
    return kept, len(examples) - len(kept)


def select_dev(
    examples: Sequence[SearchExample], per_source: int = DEFAULT_DEV_PER_SOURCE, seed: int = DEFAULT_SEED
) -> list[SearchExample]:
    """A stratified sample of ``per_source`` questions per source, ordered by source name.

    Each source draws from its own RNG seeded with ``f"{seed}:{source}"``, so adding or removing
    a benchmark never changes another benchmark's picks. A question already taken (same
    question_key, e.g. shared by two benchmarks) is not taken twice. A source with fewer
    candidates contributes all of them."""
    if per_source < 0:
        raise ValueError(f"per_source must be >= 0, got {per_source}")
    by_source: dict[str, list[SearchExample]] = defaultdict(list)
    for example in examples:
        by_source[example.data_source].append(example)
    chosen: list[SearchExample] = []
    taken: set[str] = set()
    for source in sorted(by_source):
        candidates = by_source[source]
        order = random.Random(f"{seed}:{source}").sample(range(len(candidates)), len(candidates))
        picked = 0
        for i in order:
            if picked == per_source:
                break
            key = question_key(candidates[i].question)
            if key in taken:
                continue
            taken.add(key)
            chosen.append(candidates[i])
            picked += 1
    return chosen


def count_by_source(examples: Iterable[SearchExample]) -> dict[str, int]:
    return dict(sorted(Counter(e.data_source for e in examples).items()))


# --- JSONL round trip --------------------------------------------------------------------


class ExampleRecord(TypedDict):
    """One line of a dataset JSONL file."""

    id: str
    question: str
    answers: list[str]
    data_source: str


def example_to_dict(example: SearchExample) -> ExampleRecord:
    return {
        "id": example.id,
        "question": example.question,
        "answers": list(example.answers),
        "data_source": example.data_source,
    }


EXAMPLE_FIELDS = ("id", "question", "answers", "data_source")


def _described(value: object) -> str:
    """``a string 'x'``, ``a number 3``, ``null``…: what the line holds, in JSON's words."""
    kind = ("null" if value is None else "true/false" if isinstance(value, bool)
            else "a number" if isinstance(value, (int, float)) else "a string" if isinstance(value, str)
            else "a list" if isinstance(value, list) else "an object" if isinstance(value, dict)
            else type(value).__name__)
    shown = json.dumps(value, ensure_ascii=False) if value is not None and not isinstance(value, bool) else ""
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return f"{kind} {shown}".strip()


def _require(record: Mapping[str, object], field: str, where: str) -> object:
    if field in record:
        return record[field]
    present = ", ".join(repr(k) for k in record) or "no fields"
    hint = ""
    if field == "answers" and "golden_answers" in record:
        hint = ("; 'golden_answers' is the raw release's column: convert the release with "
                f"`{invocation.command('prepare-data --source DIR')}`")
    raise DataError(f"{where}: missing field {field!r} (the line has {present}){hint}")


def _nonempty_str(record: Mapping[str, object], field: str, where: str) -> str:
    value = _require(record, field, where)
    if not isinstance(value, str) or not value.strip():
        raise DataError(f"{where}: field {field!r} must be a non-empty string, got {_described(value)}")
    return value


def example_from_dict(record: object, where: str) -> SearchExample:
    """Validate one decoded JSONL row; ``where`` (``file:line``) prefixes every error, which
    names the field (and for ``answers`` the item) at fault and what the line holds instead."""
    if not isinstance(record, dict):
        raise DataError(f"{where}: expected a JSON object with fields {', '.join(EXAMPLE_FIELDS)}, "
                        f"got {_described(record)}")
    id_ = _nonempty_str(record, "id", where)
    question = _nonempty_str(record, "question", where)
    answers = _require(record, "answers", where)
    source = _nonempty_str(record, "data_source", where)
    if not isinstance(answers, list):
        raise DataError(f"{where}: field 'answers' must be a list of answer strings, got {_described(answers)}")
    if not answers:
        raise DataError(f"{where}: field 'answers' is an empty list; a question needs at least one gold answer")
    for index, answer in enumerate(answers):
        if not isinstance(answer, str) or not answer.strip():
            raise DataError(f"{where}: field 'answers' item {index} must be a non-empty string, "
                            f"got {_described(answer)}")
    return SearchExample(id=id_, question=question, answers=tuple(answers), data_source=source)


def load_examples(path: str | os.PathLike[str]) -> list[SearchExample]:
    """Read a JSONL file of ``{id, question, answers, data_source}`` rows.

    Every row is validated; the first bad one raises DataError naming ``file:line`` and the
    field, so a broken file fails at load time rather than as a KeyError mid-training. Blank
    lines are ignored."""
    path = Path(path)
    return [example_from_dict(record, f"{path}:{number}")
            for number, record in iter_json_lines(path, error=DataError)]


def first_example(path: str | os.PathLike[str]) -> SearchExample | None:
    """The first row of a JSONL example file, validated as :func:`load_examples` validates
    every row (None for a file without rows). It reads one line, not the whole file: a quick
    check that the file is the right kind before anything slow starts."""
    path = Path(path)
    for number, record in iter_json_lines(path, error=DataError):
        return example_from_dict(record, f"{path}:{number}")
    return None


# --- orders and batches (pure) ---------------------------------------------------------


def shuffled_examples(
    path_or_examples: str | os.PathLike[str] | Sequence[SearchExample], seed: int
) -> list[SearchExample]:
    """A new list in a seeded random order (the input sequence is not modified)."""
    if isinstance(path_or_examples, (str, os.PathLike)):
        examples = load_examples(path_or_examples)
    else:
        examples = list(path_or_examples)
    random.Random(seed).shuffle(examples)
    return examples


def take_batch(examples: Sequence[SearchExample], start: int, batch_size: int) -> list[SearchExample]:
    """``batch_size`` examples starting at cursor ``start``, wrapping modulo ``len(examples)``.

    The trainer keeps the cursor in its run state and advances it by ``batch_size`` each step,
    so consecutive batches walk the data in order and a resumed run continues where it
    stopped. A batch larger than the data repeats examples; an empty list gives ``[]``."""
    if batch_size < 0:
        raise ValueError(f"batch_size must be >= 0, got {batch_size}")
    if not examples:
        return []
    n = len(examples)
    return [examples[(start + i) % n] for i in range(batch_size)]


def spread_across_sources(examples: Sequence[SearchExample], n: int) -> list[SearchExample]:
    """``n`` examples spread evenly over sources: round-robin over the source names in sorted
    order, taking each source's examples in file order, until ``n`` are taken or all are used.

    ``eval --limit N`` uses this instead of the first N lines, which would cover only the first
    source or two of a source-sorted dev set."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    queues: dict[str, list[SearchExample]] = defaultdict(list)
    for example in examples:
        queues[example.data_source].append(example)
    order = sorted(queues)
    chosen: list[SearchExample] = []
    depth = 0
    while len(chosen) < n and any(depth < len(queues[s]) for s in order):
        for source in order:
            if len(chosen) == n:
                break
            if depth < len(queues[source]):
                chosen.append(queues[source][depth])
        depth += 1
    return chosen


# --- file I/O ------------------------------------------------------------------------------


def _write_temp(directory: Path, name: str, data: bytes) -> Path:
    """Write ``data`` to a fsync'ed temporary file beside its destination (same filesystem, so
    the later rename is atomic)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        follow_umask(tmp)
    except OSError as error:
        Path(tmp).unlink(missing_ok=True)
        raise naming(error, directory / name) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def write_files_atomically(directory: str | os.PathLike[str], files: Mapping[str, bytes]) -> None:
    """Write every file to a temporary first and rename only once all are written, so a crash
    leaves either the previous file or the complete new one, never a truncated one. Callers put
    the manifest last: its sha256s tell whether the set on disk belongs together."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    temps: dict[str, Path] = {}
    try:
        for name, data in files.items():
            temps[name] = _write_temp(directory, name, data)
        for name, tmp in temps.items():
            os.replace(tmp, directory / name)
    finally:
        for tmp in temps.values():
            tmp.unlink(missing_ok=True)


def jsonl_bytes(examples: Iterable[SearchExample]) -> bytes:
    return "".join(json.dumps(example_to_dict(e), ensure_ascii=False) + "\n" for e in examples).encode(
        "utf-8"
    )


def parquet_columns(path: str | os.PathLike[str]) -> list[str]:
    import pyarrow.parquet as pq

    try:
        return list(pq.ParquetFile(path).schema_arrow.names)
    except Exception as exc:  # noqa: BLE001 - name the file whatever pyarrow raises
        raise DataError(f"{path}: not a readable parquet file ({exc})") from exc


def read_parquet_rows(path: str | os.PathLike[str]) -> Iterator[dict[str, object]]:
    """Rows of a release parquet file as dicts (only RAW_COLUMNS that the file has), streamed
    in record batches so the 170k-row train file never sits in memory as one Python list."""
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises ArrowInvalid, OSError…: name the file either way
        raise DataError(f"{path}: not a readable parquet file ({exc})") from exc
    columns = [c for c in RAW_COLUMNS if c in parquet.schema_arrow.names]
    if "question" not in columns:
        raise DataError(
            f"{path}: parquet file has no 'question' column (columns: {parquet.schema_arrow.names})"
        )
    for batch in parquet.iter_batches(columns=columns, batch_size=8192):
        yield from batch.to_pylist()


MODELSCOPE_DEFAULT_ENDPOINT = "https://modelscope.cn"
OFFLINE_HINT = "use --source DIR (a folder holding train.parquet and test.parquet) instead"
PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")
# Exception classes (by name, anywhere in an error's class hierarchy or cause chain) that mean the
# service could not be reached at all: builtins, socket, urllib3, requests, modelscope_hub.
_NETWORK_FAILURES = {
    "ConnectionError", "TimeoutError", "gaierror", "timeout", "NameResolutionError", "NewConnectionError",
    "MaxRetryError", "ConnectTimeout", "ReadTimeout", "Timeout", "NetworkError", "RequestTimeoutError",
}


def modelscope_host() -> str:
    """The host the ModelScope SDK will contact (``MODELSCOPE_ENDPOINT`` or its default)."""
    endpoint = (os.environ.get("MODELSCOPE_ENDPOINT") or os.environ.get("MODELSCOPE_DOMAIN")
                or MODELSCOPE_DEFAULT_ENDPOINT)
    if "://" not in endpoint:
        endpoint = f"https://{endpoint}"
    return urlsplit(endpoint).hostname or endpoint


def modelscope_resolvable(host: str | None = None) -> bool:
    """Whether the ModelScope host's name resolves. Without a network this fails at once, where
    the SDK would spend ~20 s on retries; behind a proxy the proxy resolves names, so say yes."""
    if any(os.environ.get(name) for name in PROXY_VARIABLES):
        return True
    try:
        socket.getaddrinfo(host or modelscope_host(), 443, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return False
    return True


def _error_chain(error: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def is_network_failure(error: BaseException) -> bool:
    """Whether ``error`` (or what caused it) says the service could not be reached."""
    return any(cls.__name__ in _NETWORK_FAILURES for e in _error_chain(error) for cls in type(e).__mro__)


def describe_download_failure(error: BaseException, *, revision: str = DATASET_REVISION) -> str:
    """One line for a failed download: unreachable, no such dataset/revision, or what happened."""
    first = " ".join(str(error).split())[:200] or type(error).__name__
    if is_network_failure(error):
        return f"cannot reach ModelScope ({modelscope_host()}); {OFFLINE_HINT}"
    if any(type(e).__name__ == "NotExistError" for e in _error_chain(error)):
        return f"ModelScope has no dataset {DATASET_ID} at revision {revision} ({first})"
    return (f"download of {DATASET_ID}@{revision} from ModelScope failed ({type(error).__name__}: {first}); "
            f"{OFFLINE_HINT}")


@contextmanager
def _quiet_loggers(names: Sequence[str] = ("modelscope", "modelscope_hub")) -> Iterator[None]:
    """Hold the SDK's loggers at ERROR: its retry warnings are not the user's business; the
    outcome is reported in one line."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def modelscope_downloader() -> Callable[..., str]:
    """``modelscope.dataset_snapshot_download`` (imported only when downloading: it is heavy)."""
    from modelscope import dataset_snapshot_download

    return dataset_snapshot_download


def download_raw(
    raw_dir: str | os.PathLike[str],
    *,
    revision: str = DATASET_REVISION,
    downloader: Callable[..., str] | None = None,
) -> dict[str, Path]:
    """Fetch train/test parquet of the pinned revision from ModelScope into ``raw_dir`` and
    return their paths. ``downloader`` defaults to :func:`modelscope_downloader`.

    The download goes to a hidden folder beside ``raw_dir`` and only the two parquet files move
    in when both arrived; on any failure (or Ctrl-C) that folder and every directory this call
    created are removed, so a failed download leaves nothing behind. Failures are DataError in
    one line (:func:`describe_download_failure`)."""
    raw_dir = Path(raw_dir)
    if downloader is None:
        if not modelscope_resolvable():
            raise DataError(f"cannot reach ModelScope ({modelscope_host()} does not resolve); {OFFLINE_HINT}")
        downloader = modelscope_downloader()
    staging: Path | None = None
    with removing_new_directories(raw_dir):
        try:
            raw_dir.parent.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=f".{raw_dir.name}.download-", dir=raw_dir.parent))
            try:
                with _quiet_loggers():
                    local = Path(downloader(DATASET_ID, revision=revision, local_dir=str(staging),
                                            allow_patterns=list(RAW_FILES.values())))
            except Exception as error:  # the SDK's own errors, requests', urllib3's...
                raise DataError(describe_download_failure(error, revision=revision)) from None
            fetched = {split: local / name for split, name in RAW_FILES.items()}
            missing = [name for name in RAW_FILES.values() if not (local / name).is_file()]
            if missing:
                raise DataError(f"download of {DATASET_ID}@{revision} did not produce {', '.join(missing)}")
            raw_dir.mkdir(exist_ok=True)
            for split, name in RAW_FILES.items():
                os.replace(fetched[split], raw_dir / name)
        except BaseException:
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)
            raise
    shutil.rmtree(staging, ignore_errors=True)
    return {split: raw_dir / name for split, name in RAW_FILES.items()}


class SplitSummary(TypedDict):
    file: str
    total: int
    per_source: dict[str, int]
    sha256: str


class DatasetManifest(TypedDict):
    """``manifest.json`` of a prepared dataset."""

    format: int
    source: dict[str, object]  # the provenance (kind, dataset id, revision) and the release's files
    seed: int
    dev_per_source: int
    question_normalisation: str
    splits: dict[str, SplitSummary]
    dropped: dict[str, dict[str, int]]  # per split, how many rows were dropped for each reason
    dev_short_sources: list[str]


def prepare_dataset(
    train_parquet: str | os.PathLike[str],
    test_parquet: str | os.PathLike[str],
    output_dir: str | os.PathLike[str],
    *,
    dev_per_source: int = DEFAULT_DEV_PER_SOURCE,
    seed: int = DEFAULT_SEED,
    provenance: Mapping[str, object] | None = None,
) -> DatasetManifest:
    """Clean both splits, drop train questions that also occur in test, sample the dev set from
    test, and write ``train.jsonl``, ``test.jsonl``, ``dev.jsonl`` and ``manifest.json``
    (atomically, manifest last). Returns the manifest.

    ``test.jsonl`` is the whole eval pool and ``dev.jsonl`` a subset of it (as in the lab port);
    neither shares a question with ``train.jsonl``."""
    train = clean_rows(read_parquet_rows(train_parquet), "train")
    test = clean_rows(read_parquet_rows(test_parquet), "test")
    for path, split in ((train_parquet, train), (test_parquet, test)):
        if not split.examples:
            dropped = ", ".join(f"{reason}={n}" for reason, n in sorted(split.dropped.items())) or "no rows"
            columns = ", ".join(repr(c) for c in parquet_columns(path))
            raise DataError(
                f"{path}: no usable row ({dropped}); its columns are {columns}, and a row needs 'question' "
                "and answers in 'golden_answers' (or reward_model.ground_truth.target)"
            )
    train_examples, overlapping = remove_overlap(train.examples, test.examples)
    train.dropped["duplicate_of_test_question"] = overlapping
    dev_examples = select_dev(test.examples, dev_per_source, seed)

    splits = {"train": train_examples, "test": test.examples, "dev": dev_examples}
    payloads = {f"{name}.jsonl": jsonl_bytes(examples) for name, examples in splits.items()}
    dev_sources = count_by_source(dev_examples)
    manifest: DatasetManifest = {
        "format": 1,
        "source": {
            **dict(provenance or {}),
            "files": {
                "train": {"path": str(train_parquet), "sha256": file_sha256(train_parquet)},
                "test": {"path": str(test_parquet), "sha256": file_sha256(test_parquet)},
            },
        },
        "seed": seed,
        "dev_per_source": dev_per_source,
        "question_normalisation": QUESTION_KEY_RULE,
        "splits": {
            name: {
                "file": f"{name}.jsonl",
                "total": len(examples),
                "per_source": count_by_source(examples),
                "sha256": hashlib.sha256(payloads[f"{name}.jsonl"]).hexdigest(),
            }
            for name, examples in splits.items()
        },
        "dropped": {
            "train": dict(sorted(train.dropped.items())),
            "test": dict(sorted(test.dropped.items())),
        },
        "dev_short_sources": sorted(
            [s for s in EVAL_SOURCES if dev_sources.get(s, 0) < dev_per_source]
            + [s for s, k in dev_sources.items() if s not in EVAL_SOURCES and k < dev_per_source]
        ),
    }
    payloads[MANIFEST_NAME] = (json.dumps(manifest, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
    write_files_atomically(output_dir, payloads)
    return manifest
