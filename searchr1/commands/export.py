"""``python cli.py export CHECKPOINT --out DIR``: download a checkpoint's sampler weights with
pytrio's ``RestClient.download_checkpoint`` (resumable: an interrupted download continues where
it stopped when the command is run again), extract them safely (:mod:`searchr1.export.extract`)
and, when they are a PEFT LoRA adapter, check it, write a model card and print how to serve it
(:mod:`searchr1.export.adapter`)."""

from __future__ import annotations

import contextlib
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from searchr1.commands.options import connect_timeout_option, run_guarded

DOWNLOADS = ".download"
EVAL_RESULTS = Path("eval_result")


@dataclass(frozen=True)
class Source:
    """The checkpoint to export and what is known about the run that made it."""

    path: str
    offline: bool
    offline_home: Path | None
    offline_policy: str
    run_config: dict[str, Any] | None
    step: int | None


def resolve_source(checkpoint: str, *, offline: bool, offline_home: Path | None) -> Source:
    """A run directory (its last checkpoint) or a checkpoint path."""
    if checkpoint.startswith("trio://"):
        if offline and offline_home is None:
            raise click.UsageError("an offline checkpoint path needs --offline-home (runs/<run>/twin), "
                                   "or pass the run directory instead")
        return Source(checkpoint, offline, offline_home, "learning", None, _step_of(checkpoint))
    run_dir = Path(checkpoint)
    if not run_dir.is_dir():
        raise click.BadParameter(f"{checkpoint} is neither a run directory nor a trio:// checkpoint path",
                                 param_hint="CHECKPOINT")
    if offline_home is not None:
        raise click.UsageError("--offline-home is for a checkpoint path; a run directory names its own twin")
    from searchr1.commands.eval import checkpoint_of
    from searchr1.run.directory import RunDir

    last = checkpoint_of(run_dir)
    config = RunDir(run_dir).open()
    step = RunDir(run_dir).resume_point()
    return Source(last.weights_path, last.offline, last.offline_home, last.offline_policy or "learning",
                  dict(config), step.step if step is not None else _step_of(last.weights_path))


def _step_of(path: str) -> int | None:
    match = re.search(r"step-(\d+)", path)
    return int(match[1]) if match else None


@contextlib.contextmanager
def _service(source: Source, connect_timeout: float | None) -> Iterator[Any]:
    from searchr1.runtime.services import live_service, load_tokenizer, offline_scenario, offline_service

    if not source.offline:
        yield live_service(connect_timeout)
        return
    assert source.offline_home is not None
    if not source.offline_home.is_dir():
        raise click.ClickException(f"{source.offline_home} does not exist: no twin checkpoint store there")
    yield offline_service(source.offline_home, load_tokenizer(), offline_scenario(), policy=source.offline_policy)


def checkpoint_id(rest: Any, path: str) -> str:
    """The id of the checkpoint at ``path``, from the workspace's checkpoint list."""
    offset = 0
    while True:
        page = rest.list_user_checkpoints(limit=100, offset=offset).result()
        for checkpoint in page.checkpoints:
            if checkpoint.path == path:
                if checkpoint.checkpoint_type != "sampler":
                    raise click.ClickException(f"{path} is training state; export the sampler weights "
                                               "(a weights path, or the run directory)")
                return str(checkpoint.checkpoint_id)
        if not page.checkpoints or page.cursor is None or offset + len(page.checkpoints) >= page.cursor.total_count:
            raise click.ClickException(f"no checkpoint at {path} in this workspace")
        offset += len(page.checkpoints)


def _matching_evals(paths: tuple[Path, ...], weights_path: str) -> list[tuple[str, dict[str, Any]]]:
    """Eval summaries to put in the model card: the files given, and those in eval_result/ whose
    model path is this checkpoint."""
    from searchr1.evaluation.metrics import EvalFileError, load_summary

    found: list[tuple[str, dict[str, Any]]] = []
    for path in paths:
        try:
            found.append((str(path), load_summary(path)))
        except EvalFileError as error:
            raise click.ClickException(str(error)) from None
    if EVAL_RESULTS.is_dir():
        for path in sorted(EVAL_RESULTS.glob("*.jsonl")):
            if path in paths:
                continue
            try:
                summary = load_summary(path)
            except (EvalFileError, OSError, UnicodeDecodeError):
                continue
            if (summary.get("config") or {}).get("model_path") == weights_path:
                found.append((str(path), summary))
    return found


@click.command("export")
@click.argument("checkpoint", metavar="RUN_DIR|CHECKPOINT_PATH")
@click.option("--out", "out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Folder to write the adapter, its model card and nothing else into.")
@click.option("--offline", is_flag=True, help="A checkpoint path of the offline twin (with --offline-home).")
@click.option("--offline-home", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="The twin's checkpoint store of an offline checkpoint path (runs/<run>/twin).")
@click.option("--eval", "evals", multiple=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Eval file to summarise in the model card (repeatable) [default: those in eval_result/ "
                   "of this checkpoint].")
@click.option("--max-bytes", type=click.IntRange(min=1), default=None,
              help="Refuse an archive whose members add up to more than this (and any one member over it) "
                   "[default: 64 GiB a member, 128 GiB in all].")
@connect_timeout_option()
def export(checkpoint: str, out: Path, offline: bool, offline_home: Path | None, evals: tuple[Path, ...],
           max_bytes: int | None, connect_timeout: float | None) -> None:
    """Download a checkpoint's sampler weights and take them home as a PEFT LoRA adapter.

    \b
    python cli.py export runs/<run-name> --out exported/<run-name>
    python cli.py export trio://…-weights --out exported/x
    python cli.py export trio://twin/run-0001/weights/<name> --offline --offline-home runs/<run>/twin --out x

    Rerun the same command after an interruption: the download resumes. An archive with any
    unsafe member (absolute path, .., a link out, a device, over the size cap) is not
    extracted; each refusal is one line.
    """
    run_guarded(lambda: _export(checkpoint, out, offline, offline_home, evals, max_bytes, connect_timeout))


def _export(checkpoint: str, out: Path, offline: bool, offline_home: Path | None, evals: tuple[Path, ...],
            max_bytes: int | None, connect_timeout: float | None) -> None:
    from searchr1.export.adapter import CARD_FILE, find_adapter, load_adapter, model_card, serve_commands
    from searchr1.export.extract import ArchiveError, ExtractLimits, list_members, safe_extract
    from searchr1.run.fileio import check_writable, write_text_atomically

    source = resolve_source(checkpoint, offline=offline, offline_home=offline_home)
    check_writable(out / CARD_FILE, "export folder", click.ClickException)
    name = source.path.rstrip("/").rsplit("/", 1)[-1]
    download = out / DOWNLOADS / f"{re.sub(r'[^A-Za-z0-9._-]+', '_', name)}.tar"
    from pytrio import PyTrioError

    with _service(source, connect_timeout) as service:
        rest = service.create_rest_client()
        try:
            cid = checkpoint_id(rest, source.path)
            partial = download.stat().st_size if download.is_file() else 0
            result = rest.download_checkpoint(cid, download, resume=True).result()
        except PyTrioError as error:
            code = getattr(error, "code", "") or type(error).__name__
            raise click.ClickException(f"cannot download {source.path} ({code}: {error}); rerun the same "
                                       "command to resume") from None
    resumed = f", resumed after {partial} bytes" if result.resumed and partial else ""
    click.echo(f"downloaded {source.path}: {result.file_size_bytes} bytes{resumed}", err=True)
    limits = ExtractLimits() if max_bytes is None else ExtractLimits(max_member_bytes=max_bytes, max_total_bytes=max_bytes)
    with tempfile.TemporaryDirectory(prefix=".extract-", dir=out) as temporary:
        scratch = Path(temporary) / "archive"
        try:
            refused = safe_extract(download, scratch, limits)
        except ArchiveError as error:
            raise click.ClickException(str(error)) from None
        if refused:
            for line in refused:
                click.echo(f"refused: {line}", err=True)
            raise click.ClickException(f"{download}: {len(refused)} unsafe member(s); nothing extracted")
        for item in sorted(scratch.iterdir()):
            target = out / item.name
            if target.is_dir() and not target.is_symlink():
                import shutil

                shutil.rmtree(target)
            item.replace(target)
    members = list_members(download)
    download.unlink()
    with contextlib.suppress(OSError):
        download.parent.rmdir()  # only when empty
    folder = find_adapter(out)
    if folder is None:
        click.echo(f"{out}: not a PEFT LoRA adapter (no {', '.join(('adapter_config.json', 'adapter_model.safetensors'))}); "
                   "the archive holds:")
        for member in members:
            click.echo(f"  {member.kind:<5}{member.size:>12}  {member.name}")
        return
    run = source.run_config or {}
    adapter = load_adapter(folder, expected_rank=run.get("lora_rank"), expected_base=run.get("base_model"))
    if adapter.problems:
        for line in adapter.problems:
            click.echo(f"invalid adapter: {line}", err=True)
        raise click.ClickException(f"{folder} is not a valid LoRA adapter ({len(adapter.problems)} problem(s))")
    commands = serve_commands(folder, adapter)
    card = model_card(adapter, checkpoint=source.path, run_config=source.run_config, step=source.step,
                      evals=_matching_evals(evals, source.path), commands=commands)
    write_text_atomically(folder / CARD_FILE, card)
    click.echo(f"LoRA adapter for {adapter.base_model}, rank {adapter.rank}, {len(adapter.shapes)} tensors on "
               f"{', '.join(adapter.target_modules)} (shapes checked against {adapter.shape_source}) -> {folder}")
    if adapter.stand_in:
        click.secho(f"OFFLINE: {adapter.metadata.get('note')}", fg="yellow")
    click.echo(f"model card: {folder / CARD_FILE}")
    click.echo("serve with vLLM:")
    click.echo(f"  {commands[0]}")
    click.echo("load with transformers + PEFT:")
    click.echo(f"  {commands[1]}")
