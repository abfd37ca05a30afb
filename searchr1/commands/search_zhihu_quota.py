"""``zhihu-quota``: the remaining Zhihu search quota of every configured key."""

from __future__ import annotations

import asyncio
from pathlib import Path

import click

from searchr1.commands.help_layout import SectionedCommand
from searchr1.search.env import MissingApiKeyError
from searchr1.search.factory import create_search_backend
from searchr1.search.zhihu import DEFAULT_BASE_URL, KeyQuota, ZhihuSearchBackend


def format_quota_table(quotas: list[KeyQuota]) -> str:
    lines = [f"{'key':<12} {'api':<16} {'total':>8} {'used':>8} {'remaining':>10}"]
    for quota in quotas:
        label = f"#{quota.key_number} {quota.fingerprint[:6]}"
        if quota.error:
            lines.append(f"{label:<12} error: {quota.error}")
            continue
        if not quota.rows:
            lines.append(f"{label:<12} (no quota rows returned)")
        for row in quota.rows:

            def show(value: int | None) -> str:
                return "?" if value is None else str(value)

            numbers = f"{show(row.total):>8} {show(row.used):>8} {show(row.remaining):>10}"
            lines.append(f"{label:<12} {row.api_id:<16} {numbers}")
    return "\n".join(lines)


@click.command(
    name="zhihu-quota",
    cls=SectionedCommand,
    help="""Show the remaining Zhihu quota of each key in ZHIHU_SEARCH_KEYS.

Asks GET /api/v1/quota (free: it does not consume quota) once per key. Keys are shown by
position and a short hash, never in full.""",
)
@click.option(
    "--search-env-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="dotenv file with ZHIHU_SEARCH_KEYS [default: ./.env].",
)
@click.option("--base-url", default=DEFAULT_BASE_URL, show_default=True, help="Zhihu open platform URL.")
@click.option(
    "--api",
    "api_ids",
    multiple=True,
    default=("global_search", "zhihu_search"),
    show_default=True,
    help="API ids to ask about (repeatable).",
)
def zhihu_quota(search_env_file: Path | None, base_url: str, api_ids: tuple[str, ...]) -> None:
    try:
        backend = create_search_backend("zhihu", env_file=search_env_file, base_url=base_url)
    except MissingApiKeyError as exc:
        raise click.ClickException(str(exc)) from None
    assert isinstance(backend, ZhihuSearchBackend)  # the factory's zhihu backend

    async def ask() -> list[KeyQuota]:
        async with backend:
            return await backend.quota(api_ids)

    quotas = asyncio.run(ask())
    click.echo(format_quota_table(quotas))
    if all(q.error for q in quotas):
        raise click.ClickException("no key's quota could be read")
