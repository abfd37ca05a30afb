"""What mutation testing (docs/mutants.md) needs of the test session."""

from __future__ import annotations


def forget_core_caches() -> None:
    """Empty every cache the core keeps per tokenizer (template boundaries, the observation
    wrapper, the plain encoder, ...): a mutant's process is forked from the server that ran the
    clean tests, and a value cached there would stand in for the mutated code that computes it."""
    import sys
    import weakref

    for name, module in list(sys.modules.items()):
        if name == "searchr1.core" or name.startswith("searchr1.core."):
            for value in list(vars(module).values()):
                if isinstance(value, weakref.WeakKeyDictionary | weakref.WeakValueDictionary):
                    value.clear()
                elif callable(getattr(value, "cache_clear", None)):
                    value.cache_clear()
