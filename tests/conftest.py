"""Shared fixtures. The real Qwen3.5 tokenizer is built once per machine (cached on disk)
and loaded once per test session."""

from __future__ import annotations

import pytest

from searchr1.tokenizer import shared_tokenizer


@pytest.fixture(scope="session")
def tokenizer():
    return shared_tokenizer()
