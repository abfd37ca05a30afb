"""The system this project reimplements is called "the lab port" everywhere, never "the seed",
which a reader would take for a random seed (``--seed``, ``sampling_seed``). The README defines
the name once; docs, comments, docstrings and help texts use it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Wordings that only ever named the reimplemented system, not a random seed.
OLD_NAME = re.compile(r"\b[Tt]he seed's\b|\bas (?:in )?the seed\b|(?<=\s)\(seed\)|seed-differences"
                      r"|Differences from the seed|\bseed(?:-format| behaviour| system| limits)\b|\bseed / ")
FROZEN = ("golden/", "cassettes/", "searchr1/offline/", "uv.lock")  # generated data, never edited by hand
# Core modules whose wording is changed together with their code, by whoever changes it next.
def tracked_text_files() -> list[str]:
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files"], capture_output=True, text=True, timeout=30)
    if listed.returncode != 0:
        pytest.skip("needs a git checkout")
    return [name for name in listed.stdout.splitlines()
            if name.endswith((".py", ".md", ".toml", ".txt")) and not name.startswith(FROZEN)]


def test_the_readme_defines_the_lab_port_once():
    readme = (REPO / "README.md").read_text("utf-8")
    assert readme.count("**The lab port** is the system this project reimplements") == 1
    assert "KMnO4-zx/agentic-rl-lab" in readme and "03-search-r1/" in readme


def test_no_file_calls_the_lab_port_the_seed():
    checked = [name for name in tracked_text_files() if (REPO / name) != Path(__file__)
               and (REPO / name).is_file()]
    found = [f"{name}:{number}: {line.strip()}" for name in checked
             for number, line in enumerate((REPO / name).read_text("utf-8").splitlines(), start=1)
             if OLD_NAME.search(line)]
    assert found == []


@pytest.mark.parametrize("line", ["the seed's packer", "as the seed", "end the trajectory (seed).",
                                  "docs/seed-differences.md", "seed-format summaries", "seed / Dr. GRPO"])
def test_the_check_sees_each_old_wording(line):
    assert OLD_NAME.search(line)


@pytest.mark.parametrize("line", ["--seed 7", "the run's seed and the step", "runs with the same seed",
                                  "a hash of the query and the seed draws each latency", "sampling_seed(base, step)",
                                  "_world_search(seed)"])
def test_the_check_leaves_random_seeds_alone(line):
    assert not OLD_NAME.search(line)
