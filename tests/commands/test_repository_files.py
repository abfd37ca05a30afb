"""What a checkout promises about its own files: what the commands write by default stays out of
git, and CONTRIBUTING (with its details page) names only files that exist."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Where the commands write unless told otherwise, and where the README sends their output.
WRITTEN_BY_DEFAULT = [
    "runs/search-r1-qwen35-4b/metrics.jsonl",  # train (and runs/judge-cache.jsonl, runs/twin)
    "eval_result/eval_offline_twin-learning_deepseek.jsonl",  # eval
    "exported/offline-demo/adapter_model.safetensors",  # export --out exported/<run> (README)
    "datasets/train.jsonl",  # prepare-data
    "indexes/wiki-18/manifest.json",  # index build --out indexes/... (docs)
    "bench.json",  # bench
]


@pytest.mark.skipif(not (REPO / ".git").exists() or shutil.which("git") is None, reason="needs a git checkout")
@pytest.mark.parametrize("path", WRITTEN_BY_DEFAULT)
def test_what_the_commands_write_by_default_is_ignored_by_git(path):
    checked = subprocess.run(["git", "-C", str(REPO), "check-ignore", "--no-index", "-q", path], timeout=30)
    assert checked.returncode == 0, f"{path} is not ignored by {REPO / '.gitignore'}"


# Files CONTRIBUTING names that a run writes, not the repository.
WRITTEN_BY_A_RUN = {"config.json", "datasets/manifest.json"}


def test_every_file_contributing_names_exists():
    text = "\n".join((REPO / page).read_text("utf-8") for page in ("CONTRIBUTING.md", "docs/contributing-details.md"))
    named = {span.split("::")[0] for span in re.findall(r"`([^`\n]+)`", text)
             if re.fullmatch(r"[\w./-]+\.(?:py|md|json|toml|yaml)(?:::\w+)?", span)}
    assert len(named) > 20  # the probe reads the page's paths

    def exists(name: str) -> bool:
        if "/" not in name:  # a file named again after its path: somewhere in the repository
            return any(REPO.glob(f"searchr1/**/{name}")) or (REPO / name).exists()
        return (REPO / name).exists() or (REPO / "searchr1" / name).exists()

    assert sorted(name for name in named - WRITTEN_BY_A_RUN if not exists(name)) == []
