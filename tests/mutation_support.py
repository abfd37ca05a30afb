"""What mutation testing (docs/mutants.md) needs of the test session."""

from __future__ import annotations

from collections.abc import Iterator


def core_caches() -> Iterator[object]:
    """Every cache a loaded module of ``searchr1.core`` keeps at module level: a weak dictionary
    (per tokenizer) or a function with ``cache_clear``."""
    import sys
    import weakref

    for name, module in list(sys.modules.items()):
        if name == "searchr1.core" or name.startswith("searchr1.core."):
            for value in list(vars(module).values()):
                if isinstance(value, weakref.WeakKeyDictionary | weakref.WeakValueDictionary) or callable(
                        getattr(value, "cache_clear", None)):
                    yield value


def forget_core_caches() -> None:
    """Empty every cache the core keeps per tokenizer (template boundaries, the observation
    wrapper, the plain encoder, ...): a mutant's process is forked from the server that ran the
    clean tests, and a value cached there would stand in for the mutated code that computes it."""
    for cache in core_caches():
        if hasattr(cache, "cache_clear"):
            cache.cache_clear()
        else:
            cache.clear()
