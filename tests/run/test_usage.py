"""Usage counts, price tables, budgets and estimates, without a run."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from searchr1.run.costs import Budget, PriceError, RunAccount, check_budget, load_prices
from searchr1.run.estimate import checkpoints_of
from searchr1.run.usage import (
    JudgeUsage,
    MeteredSearch,
    MeteredTool,
    SearchUsage,
    ToolUsage,
    Usage,
    count_sample,
    depends_on_timing,
    totals_before,
    usage_metrics,
)
from searchr1.core.types import ReportedUsage as DeepSeekUsage
from searchr1.core.types import SearchResult

counts = st.integers(min_value=0, max_value=10**9)


@st.composite
def usages(draw):
    usage = Usage(**{name: draw(counts) for name in (
        "sample_requests", "sample_prompt_tokens", "sample_generated_tokens", "train_tokens",
        "forward_backward_calls", "optim_steps", "kl_requests", "kl_prompt_tokens", "kl_generated_tokens",
        "weight_saves", "state_saves")})
    for backend in draw(st.lists(st.sampled_from(["deepseek", "zhihu", "wikipedia", "local"]), unique=True)):
        usage.search[backend] = SearchUsage(**{unit: draw(counts) for unit in (
            "calls", "requests", "input_tokens", "cache_read_input_tokens", "output_tokens", "web_searches",
            "quota_units", "http_requests")})
    for tool in draw(st.lists(st.sampled_from(["open_page", "search"]), unique=True)):
        usage.tools[tool] = ToolUsage(**{count: draw(counts) for count in ("calls", "requests", "http_requests",
                                                                           "units")})
    for service in draw(st.lists(st.sampled_from(["pytrio", "deepseek"]), unique=True)):
        usage.judge[service] = JudgeUsage(**{count: draw(counts) for count in ("calls", "requests", "prompt_tokens",
                                                                               "generated_tokens")})
    return usage


@given(usages())
def test_a_metrics_line_reads_back_as_the_usage_it_was_written_from(usage):
    """Invariant: from_metrics(usage_metrics(u, t)) == u (step) and == t (total), for the units each backend bills."""
    total = usage.map(lambda count: 2 * count)
    line = {"step": 3, **usage_metrics(usage, total)}
    assert Usage.from_metrics(line).kinds() == usage.kinds()
    assert Usage.from_metrics(line, total=True).kinds() == total.kinds()


@given(st.lists(usages(), min_size=1, max_size=5))
def test_totals_are_the_sum_of_the_steps_in_any_order(steps):
    """Invariant: adding step usages is order-independent (a resumed run's totals cannot depend on where it stopped)."""
    forward, backward = Usage(), Usage()
    for usage in steps:
        forward.add(usage)
    for usage in reversed(steps):
        backward.add(usage)
    assert forward.kinds() == backward.kinds()
    assert forward.tokens == sum(u.tokens for u in steps)


def test_totals_before_a_step_come_from_the_last_earlier_line():
    first, second = Usage(train_tokens=5), Usage(train_tokens=7)
    lines = [{"step": 0, **usage_metrics(first, first)},
             {"step": 1, **usage_metrics(second, Usage(train_tokens=12))}]
    assert totals_before(lines, 0).train_tokens == 0
    assert totals_before(lines, 1).train_tokens == 5
    assert totals_before(lines, 2).train_tokens == 12


def test_a_sampling_request_counts_its_prompt_once_and_every_returned_sequence():
    usage = Usage()
    prompt = SimpleNamespace(length=10)
    response = SimpleNamespace(sequences=[SimpleNamespace(tokens=[1, 2, 3]), SimpleNamespace(tokens=[4])])
    count_sample(usage, prompt, response)
    count_sample(usage, prompt, response, kl=True)
    assert (usage.sample_requests, usage.sample_prompt_tokens, usage.sample_generated_tokens) == (1, 10, 4)
    assert (usage.kl_requests, usage.kl_prompt_tokens, usage.kl_generated_tokens) == (1, 10, 4)


async def test_a_search_answered_without_the_service_is_a_call_but_not_a_request():
    answers = iter([
        SearchResult(ok=True, attempts=2, usage=DeepSeekUsage(100, 10, 20, 1)),
        SearchResult(ok=True, cached=True),
    ])

    class Backend:
        name = "deepseek"

        async def search(self, query):
            return next(answers)

    usage = Usage()
    metered = MeteredSearch(Backend(), usage)
    await metered.search("a")
    await metered.search("a")
    kinds = usage.kinds()
    assert kinds["search_deepseek_calls"] == 2 and kinds["search_deepseek_requests"] == 1
    assert (kinds["search_deepseek_input_tokens"], kinds["search_deepseek_output_tokens"]) == (100, 20)
    assert "search_deepseek_quota_units" not in kinds  # DeepSeek bills tokens, not quota


async def test_a_tool_call_counts_its_call_its_requests_and_its_answered_units():
    answers = iter([SearchResult(ok=True, attempts=1), SearchResult(ok=False, error="down", attempts=3),
                    SearchResult(ok=True)])

    class Pages:
        async def call(self, call):
            return next(answers)

    usage = Usage()
    metered = MeteredTool("open_page", Pages(), usage)
    for _ in range(3):
        await metered.call(None)
    kinds = usage.kinds()
    assert (kinds["tool_open_page_calls"], kinds["tool_open_page_requests"], kinds["tool_open_page_http_requests"],
            kinds["tool_open_page_pages"]) == (3, 2, 4, 2)  # pages: the declared unit of open_page, per answer


def test_keys_that_depend_on_search_timing_are_named():
    assert depends_on_timing("usage/search_deepseek_requests")
    assert depends_on_timing("usage/total_search_deepseek_input_tokens")
    assert depends_on_timing("cost/total")
    assert depends_on_timing("usage/tool_open_page_requests")
    assert not depends_on_timing("usage/tool_open_page_calls")
    assert not depends_on_timing("usage/search_deepseek_calls")
    assert not depends_on_timing("usage/total_train_tokens")
    assert not depends_on_timing("cost/total_train_tokens")
    assert depends_on_timing("usage/judge_pytrio_requests")
    assert depends_on_timing("usage/total_judge_deepseek_prompt_tokens")
    assert not depends_on_timing("usage/judge_pytrio_calls")


def test_a_run_without_a_judge_has_no_judge_kinds_and_the_judge_is_no_model_token():
    """The default run's metrics keep their keys; the judge is priced, not counted in --budget-tokens."""
    assert not any(kind.startswith("judge_") for kind in Usage(sample_requests=1).kinds())
    usage = Usage(judge={"pytrio": JudgeUsage(calls=3, requests=2, prompt_tokens=100, generated_tokens=4)})
    assert usage.tokens == 0
    assert {k: v for k, v in usage.kinds().items() if k.startswith("judge_")} == {
        "judge_pytrio_calls": 3, "judge_pytrio_requests": 2, "judge_pytrio_prompt_tokens": 100,
        "judge_pytrio_generated_tokens": 4}


# -- price tables --------------------------------------------------------------------------------


def write(tmp_path, text):
    path = tmp_path / "prices.toml"
    path.write_text(text)
    return path


def test_the_example_price_table_reads_and_prices_every_token_kind():
    from pathlib import Path

    table = load_prices(Path(__file__).resolve().parents[2] / "docs" / "prices.example.toml")
    usage = Usage(sample_prompt_tokens=2_000_000, train_tokens=1_000_000)
    per_million = {"sample_prompt_tokens": 1.0, "train_tokens": 3.0}  # the example file's numbers
    assert table.currency == "CNY"
    assert table.cost(usage) == pytest.approx(2 * per_million["sample_prompt_tokens"] + per_million["train_tokens"])


def test_cost_is_usage_times_price_per_kind(tmp_path):
    table = load_prices(write(tmp_path, 'currency = "EUR"\n[per_million_tokens]\ntrain_tokens = 2.5\n'
                                        '[search.zhihu.per_request]\nquota_units = 0.1\n'))
    usage = Usage(train_tokens=400_000)
    usage.searched("zhihu").quota_units = 30
    metrics = table.metrics(usage, usage.map(lambda count: 2 * count))
    assert metrics["cost/train_tokens"] == pytest.approx(1.0)
    assert metrics["cost/search_zhihu_quota_units"] == pytest.approx(3.0)
    assert metrics["cost/step"] == pytest.approx(4.0) and metrics["cost/total"] == pytest.approx(8.0)


def test_the_judge_is_priced_per_service(tmp_path):
    table = load_prices(write(tmp_path, 'currency = "EUR"\n[judge.deepseek.per_million_tokens]\nprompt_tokens = 2.0\n'
                                        '[judge.pytrio.per_request]\nrequests = 0.5\n'))
    usage = Usage(judge={"deepseek": JudgeUsage(prompt_tokens=1_000_000), "pytrio": JudgeUsage(requests=4)})
    assert table.costs(usage) == {"judge_deepseek_prompt_tokens": pytest.approx(2.0),
                                  "judge_pytrio_requests": pytest.approx(2.0)}
    assert table.costs(Usage(train_tokens=5)) == {}  # a run without a judge gets no judge cost keys
    example = load_prices(Path(__file__).resolve().parents[2] / "docs" / "prices.example.toml")
    assert not any(key.startswith("cost/judge_") for key in example.metrics(Usage(), Usage()))
    with pytest.raises(PriceError, match="prices.toml: judge.openai is not a judge's service"):
        load_prices(write(tmp_path, 'currency = "EUR"\n[judge.openai.per_request]\nrequests = 1\n'))
    with pytest.raises(PriceError, match="prices.toml:3: judge.pytrio.per_request.prompt_tokens is priced in"):
        load_prices(write(tmp_path, 'currency = "EUR"\n[judge.pytrio.per_request]\nprompt_tokens = 1\n'))


def test_a_declared_tool_is_priced_by_its_counts(tmp_path):
    table = load_prices(write(tmp_path, 'currency = "EUR"\n[tool.open_page.per_request]\npages = 0.5\ncalls = 0.25\n'))
    usage = Usage()
    usage.tool("open_page").units, usage.tool("open_page").calls = 4, 6
    assert table.costs(usage) == {"tool_open_page_calls": pytest.approx(1.5), "tool_open_page_pages": pytest.approx(2.0)}


@pytest.mark.parametrize("text, named", [
    ('currency = "CNY"\n[tool.open_pages.per_request]\npages = 1\n', "tool.open_pages is not a declared tool"),
    ('currency = "CNY"\n[tool.open_page.per_request]\nsearches = 1\n',
     "prices.toml:3: tool.open_page.per_request.searches is not a usage kind here; known: calls, requests, "
     "http_requests, pages"),
    ('currency = "CNY"\n[tool.open_page.per_million_tokens]\npages = 1\n', "tool.open_page must hold one table"),
    ('[per_million_tokens]\ntrain_tokens = 1\n', "prices.toml: currency is missing"),
    ('currency = "CNY"\n[per_million_tokens]\n\ntrian_tokens = 1\n', "prices.toml:4: per_million_tokens.trian_tokens"),
    ('currency = "CNY"\n[per_request]\ntrain_tokens = 1\n', "prices.toml:3: per_request.train_tokens is priced in "
                                                           "[per_million_tokens]"),
    ('currency = "CNY"\n[per_million_tokens]\ntrain_tokens = -1\n', "prices.toml:3: per_million_tokens.train_tokens "
                                                                   "must be a price >= 0"),
    ('currency = "CNY"\n[per_million_tokens]\ntrain_tokens = "cheap"\n', "prices.toml:3:"),
    ('currency = "CNY"\n[search.deepseek.per_million_tokens]\nouput_tokens = 1\n',
     "prices.toml:3: search.deepseek.per_million_tokens.ouput_tokens"),
    ('currency = "CNY"\n[hourly]\ngpu = 1\n', "hourly is not a price table"),
    ('currency = "CNY"\ntrain_tokens = [\n', "not valid TOML"),
])
def test_a_bad_price_table_is_one_line_naming_file_line_and_key(tmp_path, text, named):
    with pytest.raises(PriceError) as error:
        load_prices(write(tmp_path, text))
    message = str(error.value)
    assert "\n" not in message and named in message, message


def test_a_missing_price_table_is_named(tmp_path):
    with pytest.raises(PriceError, match="nothing.toml: cannot read"):
        load_prices(tmp_path / "nothing.toml")


# -- budgets and estimates -----------------------------------------------------------------------


def test_a_budget_stops_before_the_step_the_mean_step_would_carry_past_it(tmp_path):
    table = load_prices(write(tmp_path, 'currency = "CNY"\n[per_million_tokens]\ntrain_tokens = 1.0\n'))
    account = RunAccount(table, Budget(amount=1.0))
    for _ in range(3):
        account.add_step(Usage(train_tokens=300_000))  # 0.3 a step
        verdict = account.verdict()
    # after three steps 0.9 is spent; a fourth would reach 1.2
    assert verdict.stop and verdict.what == "cost"
    assert verdict.spent == pytest.approx(0.9) and verdict.left == pytest.approx(0.1)
    assert not check_budget(Budget(amount=1.3), table, account.total, Usage(train_tokens=300_000)).stop


def test_a_token_budget_counts_every_model_token():
    usage = Usage(sample_prompt_tokens=10, sample_generated_tokens=5, train_tokens=15, kl_prompt_tokens=15,
                  kl_generated_tokens=1)
    assert check_budget(Budget(tokens=91), None, usage, usage).stop  # 46 + 46 > 91
    assert not check_budget(Budget(tokens=92), None, usage, usage).stop


@pytest.mark.parametrize("steps, every, expected", [(20, 0, 1), (20, 5, 4), (21, 5, 5), (3, 50, 1)])
def test_the_checkpoints_of_a_schedule(steps, every, expected):
    assert checkpoints_of(steps, every) == expected


@pytest.mark.slow  # draws a figure with matplotlib (a second)
def test_the_run_plot_draws_the_running_totals_unsmoothed_and_a_cost_panel_when_priced():
    from searchr1.view import plots

    rows = [{"step": s, "reward/mean": 0.1 * s, "usage/total_model_tokens": 1000.0 * (s + 1) ** 2,
             "cost/total": 0.5 * (s + 1)} for s in range(12)]
    metrics = plots.default_run_metrics(rows)
    assert metrics[-2:] == ("usage/total_model_tokens", "cost/total")
    assert "cost/total" not in plots.default_run_metrics([{"step": 0, "usage/total_model_tokens": 1.0}])
    fig, _ = plots.run_figure(rows, ["usage/total_model_tokens", "cost/total"])
    for ax, key in zip(fig.axes, ("usage/total_model_tokens", "cost/total")):
        assert ax.get_title() == plots.metric_title(key)
        lines = ax.get_lines()
        assert len(lines) == 1  # the totals as logged: no moving average over a running total
        assert list(lines[0].get_ydata()) == [row[key] for row in rows]


def test_a_run_file_line_that_is_not_an_object_is_refused_naming_its_line(tmp_path):
    """metrics.jsonl and checkpoints.jsonl hold objects: another JSON value is one error naming
    file and line; the ledger scan of other runs' checkpoints skips it, as it always did."""
    from searchr1.run.directory import CHECKPOINTS, RunDir, RunDirError, recorded_checkpoints

    run = tmp_path / "run"
    run.mkdir()
    (run / CHECKPOINTS).write_text('{"name": "a", "step": 1}\n[1, 2]\n', encoding="utf-8")
    with pytest.raises(RunDirError, match=rf"{CHECKPOINTS}:2: expected a JSON object, got list"):
        RunDir(run).checkpoints()
    assert recorded_checkpoints(tmp_path) == {"a": run / CHECKPOINTS}
