"""Data preparation and loading, on small parquet files written here with the release schema."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from searchr1.data import dataset as data
from searchr1.cli import main
from searchr1.core.types import SearchExample
from searchr1.data.dataset import (
    DataError,
    clean_answers,
    extract_answers,
    load_examples,
    question_key,
    shuffled_examples,
    spread_across_sources,
    take_batch,
)

# --- fixtures: parquet with the exact column layout of nq_hotpotqa_train ----------------------

SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("question", pa.string()),
        ("golden_answers", pa.list_(pa.string())),
        ("data_source", pa.string()),
        ("prompt", pa.list_(pa.struct([("content", pa.string()), ("role", pa.string())]))),
        ("ability", pa.string()),
        (
            "reward_model",
            pa.struct(
                [("ground_truth", pa.struct([("target", pa.list_(pa.string()))])), ("style", pa.string())]
            ),
        ),
        ("extra_info", pa.struct([("index", pa.int64()), ("split", pa.string())])),
    ]
)

NOBEL = "who got the first nobel prize in physics?"


def raw_row(id_, question, golden, source, *, target="same", split="test", index=0):
    target = golden if target == "same" else target
    return {
        "id": id_,
        "question": question,
        "golden_answers": golden,
        "data_source": source,
        "prompt": [{"content": f"Answer the question... Question: {question}\n", "role": "user"}],
        "ability": "fact-reasoning",
        "reward_model": {"ground_truth": {"target": target}, "style": "rule"},
        "extra_info": {"index": index, "split": split},
    }


def write_parquet(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), path)
    return path


PER_SOURCE_TEST = 12


def eval_pool_rows() -> list[dict]:
    rows = [raw_row("test_0", NOBEL, ["Wilhelm Conrad Röntgen"], "nq")]
    for source in data.EVAL_SOURCES:
        start = 1 if source == "nq" else 0
        for i in range(start, PER_SOURCE_TEST):
            rows.append(
                raw_row(
                    f"test_{i}", f"{source} question number {i}?", [f"{source} answer {i}"], source, index=i
                )
            )
    # dropped: no answers anywhere
    rows.append(raw_row("test_99", "popqa question without answers?", [], "popqa", target=[]))
    return rows


def train_rows() -> list[dict]:
    return [
        raw_row(
            "train_0",
            "who wrote hamlet?",
            ["William Shakespeare", " William Shakespeare ", ""],
            "nq",
            split="train",
        ),
        # same question as test nq/test_0 once case and the trailing "?" are normalised away
        raw_row("train_1", "Who got the first Nobel Prize in Physics", ["Röntgen"], "nq", split="train"),
        raw_row("train_2", "   ", ["orphan answer"], "nq", split="train"),
        # answers only in reward_model
        raw_row(
            "train_0", "capital of france?", None, "hotpotqa", target=["Paris", "Paris", " "], split="train"
        ),
        raw_row("train_1", "question with no answers at all?", None, "hotpotqa", target=None, split="train"),
        raw_row(
            "train_2", "what is the capital of italy?", ["  ", ""], "hotpotqa", target=["Rome"], split="train"
        ),
    ]


@pytest.fixture
def raw_dir(tmp_path: Path) -> Path:
    raw = tmp_path / "raw"
    raw.mkdir()
    write_parquet(raw / "train.parquet", train_rows())
    write_parquet(raw / "test.parquet", eval_pool_rows())
    return raw


def prepare(raw_dir: Path, out: Path, **kwargs) -> dict:
    return data.prepare_dataset(raw_dir / "train.parquet", raw_dir / "test.parquet", out, **kwargs)


# --- cleaning --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("  Paris ", ("Paris",)),
        (["a", " a", "b", "", "  ", None, "a"], ("a", "b")),
        (("x", 3), ("x", "3")),
        (None, ()),
        ({"target": ["x"]}, ()),
        ("   ", ()),
    ],
)
def test_clean_answers(value, expected):
    assert clean_answers(value) == expected


def test_extract_answers_falls_back_to_reward_model_target():
    assert extract_answers(
        {"golden_answers": None, "reward_model": {"ground_truth": {"target": ["Rome"]}}}
    ) == ("Rome",)
    assert extract_answers({"golden_answers": [""], "reward_model": {"ground_truth": ["Oslo"]}}) == ("Oslo",)
    assert extract_answers(
        {"golden_answers": ["A"], "reward_model": {"ground_truth": {"target": ["B"]}}}
    ) == ("A",)
    assert extract_answers({"reward_model": "rule"}) == ()


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("Who got the first Nobel Prize in Physics", NOBEL),
        ("who  got the first\tnobel prize in physics ?", NOBEL),
        ("Who got the first Nobel Prize in Physics？", NOBEL),  # full-width question mark (NFKC)
        ("ＷＨＯ got the first nobel prize in physics", NOBEL),  # full-width letters (NFKC)
    ],
)
def test_question_key_identifies_spelling_variants(a, b):
    assert question_key(a) == question_key(b)


def test_question_key_keeps_different_questions_apart():
    assert question_key("who wrote hamlet?") != question_key("who wrote macbeth?")


# --- prepare_dataset ---------------------------------------------------------------------------


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_prepare_counts_drops_and_removes_test_questions_from_train(raw_dir, tmp_path):
    out = tmp_path / "datasets"
    manifest = prepare(raw_dir, out)

    train = read_jsonl(out / "train.jsonl")
    test = read_jsonl(out / "test.jsonl")
    assert {r["question"] for r in train} == {
        "who wrote hamlet?",
        "capital of france?",
        "what is the capital of italy?",
    }
    assert manifest["dropped"]["train"] == {
        "duplicate_of_test_question": 1,
        "missing_answers": 1,
        "missing_question": 1,
    }
    assert manifest["dropped"]["test"] == {"missing_answers": 1}
    assert len(test) == PER_SOURCE_TEST * len(data.EVAL_SOURCES)
    assert manifest["splits"]["test"]["per_source"] == {s: PER_SOURCE_TEST for s in sorted(data.EVAL_SOURCES)}
    assert manifest["splits"]["train"]["per_source"] == {"hotpotqa": 2, "nq": 1}
    by_question = {r["question"]: r["answers"] for r in train}
    assert by_question["who wrote hamlet?"] == ["William Shakespeare"]
    assert by_question["capital of france?"] == ["Paris"]
    assert by_question["what is the capital of italy?"] == ["Rome"]
    test_keys = {question_key(r["question"]) for r in test}
    assert not any(question_key(r["question"]) in test_keys for r in train)


def test_prepare_dev_is_stratified_subset_of_test(raw_dir, tmp_path):
    out = tmp_path / "datasets"
    manifest = prepare(raw_dir, out, dev_per_source=10)
    dev = read_jsonl(out / "dev.jsonl")
    test = read_jsonl(out / "test.jsonl")
    assert Counter(r["data_source"] for r in dev) == {s: 10 for s in data.EVAL_SOURCES}
    assert all(r in test for r in dev)
    assert len({r["id"] for r in dev}) == len(dev)
    assert manifest["dev_short_sources"] == []


def test_prepare_ids_are_unique_although_release_ids_repeat_across_sources(raw_dir, tmp_path):
    out = tmp_path / "datasets"
    prepare(raw_dir, out)
    for name in ("train", "test"):
        ids = [r["id"] for r in read_jsonl(out / f"{name}.jsonl")]
        assert len(ids) == len(set(ids))
    assert "nq/test_0" in {r["id"] for r in read_jsonl(out / "test.jsonl")}


def test_prepare_manifest_hashes_match_the_files(raw_dir, tmp_path):
    out = tmp_path / "datasets"
    manifest = prepare(raw_dir, out, provenance={"kind": "local"})
    for name, split in manifest["splits"].items():
        assert split["sha256"] == hashlib.sha256((out / f"{name}.jsonl").read_bytes()).hexdigest()
        assert split["total"] == len(read_jsonl(out / f"{name}.jsonl"))
    assert (
        manifest["source"]["files"]["train"]["sha256"]
        == hashlib.sha256((raw_dir / "train.parquet").read_bytes()).hexdigest()
    )
    assert manifest["source"]["kind"] == "local"
    assert json.loads((out / "manifest.json").read_text()) == manifest


def test_prepare_is_deterministic_and_the_seed_matters(raw_dir, tmp_path):
    prepare(raw_dir, tmp_path / "a", seed=7)
    prepare(raw_dir, tmp_path / "b", seed=7)
    prepare(raw_dir, tmp_path / "c", seed=8)
    for name in ("train.jsonl", "test.jsonl", "dev.jsonl", "manifest.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert (tmp_path / "a" / "dev.jsonl").read_bytes() != (tmp_path / "c" / "dev.jsonl").read_bytes()


def test_select_dev_reports_short_sources(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    write_parquet(raw / "train.parquet", train_rows())
    write_parquet(
        raw / "test.parquet", [raw_row(f"t{i}", f"bamboogle q {i}?", ["a"], "bamboogle") for i in range(3)]
    )
    manifest = prepare(raw, tmp_path / "out", dev_per_source=5)
    assert manifest["splits"]["dev"]["per_source"] == {"bamboogle": 3}
    assert manifest["dev_short_sources"] == sorted(data.EVAL_SOURCES)


def test_select_dev_never_takes_one_question_twice():
    shared = "Which river flows through Paris?"
    examples = [SearchExample(f"{s}/0", shared, ("Seine",), s) for s in ("nq", "triviaqa", "popqa")]
    dev = data.select_dev(examples, per_source=1, seed=0)
    assert len(dev) == 1


def test_prepare_crash_leaves_previous_outputs_intact(raw_dir, tmp_path, monkeypatch):
    out = tmp_path / "datasets"
    prepare(raw_dir, out, seed=1)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    real_write_temp = data._write_temp
    calls = []

    def failing_write_temp(directory, name, payload):
        calls.append(name)
        if len(calls) == 3:
            raise OSError("disk full")
        return real_write_temp(directory, name, payload)

    monkeypatch.setattr(data, "_write_temp", failing_write_temp)
    with pytest.raises(OSError, match="disk full"):
        prepare(raw_dir, out, seed=2)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # no temp files, nothing replaced


def test_unreadable_parquet_names_the_file(tmp_path):
    bad = tmp_path / "train.parquet"
    bad.write_text("not parquet")
    with pytest.raises(DataError, match="train.parquet"):
        list(data.read_parquet_rows(bad))


# --- download --------------------------------------------------------------------------------


def test_download_raw_asks_for_the_pinned_revision_and_both_files(raw_dir, tmp_path):
    calls = []

    def fake_downloader(dataset_id, *, revision, local_dir, allow_patterns):
        calls.append((dataset_id, revision, sorted(allow_patterns)))
        for name in ("train.parquet", "test.parquet"):
            shutil.copy(raw_dir / name, Path(local_dir) / name)
        return local_dir

    paths = data.download_raw(tmp_path / "dl", downloader=fake_downloader)
    assert calls == [
        (
            "zhuangzhuang2023/nq_hotpotqa_train",
            "aa2da0496c1b1a50a66af7acabdf09c07a0cb79e",
            ["test.parquet", "train.parquet"],
        )
    ]
    assert paths == {"train": tmp_path / "dl" / "train.parquet", "test": tmp_path / "dl" / "test.parquet"}


def test_download_raw_without_files_names_what_is_missing(tmp_path):
    with pytest.raises(DataError, match="test.parquet"):
        data.download_raw(tmp_path / "dl", downloader=lambda *a, local_dir, **k: local_dir)


def test_a_successful_download_leaves_only_the_two_files(raw_dir, tmp_path):
    def downloader(dataset_id, *, revision, local_dir, allow_patterns):
        for name in ("train.parquet", "test.parquet"):
            shutil.copy(raw_dir / name, Path(local_dir) / name)
        (Path(local_dir) / ".msc").write_text("sdk bookkeeping")
        return local_dir

    data.download_raw(tmp_path / "ds" / "raw", downloader=downloader)
    assert sorted(p.name for p in (tmp_path / "ds").iterdir()) == ["raw"]
    assert sorted(p.name for p in (tmp_path / "ds" / "raw").iterdir()) == ["test.parquet", "train.parquet"]


class NetworkError(ConnectionError):
    """Shaped like modelscope_hub.errors.NetworkError (a ConnectionError)."""


def unreachable(dataset_id, *, revision, local_dir, allow_patterns):
    (Path(local_dir) / "train.parquet.incomplete").write_bytes(b"PAR1")  # a partial file, then the failure
    try:
        raise OSError(-2, "Name or service not known")
    except OSError as cause:
        raise NetworkError("[E1020] Connection failed: Max retries exceeded\n(many more lines)") from cause


def test_prepare_data_without_network_is_one_line_and_leaves_nothing_behind(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "modelscope_resolvable", lambda host=None: True)  # let the SDK be tried
    monkeypatch.setattr(data, "modelscope_downloader", lambda: unreachable)
    monkeypatch.delenv("MODELSCOPE_ENDPOINT", raising=False)
    monkeypatch.delenv("MODELSCOPE_DOMAIN", raising=False)
    result = CliRunner().invoke(main, ["prepare-data", "--output-dir", str(tmp_path / "datasets")])
    assert result.exit_code == 1
    assert result.output == ("Error: cannot reach ModelScope (modelscope.cn); use --source DIR (a folder holding "
                             "train.parquet and test.parquet) instead\n")
    assert list(tmp_path.iterdir()) == []  # no datasets/, no datasets/raw, no partial download


def test_an_unresolvable_host_fails_at_once_without_loading_the_sdk(tmp_path, monkeypatch):
    import socket

    def no_dns(*args, **kwargs):
        raise socket.gaierror(-2, "Name or service not known")

    def must_not_load():
        raise AssertionError("the SDK was loaded although the host does not resolve")

    for name in data.PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MODELSCOPE_ENDPOINT", "https://hub.example.invalid")
    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    monkeypatch.setattr(data, "modelscope_downloader", must_not_load)
    with pytest.raises(DataError, match=r"^cannot reach ModelScope \(hub\.example\.invalid does not resolve\); use --source DIR"):
        data.download_raw(tmp_path / "datasets" / "raw")
    assert list(tmp_path.iterdir()) == []


def test_behind_a_proxy_the_name_check_is_left_to_the_proxy(monkeypatch):
    import socket

    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: pytest.fail("resolved a name behind a proxy"))
    assert data.modelscope_resolvable("modelscope.cn")


class NotExistError(Exception):
    """Shaped like modelscope_hub.errors.NotExistError."""


@pytest.mark.parametrize(("error", "expected"), [
    (TimeoutError("read timed out"), "cannot reach ModelScope"),
    (NotExistError("[E2003] revision not found"), "ModelScope has no dataset zhuangzhuang2023/nq_hotpotqa_train "
                                                  "at revision aa2da04"),
    (RuntimeError("boom\nsecond line"), "from ModelScope failed (RuntimeError: boom second line); use --source DIR"),
])
def test_download_failures_are_one_line_saying_what_happened(tmp_path, error, expected):
    def failing(*args, **kwargs):
        raise error

    with pytest.raises(DataError) as info:
        data.download_raw(tmp_path / "raw", downloader=failing)
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_ctrl_c_during_a_download_leaves_an_existing_raw_folder_as_it_was(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "train.parquet").write_bytes(b"old train")

    def interrupted(*args, local_dir, **kwargs):
        (Path(local_dir) / "train.parquet").write_bytes(b"half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        data.download_raw(raw, downloader=interrupted)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raw"]
    assert [p.name for p in raw.iterdir()] == ["train.parquet"]
    assert (raw / "train.parquet").read_bytes() == b"old train"


# --- CLI -------------------------------------------------------------------------------------------


def test_cli_prepare_data_from_a_local_directory(raw_dir, tmp_path):
    out = tmp_path / "ds"
    result = CliRunner().invoke(
        main, ["prepare-data", "--source", str(raw_dir), "--output-dir", str(out), "--dev-per-source", "2"]
    )
    assert result.exit_code == 0, result.output
    assert "dev: total=14" in result.output
    assert "train: total=3; hotpotqa=2, nq=1" in result.output
    assert "duplicate_of_test_question=1" in result.output
    assert sorted(p.name for p in out.iterdir()) == [
        "dev.jsonl",
        "manifest.json",
        "test.jsonl",
        "train.jsonl",
    ]


def test_cli_prepare_data_from_explicit_files_and_download_path(raw_dir, tmp_path, monkeypatch):
    out = tmp_path / "ds"
    args = [
        "prepare-data",
        "--train-parquet",
        str(raw_dir / "train.parquet"),
        "--test-parquet",
        str(raw_dir / "test.parquet"),
    ]
    assert CliRunner().invoke(main, [*args, "--output-dir", str(out)]).exit_code == 0

    monkeypatch.setattr(
        data,
        "download_raw",
        lambda raw: {"train": raw_dir / "train.parquet", "test": raw_dir / "test.parquet"},
    )
    result = CliRunner().invoke(main, ["prepare-data", "--output-dir", str(tmp_path / "dl")])
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "dl" / "manifest.json").read_text())
    assert manifest["source"]["revision"] == data.DATASET_REVISION


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--train-parquet", "TRAIN"], "must be given together"),
        (["--source", "RAW", "--train-parquet", "TRAIN", "--test-parquet", "TRAIN"], "not both"),
    ],
)
def test_cli_prepare_data_rejects_conflicting_sources(raw_dir, tmp_path, extra, message):
    extra = [a.replace("TRAIN", str(raw_dir / "train.parquet")).replace("RAW", str(raw_dir)) for a in extra]
    result = CliRunner().invoke(main, ["prepare-data", *extra, "--output-dir", str(tmp_path / "o")])
    assert result.exit_code != 0
    assert message in result.output


def test_cli_prepare_data_source_directory_without_files(tmp_path):
    result = CliRunner().invoke(
        main, ["prepare-data", "--source", str(tmp_path), "--output-dir", str(tmp_path / "o")]
    )
    assert result.exit_code != 0
    assert "train.parquet" in result.output


# --- load_examples ------------------------------------------------------------------------


GOOD = {"id": "nq/1", "question": "q?", "answers": ["a"], "data_source": "nq"}


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_load_examples_round_trips_prepared_files(raw_dir, tmp_path):
    out = tmp_path / "ds"
    prepare(raw_dir, out)
    examples = load_examples(out / "train.jsonl")
    assert [data.example_to_dict(e) for e in examples] == read_jsonl(out / "train.jsonl")
    assert all(isinstance(e.answers, tuple) for e in examples)


@pytest.mark.parametrize(
    ("bad_line", "fragment"),
    [
        ('{"id": "nq/2", "question": "q?", "answers": ["a"]', "invalid JSON"),
        (json.dumps({k: v for k, v in GOOD.items() if k != "answers"}), "missing field 'answers'"),
        (json.dumps({k: v for k, v in GOOD.items() if k != "id"}), "missing field 'id'"),
        (json.dumps({**GOOD, "answers": "a"}), "field 'answers' must be a list of answer strings, got a string \"a\""),
        (json.dumps({**GOOD, "answers": []}), "field 'answers' is an empty list"),
        (json.dumps({**GOOD, "answers": ["a", 3]}), "field 'answers' item 1 must be a non-empty string, got a number 3"),
        (json.dumps({**GOOD, "answers": ["a", " "]}), "field 'answers' item 1 must be a non-empty string"),
        (json.dumps({**GOOD, "question": "  "}), "field 'question' must be a non-empty string, got a string"),
        (json.dumps({**GOOD, "data_source": None}), "field 'data_source' must be a non-empty string, got null"),
        (json.dumps({**GOOD, "id": 7}), "field 'id' must be a non-empty string, got a number 7"),
        (json.dumps(["not", "an", "object"]), "expected a JSON object with fields id, question, answers, data_source, got a list"),
    ],
)
def test_load_examples_names_file_line_and_field(tmp_path, bad_line, fragment):
    path = write_lines(tmp_path / "d.jsonl", [json.dumps(GOOD), "", bad_line])
    with pytest.raises(DataError) as info:
        load_examples(path)
    assert f"{path}:3:" in str(info.value)
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


def test_a_missing_field_lists_the_fields_the_line_has_and_spots_the_raw_release_column(tmp_path):
    raw_row = {"id": "train_0", "question": "q?", "golden_answers": ["a"], "data_source": "nq"}
    path = write_lines(tmp_path / "raw.jsonl", [json.dumps(raw_row)])
    with pytest.raises(DataError) as info:
        load_examples(path)
    message = str(info.value)
    assert message.startswith(f"{path}:1: missing field 'answers' (the line has 'id', 'question', 'golden_answers'")
    assert "prepare-data" in message


def test_a_release_file_whose_rows_all_lack_answers_is_refused_naming_its_columns(tmp_path):
    folder = tmp_path / "raw"
    folder.mkdir()
    rows = [{"id": f"train_{i}", "question": f"q{i}?", "answer": "x", "data_source": "nq"} for i in range(3)]
    pq.write_table(pa.Table.from_pylist(rows), folder / "train.parquet")
    pq.write_table(pa.Table.from_pylist([{**r, "id": f"test_{i}"} for i, r in enumerate(rows)]),
                   folder / "test.parquet")
    with pytest.raises(DataError) as info:
        prepare(folder, tmp_path / "out")
    message = str(info.value)
    assert "train.parquet" in message and "missing_answers=3" in message
    assert "'answer'" in message and "golden_answers" in message
    assert not (tmp_path / "out").exists()


# --- orders and batches (properties) -------------------------------------------------------

SOURCES = st.sampled_from(["nq", "hotpotqa", "popqa", "bamboogle"])


def make_examples(sources: list[str]) -> list[SearchExample]:
    return [SearchExample(f"e{i}", f"question {i}?", ("a",), s) for i, s in enumerate(sources)]


@given(n=st.integers(1, 40), batch=st.integers(1, 17), epochs=st.integers(1, 3), cursor=st.integers(-50, 50))
def test_take_batch_visits_every_example_once_per_epoch(n, batch, epochs, cursor):
    examples = make_examples(["nq"] * n)
    # n * epochs batches of `batch` examples = batch * epochs whole epochs
    seen: list[SearchExample] = []
    for _ in range(n * epochs):
        seen += take_batch(examples, cursor, batch)
        cursor += batch
    assert Counter(e.id for e in seen) == {e.id: batch * epochs for e in examples}


@given(n=st.integers(1, 30), batch=st.integers(0, 40), cursor=st.integers(0, 200))
def test_take_batch_from_a_stored_cursor_continues_the_sequence(n, batch, cursor):
    examples = make_examples(["nq"] * n)
    stream = [examples[i % n] for i in range(cursor + batch)]
    assert take_batch(examples, cursor, batch) == stream[cursor:]


def test_take_batch_of_no_examples_is_empty_and_negative_size_is_refused():
    assert take_batch([], 5, 8) == []
    with pytest.raises(ValueError, match="batch_size"):
        take_batch(make_examples(["nq"]), 0, -1)


@given(n=st.integers(0, 40), seed=st.integers(0, 2**32))
def test_shuffled_examples_is_a_reproducible_permutation(n, seed):
    examples = make_examples(["nq"] * n)
    original = list(examples)
    first = shuffled_examples(examples, seed)
    assert sorted(first, key=lambda e: e.id) == sorted(original, key=lambda e: e.id)
    assert shuffled_examples(examples, seed) == first
    assert examples == original  # input untouched


def test_shuffled_examples_reads_a_path_and_seeds_differ(tmp_path):
    path = write_lines(tmp_path / "d.jsonl", [json.dumps({**GOOD, "id": f"nq/{i}"}) for i in range(30)])
    assert shuffled_examples(path, 1) == shuffled_examples(str(path), 1)
    assert shuffled_examples(path, 1) != shuffled_examples(path, 2)


@settings(max_examples=200)
@given(sources=st.lists(SOURCES, max_size=40), n=st.integers(0, 50))
def test_spread_across_sources_balances_sources_until_they_run_out(sources, n):
    examples = make_examples(sources)
    picked = spread_across_sources(examples, n)
    available = Counter(sources)
    taken = Counter(e.data_source for e in picked)
    assert len(picked) == min(n, len(examples))
    assert len({e.id for e in picked}) == len(picked)
    # a source that still had examples left was never more than one behind another source
    for s, k in taken.items():
        for other in available:
            if taken[other] < available[other]:
                assert taken[other] >= k - 1
    # within a source the file order is kept
    for s in available:
        ids = [e.id for e in picked if e.data_source == s]
        assert ids == [e.id for e in examples if e.data_source == s][: len(ids)]


def test_spread_across_sources_is_not_the_first_lines():
    examples = make_examples(["bamboogle"] * 10 + ["hotpotqa"] * 10 + ["nq"] * 10)
    assert Counter(e.data_source for e in spread_across_sources(examples, 6)) == {
        "bamboogle": 2,
        "hotpotqa": 2,
        "nq": 2,
    }
    with pytest.raises(ValueError):
        spread_across_sources(examples, -1)
