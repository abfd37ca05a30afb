"""The ``searchr1`` command group (``searchr1.cli:main``, also ``python cli.py``).

Commands are loaded lazily so that ``--help`` answers instantly and a command only imports
what it needs (the tokenizer and the SDK are heavy).
"""

from __future__ import annotations

import importlib

import click

# command name -> "module:attribute" of a click.Command
COMMANDS: dict[str, str] = {
    "demo": "searchr1.commands.demo:demo",
    "offline-data": "searchr1.commands.offline_data:offline_data",
    "train": "searchr1.commands.train:train",
    "rollout": "searchr1.commands.rollout:rollout",
    "golden": "searchr1.commands.golden:golden",
    "record": "searchr1.commands.record:record",
    "cassettes": "searchr1.commands.search_cassettes:cassettes",
    "zhihu-quota": "searchr1.commands.search_zhihu_quota:zhihu_quota",
    "probe-loss": "searchr1.commands.probe_loss:probe_loss",
    "prepare-data": "searchr1.commands.prepare_data:prepare_data",
    "plot": "searchr1.commands.plot:plot",
    "bench": "searchr1.commands.bench:bench",
    "mutants": "searchr1.commands.mutants:mutants",
    "eval": "searchr1.commands.eval:eval_command",
    "show": "searchr1.commands.show:show",
    "compare": "searchr1.commands.compare:compare",
    "export": "searchr1.commands.export:export",
    "ask": "searchr1.commands.ask:ask",
    "twin": "searchr1.commands.twin:twin",
    "index": "searchr1.commands.index:index",
    "retriever": "searchr1.commands.retriever:retriever",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = COMMANDS.get(name)
        if target is None:
            return None
        module_name, attribute = target.split(":")
        return getattr(importlib.import_module(module_name), attribute)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="searchr1")
def main() -> None:
    """Search-R1 on PyTRIO: teach an LLM when to search, what to search for, and when to answer.

    Live runs need PYTRIO_API_KEY and a search backend key. With --offline, train, eval and
    rollout run the same code, the real PyTRIO client included, against offline twins (a PyTRIO
    server on 127.0.0.1, recorded search cassettes) and the exact Qwen3.5 tokenizer: no key, no
    network.
    """
