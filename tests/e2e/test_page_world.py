"""The offline page questions need ``open_page``: trained with search and open_page, the learning
twin's reward rises and its page opening rises with it; with search alone, its reward stays
below that run's. Both runs are the real ``train --offline`` over the shipped corpus's index."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from searchr1.cli import main
from searchr1.offline import PAGES_TRAIN
from searchr1.run.directory import RunDir

STEPS = 12


def offline_run(run_dir, tools: str) -> list[dict]:
    result = CliRunner().invoke(main, ["train", "--offline", "--quiet", "--backend", "local", "--tools", tools,
                                       "--data", str(PAGES_TRAIN), "--max-steps", str(STEPS),
                                       "--run-dir", str(run_dir)])
    assert result.exit_code == 0, result.output
    return RunDir(run_dir).metrics()


@pytest.mark.slow
def test_the_page_questions_are_learnt_with_open_page_and_not_with_search_alone(tmp_path):
    two = offline_run(tmp_path / "two", "search,open_page")
    one = offline_run(tmp_path / "one", "search")
    reward = lambda lines, part: float(np.mean([line["reward/mean"] for line in part(lines)]))  # noqa: E731
    first, last = (lambda lines: lines[:3]), (lambda lines: lines[-3:])
    assert reward(two, last) - reward(two, first) >= 0.3, [line["reward/mean"] for line in two]
    opened = [line["tool/open_page/calls"] for line in two]
    assert np.mean(opened[-3:]) - np.mean(opened[:3]) >= 0.3, opened
    assert all(line["usage/tool_open_page_calls"] > 0 for line in two[-3:])
    # search alone reaches the lead of each page but never its evidence: no rise, far below
    assert reward(one, last) <= reward(one, first) + 0.1, [line["reward/mean"] for line in one]
    assert reward(one, last) + 0.3 <= reward(two, last)
    assert not any("open_page" in key for line in one for key in line)
