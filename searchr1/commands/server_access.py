"""``--api-key`` and ``--allow-anyone``: who may call a server of ours (``serve``, ``retriever serve``).

Declared once here and taken by both commands; the rule they follow and the check of each
request are :mod:`searchr1.runtime.api_key`'s. The key is read from the flag or from
``$SEARCHR1_SERVE_API_KEY`` and held as a :class:`~searchr1.basics.secrets.Secret` from the moment
click reads it, so no ``repr`` of the command's arguments shows it.
"""

from __future__ import annotations

from collections.abc import Callable

import click

from searchr1.commands.help_layout import SectionOption
from searchr1.commands.settings_options import F, pop_flag, pop_optional
from searchr1.runtime.api_key import API_KEY_ENV, check_key_text, required_key
from searchr1.basics.secrets import Secret


def _secret(ctx: click.Context, param: click.Parameter, value: str | None) -> Secret | None:
    if value is None:
        return None
    problem = check_key_text(value)
    if problem is not None:
        raise click.BadParameter(problem, ctx=ctx, param=param)
    return Secret(value)


def server_access_options(section: str | None = None) -> Callable[[F], F]:
    """The two flags, listed under ``section`` of the command's --help (``None``: its own options)."""
    api_key = click.option(
        "--api-key", "api_key", envvar=API_KEY_ENV, show_envvar=True, default=None, metavar="KEY",
        callback=_secret, cls=SectionOption, section=section,
        help="Answer only requests that send `Authorization: Bearer KEY` (any other gets 401; GET /healthz "
             f"stays open). Prefer ${API_KEY_ENV}: a flag's value shows in the process list.")
    allow_anyone = click.option(
        "--allow-anyone", "allow_anyone", is_flag=True, cls=SectionOption, section=section,
        help="Serve without a key on a --host other machines reach: anyone who reaches the port may call it. "
             "Without it, such a --host needs --api-key.")

    def decorate(command: F) -> F:
        return api_key(allow_anyone(command))

    return decorate


def server_key(host: str, kwargs: dict[str, object]) -> Secret | None:
    """Pop the two flags out of a command's kwargs: the key a server on ``host`` requires
    (``None``: anyone may call it), or a usage error in one line (:func:`required_key`)."""
    return required_key(host, pop_optional(kwargs, "api_key", Secret), pop_flag(kwargs, "allow_anyone", bool))
