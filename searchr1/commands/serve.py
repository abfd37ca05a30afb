"""``serve``: a trained run behind an OpenAI-compatible ``/v1/chat/completions``."""

from __future__ import annotations

from pathlib import Path

import click

from searchr1.commands.help_layout import SectionedCommand, SectionOption
from searchr1.commands.options import (connect_timeout_option, rollout_config_from, rollout_options, run_guarded,
                                       sigterm_exits)
from searchr1.commands.search_options import SearchOptions, search_options
from searchr1.commands.server_access import server_access_options, server_key
from searchr1.commands.settings_options import given_params, pop_flag, pop_optional
from searchr1.offline import OFFLINE_POLICIES, OfflinePolicy


@click.command("serve", cls=SectionedCommand)
@click.option("--checkpoint", cls=SectionOption, section="run", default=None, metavar="RUN_DIR|PATH",
              help="A training run (its last checkpoint) or a sampler-weights path [default: the base model].")
@click.option("--offline", cls=SectionOption, section="run", is_flag=True,
              help="Serve the offline twin (no key, no network); its policy answers, and only the offline "
                   "questions.")
@click.option("--offline-home", cls=SectionOption, section="service",
              type=click.Path(file_okay=False, path_type=Path), default=None,
              help="The twin's checkpoint store of an offline checkpoint path (runs/<run>/twin).")
@click.option("--offline-policy", cls=SectionOption, section="service",
              type=click.Choice(OFFLINE_POLICIES), default=OfflinePolicy.LEARNING.value,
              help="With --offline: the policy the twin serves.")
@click.option("--base-model", cls=SectionOption, section="run", default="Qwen/Qwen3.5-4B")
@click.option("--host", cls=SectionOption, section="run", default="127.0.0.1", show_default=True,
              help="Address to listen on (0.0.0.0 to serve other machines; then --api-key).")
@click.option("--port", cls=SectionOption, section="run", type=click.IntRange(0, 65535), default=8000,
              show_default=True, help="Port to listen on (0: any free port, printed).")
@server_access_options(section="run")
@rollout_options(temperature=0.0, exclude=("group_size",))  # one trajectory per request
@click.option("--seed", cls=SectionOption, section="run", type=int, default=42, help="Sampling seed.")
@connect_timeout_option()
@search_options(default_backend="deepseek")
def serve(search: SearchOptions, **kwargs: object) -> None:
    """Serve a trained agent on an OpenAI-compatible /v1/chat/completions.

    A client that sends its own `tools` gets the model's calls back as OpenAI tool_calls and
    sends tool messages back. A question without tools (or with "agent": true, extra_body in the
    openai client) is answered by the agent: the server searches itself and answers with the
    final reply, its turns attached. Any other conversation without tools gets one turn, never
    tool-call markup. "stream": true streams chunks as OpenAI does. Rollout and search flags set
    what agent mode uses. A --host other machines reach needs --api-key. Ctrl-C stops it.

    \b
    %(prog)s serve --offline --checkpoint runs/<run-name>
    %(prog)s serve --checkpoint runs/<run-name> --backend zhihu --port 8000
    """
    run_guarded(lambda: _serve(search, kwargs))


def _serve(search: SearchOptions, kwargs: dict[str, object]) -> None:
    from searchr1.commands.ask import check_offline_question
    from searchr1.commands.checkpoint_flag import resolve_checkpoint
    from searchr1.commands.eval import _sampling_client, rollout_as_trained
    from searchr1.runtime.http_bounds import PortTakenError, listening_socket
    from searchr1.wiring.services import (check_base_model, check_search_setup, check_tool_setup, live_service,
                                           load_tokenizer, offline_scenario, offline_service, search_backend,
                                           tool_backends)
    from searchr1.runtime.api_key import is_loopback
    from searchr1.serve.access_log import print_to_stderr
    from searchr1.serve.app import make_server
    from searchr1.serve.model import ChatModel
    from searchr1.twin.policies import offline_policy_label

    named = given_params(click.get_current_context())
    host, port = pop_flag(kwargs, "host", str), pop_flag(kwargs, "port", int)
    api_key = server_key(host, kwargs)  # who may call it: refused before anything is read or started
    checkpoint, offline = pop_optional(kwargs, "checkpoint", str), pop_flag(kwargs, "offline", bool)
    offline_home, policy = pop_optional(kwargs, "offline_home", Path), pop_flag(kwargs, "offline_policy", str)
    base_model = pop_flag(kwargs, "base_model", str)
    connect_timeout = pop_optional(kwargs, "connect_timeout", float)
    rollout = rollout_config_from(kwargs, seed=pop_flag(kwargs, "seed", int), group_size=1)
    chosen = resolve_checkpoint(checkpoint, base_model=base_model, offline=offline, offline_home=offline_home,
                                offline_policy=policy)
    if chosen.from_run_dir:
        refuse_overridden({"--base-model": (base_model, chosen.base_model), "--offline": (offline, chosen.offline),
                           "--offline-policy": (policy, chosen.offline_policy)}, named, str(checkpoint))
    base_model, model_path, offline = chosen.base_model, chosen.model_path, chosen.offline
    offline_home, policy = chosen.offline_home, chosen.offline_policy
    if chosen.rendering is not None:
        rollout = rollout_as_trained(rollout, chosen.rendering)
    if "offline_policy" in named and not offline:
        raise click.UsageError("--offline-policy only applies with --offline")
    check_base_model(base_model)
    check_search_setup(search, offline=offline)
    check_tool_setup(rollout.tools, search)
    try:
        sock = listening_socket(host, port)  # a taken port is said before anything starts
    except PortTakenError as error:
        raise click.ClickException(str(error)) from None
    port = sock.getsockname()[1]
    tokenizer = load_tokenizer()
    import tempfile

    with sigterm_exits(), tempfile.TemporaryDirectory(prefix="searchr1-serve-") as scratch:
        home = offline_home or Path(scratch)
        capacity = rollout.sampling_concurrency
        service = (offline_service(home, tokenizer, offline_scenario(), policy=policy, sampling_concurrency=capacity)
                   if offline else live_service(connect_timeout, sampling_concurrency=capacity))
        sampler = _sampling_client(service, base_model, model_path, offline=offline, offline_home=offline_home)
        backend = search_backend(search, offline=offline)
        who = (f"the offline {offline_policy_label(policy)} (not the model)" if offline
               else f"{model_path or base_model} on PyTRIO")
        model = ChatModel(sampler=sampler, tokenizer=tokenizer, rollout=rollout, search=backend,
                          tools=tool_backends(rollout.tools, backend), name=model_path or base_model, policy=who,
                          check_question=(lambda question: check_offline_question(question, policy)) if offline
                          else None)
        access = "callers send the API key" if api_key is not None else (
            "anyone on this machine may call it" if is_loopback(host) else "ANYONE who reaches the port may call it")
        click.echo(f"serving {who} on http://{host}:{port}/v1/chat/completions (OpenAI-compatible; agent mode "
                   f"searches with {search.backend}; {access}; Ctrl-C stops)", err=True)
        print_to_stderr()  # one line per request
        make_server(model, host=host, port=port, api_key=api_key).run(sockets=[sock])  # its shutdown closes search


def refuse_overridden(given: dict[str, tuple[object, object]], named: set[str], run_dir: str) -> None:
    """A flag the user set (its parameter in ``named``) to another value than the run directory
    records (``given``: flag -> (as given, as recorded)) is a one-line usage error: the run's
    value would win."""
    for flag, (value, recorded) in given.items():
        name = flag.removeprefix("--").replace("-", "_")
        if name in named and value != recorded:
            shown = flag if isinstance(value, bool) else f"{flag} {value}"
            raise click.UsageError(f"{shown} contradicts {run_dir}, which records {name} = {recorded}; a run's "
                                   f"checkpoint is served as it was trained: drop {flag}")
