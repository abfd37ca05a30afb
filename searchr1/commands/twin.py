"""``twin serve``: the offline PyTRIO twin as a server for other programs."""

from __future__ import annotations

import errno
import signal
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import click

from searchr1.commands.help_layout import SectionedGroup, SectionOption
from searchr1.twin.policies import POLICY_NAMES
from searchr1.commands.options import offline_fault_option
from searchr1.commands.settings_options import FiniteFloatRange, call_with

if TYPE_CHECKING:
    from searchr1.twin.policy import Reduction
    from searchr1.twin.training_run import Accumulation

REDUCTIONS = ("per_token", "per_sample", "sum")


@click.group(cls=SectionedGroup)
def twin() -> None:
    """The offline twin of PyTRIO: a PyTRIO server on 127.0.0.1 that the real client talks to."""


@twin.command("serve", context_settings={"show_default": True})
@click.option("--port", cls=SectionOption, section="run",
              type=click.IntRange(0, 65535), default=0, help="0: a free port.")
@click.option("--home", cls=SectionOption, section="run",
              type=click.Path(file_okay=False, path_type=Path), default=Path("runs/twin"),
              help="Where runs and checkpoints are kept (a later twin on the same home resumes them).")
@click.option("--policy", cls=SectionOption, section="run",
              type=click.Choice(POLICY_NAMES), default="scripted", help="The model the twin serves.")
@click.option("--scenario", cls=SectionOption, section="run",
              type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="With --policy scripted: the scenario file [default: the shipped offline world].")
@click.option("--api-key", cls=SectionOption, section="run",
              default=None, help="The key clients must send [default: twin-local-key].")
@click.option("--reduction", cls=SectionOption, section="service", type=click.Choice(REDUCTIONS), default="per_token",
              help="How one forward_backward call's loss is reduced.")
@click.option("--accumulation", cls=SectionOption, section="service", type=click.Choice(("sum", "mean")), default="sum",
              help="How several forward_backward calls before one optim_step combine.")
@click.option("--max-seq-len", cls=SectionOption, section="service",
              type=click.IntRange(min=1), default=None, help="Training and sampling limit.")
@click.option("--max-tokens-per-request", cls=SectionOption, section="service",
              type=click.IntRange(min=1), default=None,
              help="Training and sampling limit.")
@click.option("--max-batch-size", cls=SectionOption, section="service",
              type=click.IntRange(min=1), default=None, help="Training and sampling limit.")
@click.option("--stop-token-in-tokens/--no-stop-token-in-tokens", cls=SectionOption, section="service", default=True,
              help="Return the stop token (and its logprob) at the end of a stopped sequence.")
@click.option("--stop-string-in-text/--no-stop-string-in-text", cls=SectionOption, section="service", default=False,
              help="Keep the stop string at the end of the returned text.")
@click.option("--sample-latency", cls=SectionOption, section="latency",
              type=FiniteFloatRange(min=0), default=0.0, help="Seconds per sampling request.")
@click.option("--token-latency", cls=SectionOption, section="latency", type=FiniteFloatRange(min=0), default=0.0,
              help="Seconds per token of a request's longest sampled sequence.")
@click.option("--train-token-latency", cls=SectionOption, section="latency", type=FiniteFloatRange(min=0), default=0.0,
              help="Seconds per trained (input) token.")
@click.option("--optim-latency", cls=SectionOption, section="latency",
              type=FiniteFloatRange(min=0), default=0.0, help="Seconds per optimiser step.")
@click.option("--save-latency", cls=SectionOption, section="latency",
              type=FiniteFloatRange(min=0), default=0.0, help="Seconds per checkpoint save.")
@click.option("--strict/--no-strict", cls=SectionOption, section="service", default=True,
              help="Fail training events that break the protocol (see searchr1/twin/strict.py).")
@click.option("--max-staleness", cls=SectionOption, section="service", type=click.IntRange(min=0), default=0,
              help="Optimiser steps a sampler may lag behind the run it trains (strict mode).")
@offline_fault_option()
def serve(**options: object) -> None:
    """Serve until Ctrl-C. The first line printed is the address to export:

    \b
        PYTRIO_BASE_URL=http://127.0.0.1:<port>
    Then any program using `pytrio.ServiceClient()` with PYTRIO_API_KEY=twin-local-key (or
    --api-key) trains and samples on the twin, with no network.
    """
    from searchr1.commands.options import run_guarded

    run_guarded(lambda: call_with(_serve, options))


def _serve(port: int, home: Path, policy: str, scenario: Path | None, api_key: str | None, reduction: Reduction,
           accumulation: Accumulation, max_seq_len: int | None, max_tokens_per_request: int | None,
           max_batch_size: int | None, stop_token_in_tokens: bool, stop_string_in_text: bool,
           sample_latency: float, token_latency: float, train_token_latency: float, optim_latency: float,
           save_latency: float, strict: bool, max_staleness: int, offline_fault: str | None) -> None:
    from searchr1.runtime.tokenizer import shared_tokenizer
    from searchr1.twin import Latencies, OperationLimits, StopConvention, Strictness, TwinFaults, TwinLimits, start_twin
    from searchr1.twin.client import TWIN_API_KEY
    from searchr1.twin.config import parse_offline_fault

    if scenario is not None and policy != "scripted":
        raise click.UsageError("--scenario only applies with --policy scripted")
    limits = OperationLimits(max_batch_size, max_tokens_per_request, max_seq_len)
    stopped = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    try:
        try:
            started = start_twin(
                home=home, port=port, policy=policy, scenario=scenario, tokenizer=shared_tokenizer(),
                api_key=api_key or TWIN_API_KEY, reduction=reduction, accumulation=accumulation,
                limits=TwinLimits(training=limits, sampling=limits),
                convention=StopConvention(stop_token_in_tokens, stop_string_in_text),
                latencies=Latencies(sample_latency, token_latency, train_token_latency, optim_latency, save_latency),
                strictness=Strictness(enabled=strict, max_staleness=max_staleness),
                faults=TwinFaults(**parse_offline_fault(offline_fault or "none")),
            )
        except OSError as error:
            if error.errno != errno.EADDRINUSE:
                raise
            raise click.ClickException(f"port {port} on 127.0.0.1 is taken (another server listens there); "
                                       "stop it or pick another --port") from None
        with started as served:
            click.echo(f"PYTRIO_BASE_URL={served.base_url}")
            key_hint = "" if api_key else f"PYTRIO_API_KEY={TWIN_API_KEY} "
            click.echo(f"# serving policy {policy!r} from {home}; run your program with "
                       f"{key_hint}PYTRIO_BASE_URL={served.base_url}; Ctrl-C stops", err=True)
            try:
                while not stopped.wait(0.5):
                    pass
            except KeyboardInterrupt:
                pass
            for violation in served.violations:
                click.echo(f"protocol violation: {violation}", err=True)
    finally:
        signal.signal(signal.SIGTERM, previous)
