"""``searchr1 probe-loss``: how does the service reduce the loss? (see ``searchr1.tools.probe_loss``)"""

from __future__ import annotations

import os
import tempfile
from typing import TYPE_CHECKING

import click

from searchr1.commands.help_layout import SectionedCommand, SectionOption
from searchr1.tools.probe_loss import DEFAULT_BASE_MODEL
from searchr1.commands.options import connect_timeout_option

if TYPE_CHECKING:
    from searchr1.twin.policy import Reduction
    from searchr1.twin.training_run import Accumulation

REDUCTION_CHOICES = ("per_token", "per_sample", "sum")


@click.command("probe-loss", cls=SectionedCommand)
@click.option(
    "--base-model", cls=SectionOption, section="run",
    default=DEFAULT_BASE_MODEL,
    show_default=True,
    help="Model of the probe's training run.",
)
@click.option(
    "--lora-rank", cls=SectionOption, section="run",
    default=32,
    show_default=True,
    type=click.IntRange(4, 64),
    help="LoRA rank of that run.",
)
@click.option("--offline", cls=SectionOption, section="run", is_flag=True,
              help="Probe the offline twin (the real client against a PyTRIO server on 127.0.0.1) instead.")
@click.option(
    "--twin-reduction", cls=SectionOption, section="service",
    type=click.Choice(REDUCTION_CHOICES),
    default="per_token",
    show_default=True,
    help="With --offline: the twin's reduction within a call.",
)
@click.option(
    "--twin-accumulation", cls=SectionOption, section="service",
    type=click.Choice(("sum", "mean")),
    default="sum",
    show_default=True,
    help="With --offline: how the twin combines calls before one optim_step.",
)
@click.option(
    "--yes", "-y", cls=SectionOption, section="run", is_flag=True,
    help="Do not ask before creating the (billed) live training run."
)
@connect_timeout_option()
def probe_loss(
    base_model: str,
    lora_rank: int,
    offline: bool,
    twin_reduction: Reduction,  # one of REDUCTION_CHOICES, as click.Choice gives it
    twin_accumulation: Accumulation,
    yes: bool,
    connect_timeout: float,
) -> None:
    """Find out whether the service reduces a loss per token, per sample or by sum, and
    whether the lab port's manual n_k/N micro-batch reweighting is therefore exact; and whether its
    ppo, cispo and dro losses compute what Tinker documents (clip bounds, which tokens keep a
    gradient, dro's beta). --offline shows the expected answers against the twin.

    Live (default) this creates ONE LoRA training run and sends a handful of tiny
    forward / forward_backward / optim_step calls at learning rate 0. Needs PYTRIO_API_KEY
    (or a profile saved by `trio login`).
    """
    from searchr1.tools.probe_loss import probe_loss as run_probe

    if offline:
        from searchr1.runtime.tokenizer import shared_tokenizer
        from searchr1.twin import Strictness, start_twin

        tokenizer = shared_tokenizer()
        # the loss checks send old logprobs that are deliberately not the sampler's (they set
        # the importance ratio), which strict mode's sampled-action rule would refuse
        with tempfile.TemporaryDirectory(prefix="searchr1-probe-") as home, \
                start_twin(home=home, tokenizer=tokenizer, policy="toy", model_name=base_model,
                           reduction=twin_reduction, accumulation=twin_accumulation,
                           strictness=Strictness(sampled_actions=False)) as twin:
            report = run_probe(twin.service_client(), base_model=base_model, lora_rank=lora_rank,
                               tokenizer=tokenizer, check_losses=True)
        click.echo(report.render())
        return

    from searchr1.wiring.services import ServiceSetupError, live_service, require_pytrio_key

    try:
        require_pytrio_key()
    except ServiceSetupError as error:
        raise click.ClickException(str(error)) from None
    if not yes:
        click.confirm(
            f"This creates one billed LoRA training run ({base_model}, rank {lora_rank}). Continue?",
            abort=True,
        )
    from pytrio.errors.base import PyTrioError

    from searchr1.runtime.failures import describe_failure, is_service_failure

    try:
        report = run_probe(live_service(connect_timeout), base_model=base_model, lora_rank=lora_rank,
                           check_losses=True)
    except ServiceSetupError as error:
        raise click.ClickException(str(error)) from None
    except Exception as error:  # PyTrioError, and what pytrio lets through (httpx, ModelScope, timeouts)
        if not is_service_failure(error):
            raise
        key = os.environ.get("PYTRIO_API_KEY", "")
        message = f"PyTRIO error {error.code}: {error.message}" if isinstance(error, PyTrioError) \
            else f"the service or the network failed ({describe_failure(error)})"
        if key:
            message = message.replace(key, "***")
        raise click.ClickException(message.splitlines()[0]) from None
    click.echo(report.render())
