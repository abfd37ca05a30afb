"""``export CHECKPOINT --out DIR``: download a checkpoint's sampler weights with
pytrio's ``RestClient.download_checkpoint`` (resumable: an interrupted download continues where
it stopped when the command is run again), or take an archive already downloaded
(``--from-archive``); extract it safely (:mod:`searchr1.export.extract`); convert the Tinker-format
LoRA inside into what PEFT or vLLM loads (:mod:`searchr1.export.convert`), check it against the
base model's config (:mod:`searchr1.export.qwen35`), optionally merge it into a local base model
(:mod:`searchr1.export.merge`); write a model card (:mod:`searchr1.export.card`) and print the commands
that load and upload it."""

from __future__ import annotations

import contextlib
import re
import shlex
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import click

from searchr1.commands.help_layout import SectionedCommand, SectionOption
from searchr1.commands.options import connect_timeout_option, run_guarded
from searchr1.export.convert import Converted, ExportFormat, Layout, RawAdapter
from searchr1.export.qwen35 import Qwen35Text
from searchr1.offline import OfflinePolicy

if TYPE_CHECKING:
    import pytrio

    from searchr1.export.adapter import Adapter
    from searchr1.export.extract import ExtractLimits, Member
    from searchr1.export.merge import MergeReport

DOWNLOADS = ".download"
DEFAULT_BASE = "Qwen/Qwen3.5-4B"
EVAL_RESULTS = Path("eval_result")


@dataclass(frozen=True)
class Source:
    """The checkpoint to export and what is known about the run that made it."""

    path: str
    offline: bool
    offline_home: Path | None
    offline_policy: str
    run_config: Mapping[str, object] | None
    step: int | None


def resolve_source(checkpoint: str, *, offline: bool, offline_home: Path | None) -> Source:
    """A run directory (its last checkpoint) or a checkpoint path."""
    if checkpoint.startswith("trio://"):
        if offline and offline_home is None:
            raise click.UsageError("an offline checkpoint path needs --offline-home (runs/<run>/twin), "
                                   "or pass the run directory instead")
        return Source(checkpoint, offline, offline_home, OfflinePolicy.LEARNING, None, _step_of(checkpoint))
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
    return Source(last.weights_path, last.offline, last.offline_home, last.offline_policy or OfflinePolicy.LEARNING,
                  dict(config), step.step if step is not None else _step_of(last.weights_path))


def _step_of(path: str) -> int | None:
    match = re.search(r"step-(\d+)", path)
    return int(match[1]) if match else None


@contextlib.contextmanager
def _service(source: Source, connect_timeout: float | None) -> Iterator[pytrio.ServiceClient]:
    from searchr1.wiring.services import live_service, load_tokenizer, offline_scenario, offline_service

    if not source.offline:
        yield live_service(connect_timeout)
        return
    assert source.offline_home is not None
    if not source.offline_home.is_dir():
        raise click.ClickException(f"{source.offline_home} does not exist: no twin checkpoint store there")
    yield offline_service(source.offline_home, load_tokenizer(), offline_scenario(), policy=source.offline_policy)


def checkpoint_id(rest: pytrio.RestClient, path: str) -> str:
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


def _matching_evals(paths: tuple[Path, ...], weights_path: str) -> list[tuple[str, Mapping[str, object]]]:
    """Eval summaries to put in the model card: the files given, and those in eval_result/ whose
    model path is this checkpoint."""
    from searchr1.evaluation.metrics import EvalFileError, load_summary

    found: list[tuple[str, Mapping[str, object]]] = []
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


@click.command("export", cls=SectionedCommand)
@click.argument("checkpoint", metavar="[RUN_DIR|CHECKPOINT_PATH]", required=False)
@click.option("--out", "out", cls=SectionOption, section="run",
              required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Folder to write the adapter, its model card and nothing else into.")
@click.option("--from-archive", "from_archive", cls=SectionOption, section="archive",
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="Convert this downloaded checkpoint archive (a .tar from the trio/tinker CLI "
                                 "or a browser) instead of downloading one; needs no service.")
@click.option("--format", "export_format", cls=SectionOption, section="run",
              type=click.Choice([f.value for f in ExportFormat]), default="peft",
              show_default=True, help="peft: for transformers + PEFT (no tensor dropped); vllm: for vLLM's "
                                      "Qwen3.5 loader (the published checkpoint's module names).")
@click.option("--base", "base", cls=SectionOption, section="run",
              type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="A local copy of the base model (its config.json gives the shapes and the layout) "
                   "[default: the shipped Qwen3.5-4B config, loaded as Qwen3_5ForCausalLM].")
@click.option("--merge", cls=SectionOption, section="run", is_flag=True,
              help="Also write full merged weights into OUT/merged (needs --base with the base model's "
                   "safetensors).")
@click.option("--offline", cls=SectionOption, section="run", is_flag=True,
              help="A checkpoint path of the offline twin (with --offline-home).")
@click.option("--offline-home", cls=SectionOption, section="service",
              type=click.Path(file_okay=False, path_type=Path), default=None,
              help="The twin's checkpoint store of an offline checkpoint path (runs/<run>/twin).")
@click.option("--eval", "evals", cls=SectionOption, section="run",
              multiple=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Eval file to summarise in the model card (repeatable) [default: those in eval_result/ "
                   "of this checkpoint].")
@click.option("--max-bytes", cls=SectionOption, section="archive", type=click.IntRange(min=1), default=None,
              help="Refuse an archive whose members add up to more than this (and any one member over it) "
                   "[default: 64 GiB a member, 128 GiB in all].")
@connect_timeout_option()
def export(checkpoint: str | None, out: Path, from_archive: Path | None, export_format: str, base: Path | None,
           merge: bool, offline: bool, offline_home: Path | None, evals: tuple[Path, ...], max_bytes: int | None,
           connect_timeout: float | None) -> None:
    """Take a checkpoint's LoRA home: a PEFT adapter (or vLLM's), checked against the base model.

    \b
    %(prog)s export runs/<run-name> --out exported/<run-name>
    %(prog)s export trio://…-weights --out exported/x --format vllm
    %(prog)s export --from-archive weights.tar --base ./Qwen3.5-4B --out exported/x --merge

    Rerun the same command after an interruption: the download resumes. An archive with any
    unsafe member (absolute path, .., a link out, a device, over the size cap) is not
    extracted; each refusal is one line. The Tinker-format archive is converted: split
    linear-attention projections folded into in_proj_qkv, unembed_tokens as lm_head.
    """
    run_guarded(lambda: _export(checkpoint, out, from_archive, ExportFormat(export_format), base, merge, offline,
                                offline_home, evals, max_bytes, connect_timeout))


def _check_flags(checkpoint: str | None, from_archive: Path | None, base: Path | None, merge: bool,
                 offline: bool, offline_home: Path | None) -> Qwen35Text | None:
    """Every flag problem at once, before any download; the base model's dims when --base is given."""
    from searchr1.export.qwen35 import ConfigError, read_config

    problems: list[str] = []
    if (checkpoint is None) == (from_archive is None):
        problems.append("give a RUN_DIR or CHECKPOINT_PATH, or --from-archive FILE (one of them)")
    if from_archive is not None and (offline or offline_home is not None):
        problems.append("--offline and --offline-home name a twin checkpoint; --from-archive needs neither")
    if merge and base is None:
        problems.append("--merge needs --base DIR, the local base model to merge into")
    dims = None
    if base is not None:
        try:
            dims = read_config(base)
        except ConfigError as error:
            problems.append(f"--base: {error}")
    if problems:
        raise click.UsageError("; ".join(problems))
    return dims


def _shapes_of(raw: RawAdapter, base_dims: Qwen35Text | None, base_model: str) -> tuple[Qwen35Text, str]:
    """The dims the adapter's shapes are checked against, and where they come from."""
    import json

    from searchr1.export.qwen35 import QWEN35_4B, ConfigError, text_dims

    if raw.metadata.get("stand_in") == "true":
        try:
            config = json.loads(raw.metadata["stand_in_config"])
            return text_dims(config, "the offline twin's stand-in config"), "the offline twin's stand-in Qwen3.5 config"
        except (KeyError, json.JSONDecodeError, ConfigError) as error:
            raise click.ClickException(f"adapter_model.safetensors: stand-in metadata without a usable config "
                                       f"({error})") from None
    if base_dims is not None:
        return base_dims, base_dims.source
    if base_model == DEFAULT_BASE:
        return QWEN35_4B, f"the shipped {DEFAULT_BASE} config ({QWEN35_4B.source.rsplit('/', 1)[-1]})"
    raise click.ClickException(f"no shapes known for {base_model}: pass --base DIR, a folder with its config.json")


def _layout(export_format: ExportFormat, base_dims: Qwen35Text | None) -> Layout:
    """vLLM's names, or those of the local base model's class (``--base``): its config nests the
    text model for ``Qwen3_5ForConditionalGeneration``; ``Qwen3_5ForCausalLM`` otherwise."""
    if export_format is ExportFormat.VLLM or (base_dims is not None and base_dims.nested):
        return Layout.VISION_LANGUAGE
    return Layout.CAUSAL_LM


def _download(source: Source, out: Path, connect_timeout: float | None) -> Path:
    from pytrio import PyTrioError

    name = source.path.rstrip("/").rsplit("/", 1)[-1]
    download = out / DOWNLOADS / f"{re.sub(r'[^A-Za-z0-9._-]+', '_', name)}.tar"
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
    return download


@dataclass(frozen=True)
class _Conversion:
    """The adapter in an archive, converted: as it was read (``raw``), as it is written, the dims
    its shapes were checked against and where they come from, its base model, and the archive's
    own README."""

    raw: RawAdapter
    converted: Converted
    dims: Qwen35Text
    shape_source: str
    base_model: str
    archive_readme: str | None


def _export(checkpoint: str | None, out: Path, from_archive: Path | None, export_format: ExportFormat,
            base: Path | None, merge: bool, offline: bool, offline_home: Path | None, evals: tuple[Path, ...],
            max_bytes: int | None, connect_timeout: float | None) -> None:
    """The checkpoint's archive (downloaded, or given) unpacked and converted into ``out``, checked
    against its base model, merged into ``--base`` when asked, with its model card."""
    from searchr1.export.adapter import check_adapter, use_commands
    from searchr1.export.card import CARD_FILE, model_card, repo_name, upload_command
    from searchr1.export.extract import ExtractLimits
    from searchr1.basics.fileio import check_writable, write_text_atomically

    base_dims = _check_flags(checkpoint, from_archive, base, merge, offline, offline_home)
    if from_archive is not None:
        source = Source(str(from_archive), False, None, OfflinePolicy.LEARNING, None, _step_of(from_archive.name))
    else:
        assert checkpoint is not None
        source = resolve_source(checkpoint, offline=offline, offline_home=offline_home)
    check_writable(out / CARD_FILE, "export folder", click.ClickException)
    out.mkdir(parents=True, exist_ok=True)
    archive = from_archive if from_archive is not None else _download(source, out, connect_timeout)
    limits = ExtractLimits() if max_bytes is None else ExtractLimits(max_member_bytes=max_bytes,
                                                                     max_total_bytes=max_bytes)
    conversion = _unpack(archive, from_archive, out, limits, source, base_dims, export_format)
    if conversion is None:
        return
    _drop_download(archive, from_archive)
    adapter = check_adapter(out, conversion.dims, conversion.converted.layout)
    from searchr1.basics.wording import plural

    if adapter.problems:
        for line in adapter.problems:
            click.echo(f"invalid adapter: {line}", err=True)
        raise click.ClickException(f"{out}: the converted adapter does not fit {conversion.base_model} "
                                   f"({plural(len(adapter.problems), 'problem')})")
    reference = str(base) if base is not None else conversion.base_model
    commands = use_commands(out, adapter, export_format, conversion.converted.layout, base=reference)
    merged = _merge(base, conversion.converted, out, commands) if merge else None
    raw = conversion.raw
    stand_in = raw.metadata.get("note") if raw.metadata.get("stand_in") == "true" else None
    upload = upload_command(out, merged=merged is not None)
    card = model_card(adapter, name=repo_name(out), checkpoint=source.path, run_config=source.run_config,
                      step=source.step, evals=_matching_evals(evals, source.path), commands=commands, upload=upload,
                      shape_source=conversion.shape_source, stand_in_note=stand_in,
                      archive_readme=conversion.archive_readme)
    write_text_atomically(out / CARD_FILE, card)
    _print_exported(out, export_format, base, conversion, adapter, merged, commands, upload, stand_in)


def _unpack(archive: Path, from_archive: Path | None, out: Path, limits: ExtractLimits, source: Source,
            base_dims: Qwen35Text | None, export_format: ExportFormat) -> _Conversion | None:
    """Extract ``archive`` safely into a scratch folder in ``out`` and write its adapter into ``out``
    converted. An archive without an adapter is moved into ``out`` as it is and listed (None)."""
    from searchr1.export.adapter import find_adapter
    from searchr1.export.convert import write_converted
    from searchr1.export.extract import list_members

    with tempfile.TemporaryDirectory(prefix=".extract-", dir=out) as temporary:
        scratch = Path(temporary) / "archive"
        _extract(archive, scratch, limits)
        members = list_members(archive)
        folder = find_adapter(scratch)
        if folder is None:
            _keep_as_it_is(scratch, out, archive, from_archive, members)
            return None
        conversion = _convert(folder, source, base_dims, export_format)
        raw = conversion.raw
        write_converted(conversion.converted, out, {"format": "pt", "producer": "searchr1 export",
                                                    **{k: v for k, v in raw.metadata.items()
                                                       if k in ("stand_in", "note")}})
    return conversion


def _extract(archive: Path, scratch: Path, limits: ExtractLimits) -> None:
    """``archive`` into ``scratch``; an archive with any unsafe member is refused whole, each
    refusal one line."""
    from searchr1.export.extract import ArchiveError, safe_extract

    try:
        refused = safe_extract(archive, scratch, limits)
    except ArchiveError as error:
        raise click.ClickException(str(error)) from None
    if refused:
        for line in refused:
            click.echo(f"refused: {line}", err=True)
        from searchr1.basics.wording import plural

        raise click.ClickException(f"{archive}: {plural(len(refused), 'unsafe member')}; nothing extracted")


def _keep_as_it_is(scratch: Path, out: Path, archive: Path, from_archive: Path | None, members: list[Member]) -> None:
    """An archive that holds no LoRA adapter: what it holds moved into ``out`` and listed."""
    import shutil

    for item in sorted(scratch.iterdir()):
        target = out / item.name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        item.replace(target)
    _drop_download(archive, from_archive)
    click.echo(f"{out}: not a LoRA adapter (no adapter_config.json with adapter_model.safetensors); "
               "the archive holds:")
    for member in members:
        click.echo(f"  {member.kind:<5}{member.size:>12}  {member.name}")


def _convert(folder: Path, source: Source, base_dims: Qwen35Text | None, export_format: ExportFormat) -> _Conversion:
    """The adapter in ``folder`` converted to ``export_format``; refused (one line) when its rank or
    base model is not the run's, or its shapes do not fit."""
    from searchr1.export.card import CARD_FILE
    from searchr1.export.convert import ConversionError, convert, read_raw_adapter

    run = source.run_config or {}
    try:
        raw = read_raw_adapter(folder)
        if run.get("lora_rank") is not None and raw.rank != run["lora_rank"]:
            raise ConversionError(f"adapter_config.json: r {raw.rank}, but the run trained LoRA rank "
                                  f"{run['lora_rank']}")
        named = raw.config.get("base_model_name_or_path")
        if run.get("base_model") and isinstance(named, str) and named and named != run["base_model"]:
            raise ConversionError(f"adapter_config.json: base model {named!r}, but the run trained "
                                  f"{run['base_model']!r}")
        base_model = str(run.get("base_model") or named or DEFAULT_BASE)
        dims, shape_source = _shapes_of(raw, base_dims, base_model)
        layout = _layout(export_format, base_dims)
        converted = convert(raw, dims, export_format=export_format, layout=layout, base_model=base_model)
    except ConversionError as error:
        raise click.ClickException(f"invalid adapter: {error}") from None
    readme = folder / CARD_FILE
    archive_readme = readme.read_text("utf-8", errors="replace") if readme.is_file() else None
    return _Conversion(raw, converted, dims, shape_source, base_model, archive_readme)


def _merge(base: Path | None, converted: Converted, out: Path, commands: list[str]) -> MergeReport:
    """``--merge``: the adapter's deltas added to the base model's weights in ``out/merged``; the
    command that serves them goes to ``commands``."""
    from searchr1.export.convert import ConversionError
    from searchr1.export.merge import merge_into

    assert base is not None
    try:
        merged = merge_into(base, converted, out / "merged")
    except ConversionError as error:
        raise click.ClickException(f"--merge: {error}") from None
    commands.append(f"vllm serve {shlex.quote(str(merged.folder))}")
    return merged


def _print_exported(out: Path, export_format: ExportFormat, base: Path | None, conversion: _Conversion,
                    adapter: Adapter, merged: MergeReport | None, commands: list[str], upload: str,
                    stand_in: str | None) -> None:
    """What was written, what its shapes were checked against, and the commands that load, serve
    and upload it."""
    from searchr1.export.card import CARD_FILE

    converted, base_model = conversion.converted, conversion.base_model
    folded = (f", in_proj_q/k/v folded into in_proj_qkv in {converted.folded_layers} layers"
              if converted.folded_layers else "")
    head = ", unembed_tokens as lm_head" if converted.has_unembed else ""
    click.echo(f"{export_format.value} LoRA adapter for {base_model}, rank {adapter.rank}, {len(adapter.shapes)} "
               f"tensors on {', '.join(adapter.target_modules)}{folded}{head} -> {out}")
    click.echo(f"shapes checked against {conversion.shape_source}; module names for {converted.layout.value}"
               + ("" if base is not None or export_format is ExportFormat.VLLM else
                  " (assumed: what AutoModelForCausalLM builds; --base DIR follows a local model)"))
    if stand_in:
        click.secho(f"OFFLINE: {stand_in}", fg="yellow")
    if merged is not None:
        click.echo(f"merged weights ({merged.merged} "
                   f"modules{', lm_head untied from the embeddings' if merged.untied else ''})"
                   f" -> {merged.folder}")
    click.echo(f"model card: {out / CARD_FILE}")
    click.echo("serve with vLLM:" if export_format is ExportFormat.VLLM else "load with transformers + PEFT:")
    click.echo(f"  {commands[0]}")
    if merged is not None:
        click.echo("serve the merged weights:")
        click.echo(f"  {commands[-1]}")
    click.echo("upload the adapter to the Hugging Face Hub (your Hub name in place of your-hf-name):")
    click.echo(f"  {upload}")


def _drop_download(archive: Path, from_archive: Path | None) -> None:
    """Remove a finished download (never the user's own archive)."""
    if from_archive is None:
        archive.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            archive.parent.rmdir()  # only when empty
