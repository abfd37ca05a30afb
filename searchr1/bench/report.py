"""Figures, the printed table and ``bench.json``.

Every figure has one or more measures; a measure is a value, optionally a target with a
direction (``<=`` or ``>=``) and whether the target is met. The figure's headline is its first
measure; the figure is met when every measure with a target is. Targets come from the issue
(``target_source: "issue"``) or, where the issue set none, from the benchmark itself
(``"bench"``, documented in CONTRIBUTING.md).
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import fileio

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Measure:
    key: str
    label: str
    value: float
    target: float | None = None
    comparator: str = "<="  # value <comparator> target meets it
    unit: str = ""
    target_source: str = "issue"
    digits: int = 2

    def __post_init__(self) -> None:
        if self.comparator not in ("<=", ">="):
            raise ValueError(f"comparator must be '<=' or '>=', got {self.comparator!r}")

    @property
    def met(self) -> bool | None:
        if self.target is None:
            return None
        if self.comparator == "<=":
            return self.value <= self.target + 1e-12
        return self.value >= self.target - 1e-12

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.label, "value": self.value, "target": self.target,
            "comparator": self.comparator if self.target is not None else None,
            "met": self.met, "unit": self.unit,
            "target_source": self.target_source if self.target is not None else None,
        }

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
    details: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def headline(self) -> Measure:
        return self.measures[0]

    @property
    def met(self) -> bool:
        return all(m.met for m in self.measures if m.target is not None)

    def to_json(self) -> dict[str, Any]:
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


def bench_json(figures: list[Figure], *, quick: bool, seed: int, argv: list[str] | None = None) -> dict[str, Any]:
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


def write_json_atomically(path: str | Path, payload: Any) -> Path:
    path = Path(path)
    fileio.write_json_atomically(path, payload, sort_keys=False)
    return path


def _met_cell(met: bool | None) -> str:
    if met is None:
        return "[dim]-[/dim]"
    return "[green]yes[/green]" if met else "[bold red]NO[/bold red]"


def render_table(figures: list[Figure], *, title: str = "searchr1 bench") -> Any:
    from rich.table import Table

    table = Table(title=title, header_style="bold")
    table.add_column("#", justify="right")
    table.add_column("Figure / measure")
    table.add_column("Value", justify="right")
    table.add_column("Target", justify="right")
    table.add_column("Met", justify="center")
    for figure in sorted(figures, key=lambda f: f.number):
        table.add_row(str(figure.number), f"[bold]{figure.title}[/bold]", "", "", _met_cell(figure.met))
        for index, measure in enumerate(figure.measures):
            target = "" if measure.target is None else f"{measure.comparator} {measure.formatted(measure.target)}"
            if measure.target is not None and measure.target_source == "bench":
                target += " *"
            table.add_row("", "  " + measure.label, measure.formatted(), target, _met_cell(measure.met),
                          end_section=index == len(figure.measures) - 1)
    return table


def print_report(figures: list[Figure], *, console: Any = None, output: str | Path | None = None,
                 quick: bool = False) -> None:
    from rich.console import Console

    if console is None:
        console = Console()
        if not console.is_terminal:
            console = Console(width=110)
    title = "searchr1 bench" + (" (--quick: smoke sizes, not for quoting)" if quick else "")
    console.print(render_table(figures, title=title))
    console.print("[dim]* target set by the benchmark (the issue names none); see CONTRIBUTING.md[/dim]")
    for figure in sorted(figures, key=lambda f: f.number):
        for note in figure.notes:
            console.print(f"[dim]({figure.number}) {note}[/dim]")
    missed = [f for f in figures if not f.met]
    if missed and quick:  # smoke sizes: too small for the ratios the targets are about
        console.print("[yellow]--quick is a smoke run and is not held to the targets[/yellow] "
                      f"({len(missed)} figure(s) below target at smoke sizes: "
                      + ", ".join(f"{f.number} {f.title}" for f in missed) + "); run without --quick to measure")
    elif missed:
        console.print(f"[bold red]{len(missed)} figure(s) miss a target:[/bold red] "
                      + ", ".join(f"{f.number} {f.title}" for f in missed))
    else:
        console.print("[green]every target met[/green]")
    if output is not None:
        console.print(f"wrote {output}")
