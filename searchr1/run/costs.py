"""Money and budgets: a price table (``--prices FILE``) turns :class:`~searchr1.run.usage.Usage`
into ``cost/...`` keys, and a budget (``--budget``, ``--budget-tokens``) stops a run before a step
that would pass it.

The price table is TOML (``docs/prices.example.toml``)::

    currency = "CNY"
    [per_million_tokens]        # model tokens, per million
    sample_prompt_tokens = 1.0
    [per_request]               # model counts, per one
    sample_requests = 0.0
    [search.deepseek.per_million_tokens]
    input_tokens = 2.0
    [search.zhihu.per_request]
    quota_units = 0.01
    [tool.open_page.per_request]  # a declared tool's counts, per one
    pages = 0.0
    [judge.deepseek.per_million_tokens]  # the judge of --judge-weight, per service (pytrio, deepseek)
    prompt_tokens = 2.0

Kinds not named cost nothing. A kind in the wrong table, an unknown kind, a negative or
non-numeric price: :class:`PriceError`, one line naming the file, the line and the key.

Costs are a pure function of usage: ``cost/<kind>`` and ``cost/step`` for a step,
``cost/total_<kind>`` and ``cost/total`` for the run so far (from the usage totals, so a
resumed run's costs are an uninterrupted run's).
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Mapping, Sequence
from typing import TypedDict
from dataclasses import dataclass, field
from pathlib import Path

from searchr1.core.errors import UserError
from searchr1.core.tools import DECLARED
from searchr1.run.usage import (JUDGE_SERVICES, Usage, count_checkpoint, line_step, step_means, totals_before,
                                unit_kind, usage_metrics)
from searchr1.basics.json_types import as_float, as_object
from searchr1.basics.wording import plural
from searchr1.basics import invocation

COST = "cost/"
TOKEN_KINDS = ("sample_prompt_tokens", "sample_generated_tokens", "train_tokens", "forward_tokens", "kl_prompt_tokens",
               "kl_generated_tokens")
COUNT_KINDS = ("sample_requests", "forward_backward_calls", "optim_steps", "forward_calls", "kl_requests",
               "weight_saves", "state_saves")
SEARCH_TOKEN_UNITS = ("input_tokens", "cache_read_input_tokens", "output_tokens")
SEARCH_COUNT_UNITS = ("calls", "requests", "web_searches", "quota_units", "http_requests")
JUDGE_TOKEN_UNITS = ("prompt_tokens", "generated_tokens")
JUDGE_COUNT_UNITS = ("calls", "requests")


def tool_count_units(tool: str) -> tuple[str, ...]:
    """The counts of a declared tool a price table may price (``[tool.<name>.per_request]``)."""
    return ("calls", "requests", "http_requests", unit_kind(tool))
PER_MILLION, PER_REQUEST = "per_million_tokens", "per_request"


class PriceError(UserError, ValueError):
    """A price table that cannot be used; the message is one line naming file, line and key."""


class RecordedPrices(TypedDict):
    """A price table as a run's config records it (:meth:`PriceTable.to_json`)."""

    currency: str
    unit_prices: dict[str, float]
    source: str


@dataclass(frozen=True)
class PriceTable:
    """Prices by usage kind (``sample_prompt_tokens``, ``search_deepseek_input_tokens``, ...), each
    per one unit of that kind (a per-million price is divided by a million when read)."""

    currency: str
    unit_prices: Mapping[str, float] = field(default_factory=dict)
    source: str = ""

    def costs(self, usage: Usage) -> dict[str, float]:
        """Cost by priced kind (only kinds with a price; a judge's only in a run that has a judge, so a
        table that prices one adds no keys to a run without it)."""
        kinds = usage.kinds()
        return {kind: kinds.get(kind, 0) * price for kind, price in sorted(self.unit_prices.items())
                if kind in kinds or not kind.startswith("judge_")}

    def cost(self, usage: Usage) -> float:
        return math.fsum(self.costs(usage).values())

    def metrics(self, step: Usage, total: Usage) -> dict[str, float]:
        """``cost/<kind>``, ``cost/step``, ``cost/total_<kind>``, ``cost/total``."""
        out = {f"{COST}{kind}": value for kind, value in self.costs(step).items()}
        out[f"{COST}step"] = self.cost(step)
        out.update({f"{COST}total_{kind}": value for kind, value in self.costs(total).items()})
        out[f"{COST}total"] = self.cost(total)
        return out

    def to_json(self) -> RecordedPrices:
        return {"currency": self.currency, "unit_prices": dict(self.unit_prices), "source": self.source}


def _key_line(text: str, table: str, key: str) -> int:
    """The line (from 1) where ``key`` is set inside ``[table]`` (0 when not found)."""
    current = ""
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        header = re.fullmatch(r"\[\s*([^\[\]]+?)\s*\]\s*(#.*)?", stripped)
        if header:
            current = re.sub(r"\s*\.\s*", ".", header.group(1)).replace('"', "")
            continue
        match = re.match(r'"?([A-Za-z0-9_.-]+)"?\s*=', stripped)
        if match:
            name = match.group(1)
            full = f"{current}.{name}" if current else name
            if full == (f"{table}.{key}" if table else key) or (current == table and name == key):
                return number
    return 0


def load_prices(path: str | Path) -> PriceTable:
    """Read and check a price table; :class:`PriceError` names what is wrong."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise PriceError(f"{path}: cannot read the price table ({error.strerror or error})") from None
    except UnicodeDecodeError:
        raise PriceError(f"{path}: the price table is not UTF-8 text") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise PriceError(f"{path}: not valid TOML: {error}") from None

    def fail(table: str, key: str, why: str) -> PriceError:
        line = _key_line(text, table, key)
        where = f"{path}:{line}" if line else str(path)
        name = f"{table}.{key}" if table else key
        return PriceError(f"{where}: {name} {why}")

    currency = data.get("currency")
    if not isinstance(currency, str) or not currency.strip():
        raise fail("", "currency", "must be a non-empty string (e.g. \"CNY\")" if "currency" in data
                   else "is missing: name the currency of the prices (e.g. currency = \"CNY\")")
    prices: dict[str, float] = {}

    def read(table: str, values: object, tokens: tuple[str, ...], counts: tuple[str, ...], prefix: str) -> None:
        if not isinstance(values, dict):
            raise fail("", table, "must be a table")
        kind_of = table.rsplit(".", 1)[-1]
        allowed = tokens if kind_of == PER_MILLION else counts
        other = counts if kind_of == PER_MILLION else tokens
        for key, value in values.items():
            if key not in allowed:
                hint = (f"is priced in [{table.rsplit('.', 1)[0] + '.' if '.' in table else ''}"
                        f"{PER_REQUEST if kind_of == PER_MILLION else PER_MILLION}]" if key in other
                        else f"is not a usage kind here; known: {', '.join(allowed)}")
                raise fail(table, key, hint)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise fail(table, key, f"must be a price >= 0, got {value!r}")
            prices[prefix + key] = float(value) / (1_000_000 if kind_of == PER_MILLION else 1)

    for key, value in data.items():
        if key in ("currency", "note", "source"):
            continue
        if key in (PER_MILLION, PER_REQUEST):
            read(key, value, TOKEN_KINDS, COUNT_KINDS, "")
        elif key in ("search", "judge"):
            what = "backends" if key == "search" else "services"
            if not isinstance(value, dict):
                raise fail("", key, f"must be a table of {what} ([{key}.deepseek.per_million_tokens], ...)")
            for backend, tables in value.items():
                if not isinstance(tables, dict):
                    raise fail(key, backend, f"must be a table ([{key}.<{what[:-1]}>.per_request], ...)")
                if key == "judge" and backend not in JUDGE_SERVICES:
                    raise fail(key, backend, f"is not a judge's service; known: {', '.join(JUDGE_SERVICES)}")
                for name, values in tables.items():
                    table = f"{key}.{backend}.{name}"
                    if name not in (PER_MILLION, PER_REQUEST):
                        raise fail(f"{key}.{backend}", name,
                                   f"is not a price table; use {PER_MILLION} or {PER_REQUEST}")
                    tokens, counts = ((SEARCH_TOKEN_UNITS, SEARCH_COUNT_UNITS) if key == "search"
                                      else (JUDGE_TOKEN_UNITS, JUDGE_COUNT_UNITS))
                    read(table, values, tokens, counts, f"{key}_{backend}_")
        elif key == "tool":
            if not isinstance(value, dict):
                raise fail("", "tool", "must be a table of declared tools ([tool.open_page.per_request], ...)")
            for tool, tables in value.items():
                if tool not in DECLARED or tool == "search":
                    raise fail("tool", tool, f"is not a declared tool priced here (search is priced per backend "
                                             f"under [search.<backend>]); declared: "
                                             f"{', '.join(name for name in DECLARED if name != 'search')}")
                if not isinstance(tables, dict) or set(tables) - {PER_REQUEST}:
                    raise fail("tool", tool, f"must hold one table, [tool.{tool}.{PER_REQUEST}]")
                read(f"tool.{tool}.{PER_REQUEST}", tables.get(PER_REQUEST, {}), (), tool_count_units(tool),
                     f"tool_{tool}_")
        else:
            raise fail("", key, f"is not a price table; use currency, {PER_MILLION}, {PER_REQUEST}, search, tool, "
                                "judge")
    source = data.get("source", "")
    return PriceTable(currency.strip(), prices, source if isinstance(source, str) else "")


def prices_from_json(recorded: Mapping[str, object] | None) -> PriceTable | None:
    """The table :meth:`PriceTable.to_json` recorded (a config's ``prices``), or None."""
    if not recorded:
        return None
    unit_prices = as_object(recorded.get("unit_prices", {}), "unit_prices")
    return PriceTable(str(recorded["currency"]),
                      {str(kind): as_float(price, f"unit_prices.{kind}") for kind, price in unit_prices.items()},
                      str(recorded.get("source", "")))


# -- budgets --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Budget:
    """``--budget AMOUNT`` (in the price table's currency) and ``--budget-tokens N`` (model tokens,
    :attr:`Usage.tokens`); either may be None."""

    amount: float | None = None
    tokens: int | None = None

    @property
    def active(self) -> bool:
        return self.amount is not None or self.tokens is not None


@dataclass(frozen=True)
class BudgetVerdict:
    """Whether the next step may start: ``stop`` with the figures the stop message names."""

    stop: bool
    what: str = ""  # "cost" or "tokens"
    spent: float = 0.0
    left: float = 0.0
    projected_step: float = 0.0


def check_budget(budget: Budget, prices: PriceTable | None, total: Usage, mean_step: Usage | None) -> BudgetVerdict:
    """Stop before a step projected (from ``mean_step``, the mean of the steps so far) to pass the
    budget; with no step measured yet, only a budget already spent stops."""
    checks: list[tuple[str, float, float, float]] = []
    if budget.amount is not None and prices is not None:
        checks.append(("cost", budget.amount, prices.cost(total), prices.cost(mean_step) if mean_step else 0.0))
    if budget.tokens is not None:
        checks.append(("tokens", float(budget.tokens), float(total.tokens),
                       float(mean_step.tokens) if mean_step else 0.0))
    for what, limit, spent, step in checks:
        if spent + step > limit or (mean_step is None and spent >= limit):
            return BudgetVerdict(True, what, spent, limit - spent, step)
    return BudgetVerdict(False)


def mean_usage(summed: Usage, count: int) -> Usage | None:
    """The mean step of ``count`` steps summing to ``summed`` (counts become fractions); None before any step."""
    if count == 0:
        return None
    return summed.map(lambda value: value / count)


def budget_stop_message(verdict: BudgetVerdict, prices: PriceTable | None, *, completed: int, run_dir: str,
                        budget: Budget) -> str:
    """The one line a budget stop prints: spent, left, and the resume command with a larger budget."""
    if verdict.what == "cost":
        unit = prices.currency if prices else ""
        larger = _larger(budget.amount or 0.0, verdict.spent, verdict.projected_step)
        figures = (f"spent {verdict.spent:.4f} {unit}, {verdict.left:.4f} {unit} left of --budget {budget.amount:g}, "
                   f"the next step would take about {verdict.projected_step:.4f}")
        flag = f"--budget {larger:g}"
    else:
        larger = _larger(float(budget.tokens or 0), verdict.spent, verdict.projected_step)
        figures = (f"spent {verdict.spent:.0f} tokens, {verdict.left:.0f} left of --budget-tokens {budget.tokens}, "
                   f"the next step would take about {verdict.projected_step:.0f}")
        flag = f"--budget-tokens {int(larger)}"
    return (f"budget reached after {plural(completed, 'step')}: {figures}; checkpoint saved. Continue with: "
            + invocation.command(f"train --resume {run_dir} {flag}"))


def _larger(limit: float, spent: float, step: float) -> float:
    """A larger budget to suggest: twice the limit and room for two more steps, rounded up to two digits."""
    wanted = max(limit * 2, spent + 2 * step)
    if wanted <= 0:
        return 1.0
    digits = 1 - math.floor(math.log10(wanted))  # two significant digits
    return math.ceil(round(wanted * 10 ** digits, 6)) / 10 ** digits


class BudgetReached(RuntimeError):
    """The run stopped before a step that would pass its budget; a checkpoint of every finished
    step is saved and the message (one line) says how to continue."""

    def __init__(self, message: str, *, step: int, run_dir: str) -> None:
        super().__init__(message)
        self.step = step
        self.run_dir = run_dir


class RunAccount:
    """A run's usage totals, costs and budget across its steps (and its resumes)."""

    def __init__(self, prices: PriceTable | None = None, budget: Budget | None = None) -> None:
        self.prices = prices
        self.budget = budget or Budget()
        self.total = Usage()
        self._steps = 0
        self._summed = Usage()

    def start(self, history: Sequence[Mapping[str, object]], first_step: int) -> None:
        """Totals and the mean step from the metrics lines of the steps before ``first_step``."""
        earlier = [line for line in history if line_step(line, -1) < first_step]
        self.total = totals_before(earlier, first_step)
        self._steps, self._summed = step_means(earlier)

    def add_step(self, usage: Usage) -> None:
        """Add a finished step's usage to the totals (its checkpoint comes with :meth:`step_metrics`)."""
        self.total.add(usage)
        self._steps += 1
        self._summed.add(usage)

    def step_metrics(self, usage: Usage, *, checkpoint: bool) -> dict[str, float]:
        """The step's usage and cost keys; ``checkpoint``: one is saved after it (counted in it)."""
        if checkpoint:
            saves = Usage()
            count_checkpoint(saves)
            for counted in (usage, self.total, self._summed):
                counted.add(saves)
        metrics = usage_metrics(usage, self.total)
        if self.prices is not None:
            metrics.update(self.prices.metrics(usage, self.total))
        return metrics

    def verdict(self) -> BudgetVerdict:
        """May the next step start? (never stops a run without a budget)"""
        if not self.budget.active:
            return BudgetVerdict(False)
        return check_budget(self.budget, self.prices, self.total, mean_usage(self._summed, self._steps))

    def stop_message(self, verdict: BudgetVerdict, *, completed: int, run_dir: str) -> str:
        return budget_stop_message(verdict, self.prices, completed=completed, run_dir=run_dir, budget=self.budget)
