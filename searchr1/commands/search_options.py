"""Click options shared by every command that searches (train, eval, rollout).

``@search_options()`` adds the flags of :class:`~searchr1.search.options.SearchOptions` and
hands the command one ``search`` argument; :func:`searchr1.search.options.build_search_backend`
turns it into a backend (a replayed one when ``--cassette`` is given). Example::

    @click.command()
    @search_options(default_backend="wikipedia")
    def eval(search: SearchOptions, ...):
        backend = build_search_backend(search)
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from searchr1.commands.settings_options import call_with, setting_options, take_settings
from searchr1.search.options import SearchOptions


def search_options(default_backend: str = "wikipedia") -> Callable[[Callable[..., object]], Callable[..., object]]:
    """Decorator adding the search flags; the command receives ``search: SearchOptions``."""
    declared = setting_options(SearchOptions, defaults={"backend": default_backend}, section="search")

    def decorate(command: Callable[..., object]) -> Callable[..., object]:
        @functools.wraps(command)
        def wrapper(*args: object, **kwargs: object) -> object:
            kwargs["search"] = options_from_kwargs(kwargs)
            return command(*args, **kwargs)

        return declared(wrapper)

    return decorate


def options_from_kwargs(kwargs: dict[str, object]) -> SearchOptions:
    """Pop the search flags out of a command's kwargs."""
    return call_with(SearchOptions, take_settings(SearchOptions, kwargs))
