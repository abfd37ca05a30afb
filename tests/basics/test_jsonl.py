"""The one JSON decoder and JSON Lines reader: whatever bytes a file holds, a reader yields
storable values or refuses with one line naming the file and the line."""

from __future__ import annotations

import json
import resource
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from searchr1.bm25.corpus import MAX_PASSAGE_BYTES, CorpusError, CorpusReader
from searchr1.bm25.index import FORMAT, FORMAT_VERSION
from searchr1.data.dataset import DataError, load_examples
from searchr1.basics.jsonl import (
    MAX_DEPTH,
    MAX_INT_DIGITS,
    JsonInputError,
    JsonLines,
    Surrogates,
    TornLines,
    decode_json,
)

# Pieces that reach every branch of the decoder: structure, escapes (lone and paired
# surrogates), bytes that are not UTF-8, long integers and the fields of a dataset or corpus row.
PIECES = st.sampled_from([
    b"{", b"}", b"[", b"]", b'"', b":", b",", b"\n", b" ", b"1", b"-", b"9" * 70, b"1e999", b"NaN",
    b'"\\udfff"', b'"\\ud83d\\ude00"', b"\\u", b"\xff", b"\xc3", b"\xe2\x82\xac", b"\x00",
    b'"id"', b'"question"', b'"answers"', b'"contents"', b'"x?"', b"true", b"null", b"[" * 80, b"]" * 80,
])
FILE_BYTES = st.one_of(st.binary(max_size=300), st.lists(PIECES, max_size=60).map(b"".join))
ROW = st.fixed_dictionaries({"id": st.text(max_size=5), "question": st.text(max_size=20),
                             "answers": st.lists(st.text(max_size=8), max_size=3)})


def depth(value) -> int:
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    return 0


def assert_one_line_naming(error: BaseException, name: str) -> None:
    text = str(error)
    assert text.startswith(name) or f" {name}" in text
    assert "\n" not in text


@settings(max_examples=300, deadline=None)
@given(data=FILE_BYTES, mend=st.booleans())
def test_decoding_any_bytes_gives_a_storable_bounded_value_or_one_line(data, mend):
    """Invariant: decode_json either returns a value that UTF-8 JSON can store (no lone
    surrogate), nested at most MAX_DEPTH deep, or raises JsonInputError with one line that
    starts with the place it was given; never another exception."""
    policy = Surrogates.MEND if mend else Surrogates.REFUSE
    try:
        value = decode_json(data, where="f.jsonl:3", surrogates=policy)
    except JsonInputError as error:
        assert str(error).startswith("f.jsonl:3: ") and "\n" not in str(error)
        return
    json.dumps(value, ensure_ascii=False).encode("utf-8")
    assert depth(value) <= MAX_DEPTH


@settings(max_examples=150, deadline=None)
@given(data=FILE_BYTES)
def test_a_dataset_file_of_any_bytes_loads_or_is_refused_naming_it(tmp_path_factory, data):
    """Invariant: load_examples reads any file to examples whose every field is storable text,
    or raises DataError with one line naming the file; never another exception."""
    path = tmp_path_factory.mktemp("data") / "rows.jsonl"
    path.write_bytes(data)
    try:
        examples = load_examples(path)
    except DataError as error:
        assert_one_line_naming(error, str(path))
        return
    for example in examples:
        json.dumps([example.id, example.question, *example.answers], ensure_ascii=False).encode("utf-8")


@settings(max_examples=150, deadline=None)
@given(data=FILE_BYTES, rows=st.lists(ROW, max_size=3))
def test_a_corpus_file_of_any_bytes_reads_or_is_refused_naming_it(tmp_path_factory, data, rows):
    """Invariant: CorpusReader yields passages of storable text from any file, or raises
    CorpusError with one line naming the file; never another exception."""
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    good = "".join(json.dumps({"id": r["id"] or "1", "contents": r["question"] or "t"}) + "\n" for r in rows)
    path.write_bytes(good.encode() + data)
    try:
        passages = list(CorpusReader(path))
    except CorpusError as error:
        assert_one_line_naming(error, str(path))
        return
    for passage in passages:
        (passage.id + passage.contents).encode("utf-8")


@pytest.mark.parametrize(("row", "says"), [
    (b"\xff\xfe garbage\n", "not UTF-8 text (byte 0xff at column 1)"),
    (b"[" * 100_000 + b"\n", f"nested deeper than {MAX_DEPTH} levels"),
    (b'{"id": ' + b"9" * 5000 + b', "question": "q?", "answers": ["a"]}\n', f"longer than {MAX_INT_DIGITS} digits"),
    (b'{"id": "x", "question": "q\\udfff?", "answers": ["a"]}\n', "field question holds a lone surrogate"),
    (b'{"id": "x", "question": "q?", "answers": ["\\udfff"]}\n', "field answers[0] holds a lone surrogate"),
    (b'{"id": "\\udfff", "question": "q?", "answers": ["a"]}\n', "field id holds a lone surrogate"),
])
def test_each_hostile_dataset_row_is_refused_naming_the_file_line_and_cause(tmp_path, row, says):
    path = tmp_path / "b.jsonl"
    path.write_bytes(b'{"id": "ok", "question": "q?", "answers": ["a"], "data_source": "nq"}\n' + row)
    with pytest.raises(DataError) as raised:
        load_examples(path)
    assert str(raised.value).startswith(f"{path}:2: ") and says in str(raised.value)


def test_a_proper_surrogate_pair_is_text_and_kept():
    assert decode_json(b'{"q": "\\ud83d\\ude00"}', where="f") == {"q": "\U0001F600"}


def test_mending_turns_each_lone_surrogate_into_the_replacement_character():
    assert decode_json(b'["a\\udfffb", {"\\ud800": 1}]', where="f", surrogates=Surrogates.MEND) == [
        "a\ufffdb", {"\ufffd": 1}]


def test_torn_lines_policies(tmp_path):
    path = tmp_path / "ledger.jsonl"
    path.write_bytes(b'{"a": 1}\n{"b": \n{"c": 3}\n{"d": ')
    with pytest.raises(JsonInputError, match=r"ledger\.jsonl:2: invalid JSON"):
        list(JsonLines(path))
    with pytest.raises(JsonInputError, match=r"ledger\.jsonl:2: "):
        list(JsonLines(path, torn=TornLines.LAST))
    skipped = JsonLines(path, torn=TornLines.SKIP)
    assert [n for n, _ in skipped] == [1, 3] and skipped.torn_lines == [2, 4]
    assert skipped.torn_text == ['{"b": ', '{"d": ']
    path.write_bytes(b'{"a": 1}\n{"d": ')
    last = JsonLines(path, torn=TornLines.LAST)
    assert list(last) == [(1, {"a": 1})] and last.torn_lines == [2]


def test_an_oversized_corpus_row_is_refused_without_being_held_whole(tmp_path):
    """A 100 MB row is refused at the passage cap; reading it costs the cap, not the row."""
    path = tmp_path / "corpus.jsonl"
    with path.open("wb") as handle:
        handle.write(b'{"id": 1, "contents": "')
        handle.write(b"a" * (100 * 1024 * 1024))
        handle.write(b'"}\n')
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    cap = MAX_PASSAGE_BYTES // 2**20
    with pytest.raises(CorpusError, match=rf"corpus\.jsonl:1: the line is longer than {cap} MiB"):
        list(CorpusReader(path))
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    if sys.platform.startswith("linux"):  # ru_maxrss is KiB there
        assert grown_kib < 64 * 1024


MANIFEST_VALUES = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.text(max_size=6)),
                               lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                               max_leaves=8)


@settings(max_examples=150, deadline=None)
@given(data=st.one_of(FILE_BYTES, st.fixed_dictionaries(
    {"format": st.sampled_from([FORMAT, "x"]), "format_version": st.sampled_from([FORMAT_VERSION, 0])},
    optional={"corpus": st.one_of(MANIFEST_VALUES, st.fixed_dictionaries({"rows": MANIFEST_VALUES,
                                                                          "sha256": MANIFEST_VALUES})),
              "tokenizer": MANIFEST_VALUES, "scorer": MANIFEST_VALUES},
).map(lambda manifest: json.dumps(manifest).encode())))
def test_an_index_manifest_of_any_content_is_read_or_refused_naming_the_index(tmp_path_factory, data):
    """Invariant: read_manifest gives a manifest holding every field an index reads (corpus.rows,
    corpus.sha256, tokenizer, scorer), or raises BM25IndexError with one line naming the index
    directory; never another exception."""
    from searchr1.bm25.index import MANIFEST_NAME, BM25IndexError, read_manifest

    directory = tmp_path_factory.mktemp("index")
    (directory / MANIFEST_NAME).write_bytes(data)
    try:
        manifest = read_manifest(directory)
    except BM25IndexError as error:
        assert_one_line_naming(error, str(directory))
        return
    assert isinstance(manifest["corpus"]["rows"], int) and isinstance(manifest["corpus"]["sha256"], str)
    assert isinstance(manifest["tokenizer"], dict) and isinstance(manifest["scorer"], dict)
