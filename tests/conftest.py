"""Shared fixtures. The real Qwen3.5 tokenizer is built once per machine (cached on disk)
and loaded once per test session."""

from __future__ import annotations

import pytest

from searchr1.tokenizer import shared_tokenizer


@pytest.fixture(scope="session")
def tokenizer():
    return shared_tokenizer()


@pytest.fixture(scope="session", autouse=True)
def _sdk_loads_the_twins_tokenizer_once():
    """pytrio loads the model's tokenizer with ModelScope in the first forward_backward of every
    training client (about two seconds each). The twin serves it from a local directory; the
    suite loads each such directory once per session and hands the SDK that same object."""
    import os

    import modelscope

    original = modelscope.AutoTokenizer
    loaded: dict[str, object] = {}

    class OncePerDirectory:
        @staticmethod
        def from_pretrained(name, *args, **kwargs):
            key = os.path.realpath(str(name))
            if not os.path.isdir(key):
                return original.from_pretrained(name, *args, **kwargs)
            if key not in loaded:
                loaded[key] = original.from_pretrained(name, *args, **kwargs)
            return loaded[key]

    modelscope.AutoTokenizer = OncePerDirectory
    yield
    modelscope.AutoTokenizer = original


@pytest.fixture(autouse=True)
def _twin_protocol_is_clean():
    """A test fails when a twin recorded a strict-mode violation that the test did not take
    (negative tests take theirs with ``twin.take_violations()``)."""
    import sys

    yield
    server = sys.modules.get("searchr1.twin.server")
    if server is None:
        return
    found = server.untaken_violations()
    if found:
        pytest.fail("the twin recorded protocol violations:\n" + "\n".join(found))
