"""Figures, the printed table and ``bench.json``.

Every figure has one or more measures; a measure is a value, optionally a target with a
direction (``<=`` or ``>=``) and whether the target is met. The figure's headline is its first
measure; the figure is met when every measure with a target is. Targets come from the project's
requirements (``target_source: "project"``) or, where those set none, from the benchmark itself
(``"bench"``, documented in docs/benchmarks.md). A measure without a target shows "-".
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from searchr1.basics import fileio
from searchr1.basics.wording import plural
from searchr1.basics import invocation

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

SCHEMA_VERSION = 1
# The lab port's name in bench.json, as a key of a figure's details and within measure keys
# (``steps_seed``, ``seed_way_cpu_seconds_per_step``): kept as the reports already written have it.
LAB_PORT = "seed"


@dataclass(frozen=True)
class Measure:
    key: str
    label: str
    value: float
    target: float | None = None
    comparator: str = "<="  # value <comparator> target meets it
    unit: str = ""
    target_source: str = "project"
    digits: int = 2
    # The spread of the repetitions ``value`` is the median of (lowest, highest), or None when
    # the measure is exact (a count, a deterministic simulation) or was measured once.
    low: float | None = None
    high: float | None = None
    samples: int = 1
    # The documented bound on (high - low) / value (docs/benchmarks.md); a wider spread is reported.
    spread_bound: float | None = None

    def __post_init__(self) -> None:
        if self.comparator not in ("<=", ">="):
            raise ValueError(f"comparator must be '<=' or '>=', got {self.comparator!r}")
        if (self.low is None) != (self.high is None):
            raise ValueError("a spread needs both low and high")
        if self.low is not None and self.high is not None and not self.low <= self.value <= self.high:
            raise ValueError(f"{self.key}: value {self.value} outside its spread [{self.low}, {self.high}]")

    @classmethod
    def of_samples(cls, key: str, label: str, samples: Sequence[float], target: float | None = None,
                   comparator: str = "<=", unit: str = "", target_source: str = "project", digits: int = 2, *,
                   spread_bound: float | None = None) -> Measure:
        """The median of ``samples`` with their lowest and highest as the spread (the other
        arguments are the measure's own)."""
        values = sorted(float(v) for v in samples)
        if not values:
            raise ValueError(f"{key}: no samples")
        value = statistics.median(values)
        if len(values) == 1:
            return cls(key, label, value, target, comparator, unit, target_source, digits, spread_bound=spread_bound)
        return cls(key, label, value, target, comparator, unit, target_source, digits, low=values[0], high=values[-1],
                   samples=len(values), spread_bound=spread_bound)

    def _meets(self, value: float) -> bool:
        assert self.target is not None
        if self.comparator == "<=":
            return value <= self.target + 1e-12
        return value >= self.target - 1e-12

    @property
    def verdict(self) -> str | None:
        """``met`` (every repetition meets the target), ``missed`` (none does), ``straddles``
        (the spread contains the target: the repetitions disagree), or None without a target."""
        if self.target is None:
            return None
        values = [self.value] if self.low is None or self.high is None else [self.low, self.high]
        hits = [self._meets(v) for v in values]
        return "met" if all(hits) else "missed" if not any(hits) else "straddles"

    @property
    def met(self) -> bool | None:
        """True only when the whole spread meets the target (a straddling measure is not met)."""
        verdict = self.verdict
        return None if verdict is None else verdict == "met"

    @property
    def relative_spread(self) -> float | None:
        """(highest - lowest) / median, or None for an exact measure."""
        if self.low is None or self.high is None or self.value == 0:
            return None
        return (self.high - self.low) / abs(self.value)

    @property
    def spread_within_bound(self) -> bool | None:
        spread = self.relative_spread
        if spread is None or self.spread_bound is None:
            return None
        return spread <= self.spread_bound + 1e-12

    def to_json(self) -> dict[str, object]:
        return {
            "label": self.label, "value": self.value, "target": self.target,
            "comparator": self.comparator if self.target is not None else None,
            "met": self.met, "verdict": self.verdict, "unit": self.unit,
            "target_source": self.target_source if self.target is not None else None,
            "low": self.low, "high": self.high, "samples": self.samples,
            "relative_spread": self.relative_spread, "spread_bound": self.spread_bound,
            "spread_within_bound": self.spread_within_bound,
        }

    def spread_text(self) -> str:
        if self.low is None or self.high is None:
            return ""
        text = f"{self.low:.{self.digits}f}–{self.high:.{self.digits}f} (n={self.samples})"
        return text + (" !" if self.spread_within_bound is False else "")

    def formatted(self, number: float | None = None) -> str:
        value = self.value if number is None else number
        text = f"{value:.{self.digits}f}"
        return f"{text}{self.unit}" if self.unit in ("x", "%") else f"{text} {self.unit}".strip()


@dataclass
class Figure:
    number: int
    name: str
    title: str
    measures: list[Measure]
    details: dict[str, object] = field(default_factory=dict)  # JSON: what the measures were made of
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def headline(self) -> Measure:
        return self.measures[0]

    @property
    def met(self) -> bool:
        return all(m.met for m in self.measures if m.target is not None)

    def to_json(self) -> dict[str, object]:
        head = self.headline
        return {
            "figure": self.number,
            "title": self.title,
            "value": head.value,
            "target": head.target,
            "comparator": head.comparator if head.target is not None else None,
            "met": self.met,
            "headline": head.key,
            "measures": {m.key: m.to_json() for m in self.measures},
            "details": self.details,
            "notes": self.notes,
            "seconds": round(self.seconds, 2),
        }


def bench_json(figures: list[Figure], *, quick: bool, seed: int, argv: list[str] | None = None) -> dict[str, object]:
    return {
        "schema": SCHEMA_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "quick": quick,
        "held_to_targets": not quick,  # --quick is a smoke run: its misses are not failures
        "seed": seed,
        "argv": argv or [],
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform()},
        "all_met": all(f.met for f in figures),
        "figures": {f.name: f.to_json() for f in sorted(figures, key=lambda f: f.number)},
    }


def write_json_atomically(path: str | Path, payload: Mapping[str, object]) -> Path:
    path = Path(path)
    fileio.write_json_atomically(path, payload, sort_keys=False)
    return path


def _met_cell(met: bool | None, verdict: str | None = None) -> str:
    if verdict == "straddles":
        return "[yellow]straddles[/yellow]"
    if met is None:
        return "[dim]-[/dim]"
    return "[green]yes[/green]" if met else "[bold red]NO[/bold red]"


def _figure_verdict(figure: "Figure") -> str | None:
    verdicts = [m.verdict for m in figure.measures if m.target is not None]
    if not verdicts:
        return None
    if all(v == "met" for v in verdicts):
        return "met"
    return "straddles" if "missed" not in verdicts else "missed"


def render_table(figures: list[Figure], *, title: str | None = None) -> Table:
    """The figures as one rich table, titled by the command that measured them unless ``title`` is given."""
    from rich.table import Table

    table = Table(title=title or invocation.command("bench"), header_style="bold")
    table.add_column("#", justify="right")
    table.add_column("Figure / measure")
    table.add_column("Value", justify="right")
    table.add_column("Spread (low–high)", justify="right")
    table.add_column("Target", justify="right")
    table.add_column("Met", justify="center")
    for figure in sorted(figures, key=lambda f: f.number):
        verdict = _figure_verdict(figure)  # None: the figure holds no target (it explains another)
        table.add_row(str(figure.number), f"[bold]{figure.title}[/bold]", "", "", "",
                      _met_cell(None if verdict is None else figure.met, verdict))
        for index, measure in enumerate(figure.measures):
            target = "-" if measure.target is None else f"{measure.comparator} {measure.formatted(measure.target)}"
            if measure.target is not None and measure.target_source == "bench":
                target += " *"
            table.add_row("", "  " + measure.label, measure.formatted(), measure.spread_text(), target,
                          _met_cell(measure.met, measure.verdict), end_section=index == len(figure.measures) - 1)
    return table


def print_report(figures: list[Figure], *, console: Console | None = None, output: str | Path | None = None,
                 quick: bool = False) -> None:
    from rich.console import Console

    if console is None:
        console = Console()
        if not console.is_terminal:
            console = Console(width=110)
    title = invocation.command("bench") + (" (--quick: smoke sizes, not for quoting)" if quick else "")
    console.print(render_table(figures, title=title))
    console.print("[dim]* target set by the benchmark (no requirement of the project names one); see "
                  "docs/benchmarks.md[/dim]")
    for figure in sorted(figures, key=lambda f: f.number):
        for note in figure.notes:
            console.print(f"[dim]({figure.number}) {note}[/dim]")
    wide = [f"{f.number}: {m.label.strip()} ({100 * (m.relative_spread or 0):.0f}% > "
            f"{100 * (m.spread_bound or 0):.0f}%)"
            for f in sorted(figures, key=lambda f: f.number) for m in f.measures if m.spread_within_bound is False]
    if wide:
        console.print("[yellow]spread wider than its documented bound (marked !):[/yellow] " + "; ".join(wide))
    straddling = [f for f in figures if _figure_verdict(f) == "straddles"]
    if straddling:
        console.print("[yellow]the repetitions of " + ", ".join(f"{f.number} {f.title}" for f in straddling)
                      + " fall on both sides of a target: not met, not missed; rerun on a quieter machine[/yellow]")
    missed = [f for f in figures if not f.met]
    if missed and quick:  # smoke sizes: too small for the ratios the targets are about
        console.print("[yellow]--quick is a smoke run and is not held to the targets[/yellow] "
                      f"({plural(len(missed), 'figure')} below target at smoke sizes: "
                      + ", ".join(f"{f.number} {f.title}" for f in missed) + "); run without --quick to measure")
    elif missed:
        console.print(f"[bold red]{plural(len(missed), 'figure')} {'misses' if len(missed) == 1 else 'miss'} "
                      "a target:[/bold red] "
                      + ", ".join(f"{f.number} {f.title}" for f in missed))
    else:
        console.print("[green]every target met[/green]")
    if output is not None:
        console.print(f"wrote {output}")
