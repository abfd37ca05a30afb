"""``prepare-data``: build train/test/dev JSONL and a manifest from the Search-R1 parquet release."""

from __future__ import annotations

from pathlib import Path

import click

from searchr1.commands.help_layout import SectionedCommand
from searchr1.data import dataset as data
from searchr1.basics import invocation


def _local_sources(
    source: Path | None, train_parquet: Path | None, test_parquet: Path | None
) -> dict[str, Path] | None:
    """Resolve the offline inputs, or None when the dataset should be downloaded."""
    if source is not None and (train_parquet or test_parquet):
        raise click.UsageError("give either --source DIR or --train-parquet/--test-parquet, not both")
    if (train_parquet is None) != (test_parquet is None):
        raise click.UsageError("--train-parquet and --test-parquet must be given together")
    if train_parquet is not None and test_parquet is not None:  # given together, as checked above
        return {"train": train_parquet, "test": test_parquet}
    if source is None:
        return None
    paths = {split: source / name for split, name in data.RAW_FILES.items()}
    missing = [str(p) for p in paths.values() if not p.is_file()]
    if missing:
        raise click.BadParameter(f"missing {', '.join(missing)}", param_hint="--source")
    return paths


def _describe(counts: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in counts.items()) or "-"


@click.command("prepare-data", cls=SectionedCommand)
@click.option(
    "--source",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="Offline: a directory holding train.parquet and test.parquet (nothing is downloaded).",
)
@click.option(
    "--train-parquet",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Offline: explicit train parquet file.",
)
@click.option(
    "--test-parquet",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Offline: explicit test parquet file.",
)
@click.option(
    "--output-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("datasets"),
    show_default=True,
    help="Where train/test/dev.jsonl and manifest.json go.",
)
@click.option(
    "--raw-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Download destination for the parquet files [default: OUTPUT_DIR/raw].",
)
@click.option(
    "--dev-per-source",
    type=click.IntRange(min=1),
    default=data.DEFAULT_DEV_PER_SOURCE,
    show_default=True,
    help="Dev questions sampled per benchmark from test.",
)
@click.option(
    "--seed",
    type=int,
    default=data.DEFAULT_SEED,
    show_default=True,
    help="Seed of the stratified dev sample.",
)
@click.option("--corpus", is_flag=True,
              help="Fetch the wiki-18 retrieval corpus (Search-R1's wiki-18.jsonl.gz, ~21M passages) into "
                   "OUTPUT_DIR/wiki-18.jsonl instead of the QA dataset; then `%(prog)s index build`.")
@click.option("--corpus-source", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="With --corpus, offline: a wiki-18.jsonl or .jsonl.gz already downloaded.")
@click.option("--corpus-url", default=None,
              help="With --corpus: where to download it [default: $HF_ENDPOINT or huggingface.co, "
                   "datasets/PeterJinGo/wiki-18-corpus].")
@click.option("--corpus-sha256", default=None, metavar="HEX",
              help="With --corpus: the download's expected sha256 [default: the hub's ETag when it is one].")
def prepare_data(
    source: Path | None,
    train_parquet: Path | None,
    test_parquet: Path | None,
    output_dir: Path,
    raw_dir: Path | None,
    dev_per_source: int,
    seed: int,
    corpus: bool,
    corpus_source: Path | None,
    corpus_url: str | None,
    corpus_sha256: str | None,
) -> None:
    """Clean the Search-R1 QA release into train.jsonl, test.jsonl, dev.jsonl and manifest.json
    (or, with --corpus, fetch the wiki-18 corpus: an interrupted download resumes where it stopped,
    and a finished one is checked against its sha256).

    Without --source/--train-parquet the pinned revision of the ModelScope mirror
    (zhuangzhuang2023/nq_hotpotqa_train) is downloaded first; when ModelScope cannot be reached
    this says so in one line and leaves nothing behind. Rows without a question or an
    answer are dropped and counted; train questions that also occur in test (compared after
    Unicode/case/punctuation normalisation) are dropped from train; dev is a seeded sample of
    test, stratified by benchmark. Files are replaced atomically, the manifest last.
    """
    if corpus:
        _prepare_corpus(output_dir, corpus_source, corpus_url, corpus_sha256)
        return
    if corpus_source is not None or corpus_url is not None or corpus_sha256 is not None:
        raise click.UsageError("--corpus-source, --corpus-url and --corpus-sha256 only apply with --corpus")
    local = _local_sources(source, train_parquet, test_parquet)
    provenance = {"kind": "local"}
    try:
        if local is None:
            raw = raw_dir or output_dir / "raw"
            local = data.download_raw(raw)
            click.echo(f"downloaded {data.DATASET_ID}@{data.DATASET_REVISION} into {raw}")
            provenance = {
                "kind": "modelscope",
                "dataset_id": data.DATASET_ID,
                "revision": data.DATASET_REVISION,
            }
        manifest = data.prepare_dataset(
            local["train"],
            local["test"],
            output_dir,
            dev_per_source=dev_per_source,
            seed=seed,
            provenance=provenance,
        )
    except data.DataError as exc:
        raise click.ClickException(str(exc)) from exc
    for name, split in manifest["splits"].items():
        click.echo(f"{name}: total={split['total']}; {_describe(split['per_source'])}")
    for name, dropped in manifest["dropped"].items():
        click.echo(f"dropped from {name}: {_describe(dropped)}")
    if manifest["dev_short_sources"]:
        click.echo(
            f"note: dev has fewer than {dev_per_source} questions for: {', '.join(manifest['dev_short_sources'])}",
            err=True,
        )
    click.echo(f"wrote {output_dir}/{{train,test,dev}}.jsonl and {output_dir}/{data.MANIFEST_NAME}")


CORPUS_NAME = "wiki-18.jsonl"


def _prepare_corpus(output_dir: Path, source: Path | None, url: str | None, sha256: str | None) -> None:
    from searchr1.bm25.download import corpus_url, fetch_corpus

    dest = output_dir / CORPUS_NAME
    where = source or url or corpus_url()
    click.echo(f"fetching the wiki-18 corpus from {where} into {dest} (about 14 GB uncompressed)...", err=True)
    try:
        fetched = fetch_corpus(dest, url=url, source=source, sha256=sha256)
    except data.DataError as exc:
        raise click.ClickException(str(exc)) from exc
    resumed = f", resumed after {fetched['resumed_from']:,} bytes" if fetched.get("resumed_from") else ""
    checked = f", sha256 {fetched['sha256']}" if fetched.get("sha256") else ""
    click.echo(f"wrote {dest}: {fetched['rows']} passages, {fetched['bytes']} bytes{resumed}{checked}")
    click.echo(f"next: {invocation.command(f'index build {dest} --out indexes/wiki-18')}")
