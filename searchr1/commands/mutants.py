"""``python cli.py mutants``: mutation testing of the core, a benchmark figure.

mutmut (configured in pyproject.toml's ``[tool.mutmut]``) copies the package into ``mutants/``,
plants one single-point bug at a time in ``searchr1/core/`` (a ``>`` made ``>=``, a constant moved
by one, a default flipped, a line dropped, ...) and runs the core's tests that cover the mutated
function. A mutant the tests fail on is killed; one they pass on survived. The command prints the
kill rate and writes every survivor's diff to a report, which ``docs/mutants.md`` explains.
"""

from __future__ import annotations

import codecs
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import click

from searchr1.commands.help_layout import SectionedCommand
from searchr1.basics import invocation
from searchr1.basics.wording import plural

TARGET_KILL_RATE = 0.90
# docs/mutants.md's table of the survivors that are left on purpose: | `mutant name` | why |
EXPLAINED_IN = Path("docs/mutants.md")
EXPLAINED_ROW = re.compile(r"^\|\s*`(?P<name>[\w.]+__mutmut_\d+)`\s*\|\s*(?P<why>.*?)\s*\|\s*$", re.MULTILINE)
NOT_KILLED = ("survived", "no tests")  # mutmut's statuses of a mutant that was tested and is still there


# mutmut 3's status line (mutmut/stats.py, print_stats), rewritten in place with "\r" as mutants finish:
# "{tested}/{total}  🎉 {killed} 🫥 {no_tests}  ⏰ {timeout}  🤔 {suspicious}  🙁 {survived}  🔇 {skipped}  🧙 {typed}"
MUTMUT_STATUS = re.compile(r"(?P<tested>\d+)/(?P<total>\d+)\s+🎉 \d+ 🫥 \d+\s+⏰ \d+\s+🤔 \d+\s+🙁 (?P<survived>\d+)")
PROGRESS_EVERY_S = 60.0


@dataclass(frozen=True)
class MutmutProgress:
    """Where a mutmut run is: mutants with a verdict so far, of how many, and how many survived."""

    tested: int
    total: int
    survived: int


def last_progress(text: str) -> MutmutProgress | None:
    """The last of mutmut's status lines in ``text`` (``None`` when there is none yet)."""
    found = None
    for found in MUTMUT_STATUS.finditer(text):  # noqa: B007 - the loop keeps the last match, used below
        pass
    return None if found is None else MutmutProgress(int(found["tested"]), int(found["total"]), int(found["survived"]))


def follow_progress(output: IO[bytes], started: float, every: float = PROGRESS_EVERY_S) -> None:
    """Read mutmut's output to its end, and say where the run is every ``every`` seconds (a run
    of the whole core takes the better part of an hour)."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    tail, said_at, said = "", time.monotonic(), None
    while chunk := os.read(output.fileno(), 1 << 16):
        tail = (tail + decoder.decode(chunk))[-4096:]
        progress = last_progress(tail)
        if progress is not None and progress != said and time.monotonic() - said_at >= every:
            minutes = (time.monotonic() - started) / 60
            click.echo(f"mutmut: {progress.tested:,} of {progress.total:,} mutants tested, "
                       f"{progress.survived} survived so far ({minutes:.0f} min)", err=True)
            said_at, said = time.monotonic(), progress


def explained_survivors(text: str) -> dict[str, str]:
    """``{mutant name: why it is left}`` from the rows of docs/mutants.md's survivor table."""
    return {match["name"]: match["why"] for match in EXPLAINED_ROW.finditer(text)}


# One mutant a line, as ``mutmut results --all true`` prints it (mutmut/__main__.py, ``results``):
# "    {name}: {status}", the status one of mutmut/stats.py's ``status_by_exit_code``.
RESULT_LINE = re.compile(r"^\s+(?P<name>\S+): (?P<status>[a-z][a-z ]*)$")


def mutant_statuses(text: str) -> dict[str, str]:
    """``{mutant name: status}`` from mutmut's listing of every mutant."""
    return {match["name"]: match["status"] for line in text.splitlines() if (match := RESULT_LINE.match(line))}


@dataclass(frozen=True)
class MutationStats:
    """How a run's mutants ended, counted from mutmut's own verdict on each."""

    killed: int  # a test failed on it, or mypy refused it first
    survived: int
    timeout: int
    no_tests: int
    total: int
    not_checked: int = 0  # the run stopped before it (Ctrl-C): the next run tests it

    @classmethod
    def of(cls, statuses: dict[str, str]) -> MutationStats:
        """Every status mutmut gives that is not counted here (suspicious, skipped, a segfault, an
        interrupted check) is a mutant not killed."""
        count = Counter(statuses.values())
        return cls(killed=count["killed"] + count["caught by type check"], survived=count["survived"],
                   timeout=count["timeout"], no_tests=count["no tests"], total=len(statuses),
                   not_checked=count["not checked"])

    @property
    def tested(self) -> int:
        return self.total - self.no_tests - self.not_checked

    @property
    def finished(self) -> bool:
        return self.not_checked == 0

    @property
    def kill_rate(self) -> float:
        """Killed (a test failed, or it ran out of time) over every mutant: one that no test
        reaches, or that was not tested yet, counts as not killed."""
        return (self.killed + self.timeout) / self.total if self.total else 0.0


def _mutmut(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "mutmut", *args]
    return subprocess.run(command, capture_output=True, text=True, check=check)


@click.command("mutants", cls=SectionedCommand)
@click.option("--jobs", type=click.IntRange(min=1), default=os.cpu_count() or 1, show_default="every core",
              help="Mutants tested side by side.")
@click.option("--report", type=click.Path(dir_okay=False, path_type=Path), default=Path("mutants-report.md"),
              show_default=True, help="Where the survivors' diffs are written.")
@click.option("--fresh", is_flag=True, help="Forget an earlier run's results (mutants/) and test every mutant again.")
def mutants(jobs: int, report: Path, fresh: bool) -> None:
    """Plant single-point bugs in searchr1/core/ and count how many the core's tests catch.

    Needs a checkout and the mutation extra (pip install -e ".[mutation]"). The whole core is
    about 3,600 mutants, about an hour on two cores (docs/mutants.md); it says where it is every
    minute, and an interrupted run continues where it stopped.
    """
    root = Path.cwd()
    if not (root / "pyproject.toml").is_file() or "[tool.mutmut]" not in (root / "pyproject.toml").read_text("utf-8"):
        raise click.UsageError("run it from a checkout of searchr1 (its pyproject.toml configures mutmut)")
    if _mutmut("--version", check=False).returncode != 0:
        raise click.ClickException('mutmut is not installed; run: pip install -e ".[mutation]"')
    if fresh:
        shutil.rmtree(root / "mutants", ignore_errors=True)
    started = time.monotonic()
    click.echo(f"mutmut: testing the mutants of searchr1/core/ with {plural(jobs, 'job')} ...", err=True)
    # mutmut's type check runs `python -m mypy` ([tool.mutmut]): this interpreter's, venv or not
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    with tempfile.TemporaryFile() as errors:
        run = subprocess.Popen([sys.executable, "-m", "mutmut", "run", "--max-children", str(jobs)],
                               stdout=subprocess.PIPE, stderr=errors, env={**os.environ, "PATH": path})
        assert run.stdout is not None
        try:
            follow_progress(run.stdout, started)
        finally:  # on Ctrl-C mutmut stops its workers itself (its results so far are kept)
            returncode = run.wait()
            run.stdout.close()
        if returncode != 0:
            errors.seek(0)
            tail = errors.read().decode("utf-8", "replace").strip().splitlines()[-1:] or ["no message"]
            raise click.ClickException(f"mutmut run failed (exit {returncode}): {tail[0]}")
    statuses = mutant_statuses(_mutmut("results", "--all", "true").stdout)
    stats = MutationStats.of(statuses)
    minutes = (time.monotonic() - started) / 60
    not_killed = [(name, status) for name, status in statuses.items() if status in NOT_KILLED]
    explained = explained_survivors(EXPLAINED_IN.read_text("utf-8")) if EXPLAINED_IN.is_file() else {}
    unexplained = [(name, verdict) for name, verdict in not_killed if name not in explained]
    # explained, but killed now or no longer a mutant (a changed function renumbers its mutants)
    stale = sorted(name for name in explained if statuses.get(name) not in (*NOT_KILLED, "not checked"))
    lines = ["# Mutants of searchr1/core/ that no test killed", "",
             f"{stats.killed + stats.timeout} of {stats.total} mutants killed ({stats.kill_rate:.1%}) in "
             f"{minutes:.0f} min with {plural(jobs, 'job')}; {stats.survived} survived; {stats.no_tests} reached by "
             f"no test; target {TARGET_KILL_RATE:.0%}." + ("" if stats.finished else
                                                           f" {stats.not_checked} not tested yet: the run stopped."),
             f"{EXPLAINED_IN} says why each survivor is left (equivalent: no input can tell it apart; or "
             f"unreachable); the {len(unexplained)} it does not explain come first.",
             ""]
    for name, verdict in sorted(not_killed, key=lambda pair: pair[0] in explained):
        why = f"explained: {explained[name]}" if name in explained else "NOT EXPLAINED"
        lines += [f"## {name} ({verdict}; {why})", "", "```diff", _mutmut("show", name).stdout.strip(), "```", ""]
    if stale:
        lines += [f"## Explained in {EXPLAINED_IN} but killed now (or renamed)", "", *[f"- `{name}`" for name in stale]]
    report.write_text("\n".join(lines), "utf-8")
    if not stats.finished:
        raise click.ClickException(
            f"the run stopped with {stats.not_checked:,} of {stats.total:,} mutants not tested yet "
            f"(run `{invocation.command('mutants')}` again to go on); so far {stats.killed + stats.timeout:,} "
            f"killed, {stats.survived} survived; survivors so far: {report}")
    verdict = "meets" if stats.kill_rate >= TARGET_KILL_RATE else "misses"
    click.echo(f"killed {stats.killed + stats.timeout} of {stats.total} mutants ({stats.kill_rate:.1%}, {verdict} the "
               f"{TARGET_KILL_RATE:.0%} target), {stats.survived} survived, {stats.no_tests} reached by no test, "
               f"in {minutes:.1f} min; {len(unexplained)} not explained in {EXPLAINED_IN}, {len(stale)} explained "
               f"there but killed now; survivors: {report}")
