"""How the user runs this program, for the command lines that hints, examples and help print.

The ``searchr1`` script (an installed package) and ``python cli.py`` (a checkout) run the same
commands. Every command line the program prints starts the way the user started it, so that it
runs as printed: :func:`command` writes those lines, and nothing else in the package names the
program. The command group records how it was invoked (:func:`record`) for the duration of a
run; outside a run (the package used as a library), lines say ``searchr1``.

Help texts are written at import time, before anyone invoked anything: they say
:data:`PROGRAM` where the program goes, and the commands' help formatter puts the invoked
program there (:func:`fill`) when it shows them.
"""

from __future__ import annotations

import os
import shlex
import sys

INSTALLED = "searchr1"  # the console script of the installed package
CHECKOUT = "python cli.py"  # the entry point at the root of a checkout
PROGRAM = "%(prog)s"  # where a help text names the program; :func:`fill` replaces it

_invoked: str | None = None


def program_for(name: str) -> str:
    """The command prefix for the program name click saw: a script file runs with python, by
    the path it was started with (``cli.py`` is ``python cli.py``, or ``python ../cli.py`` when
    started so); any other name (``searchr1``, ``python -m searchr1.cli``) as it is."""
    if not name.endswith(".py") or " " in name:
        return name
    started = sys.argv[0] if sys.argv else ""
    script = started if os.path.basename(started) == name else name  # click names the script by its base name
    return f"python {shlex.quote(script)}"


def record(program: str | None) -> None:
    """From now on, command lines start with ``program`` (a prefix such as
    :func:`program_for` gives); ``None`` goes back to the default, :data:`INSTALLED`."""
    global _invoked
    _invoked = program


def recorded() -> str | None:
    """The program recorded by :func:`record`, or ``None`` outside a run."""
    return _invoked


def command(arguments: str = "", *, checkout: bool = False) -> str:
    """``arguments`` as a command line the user can run, started as the program was invoked:
    ``searchr1 train --resume runs/x`` or ``python cli.py train --resume runs/x``. With
    ``checkout``, always the checkout's form: for generated files, whose text must not depend
    on who ran the generator."""
    program = CHECKOUT if checkout else (_invoked or INSTALLED)
    return f"{program} {arguments}" if arguments else program


def fill(text: str) -> str:
    """``text`` with each :data:`PROGRAM` replaced by the program as invoked."""
    return text.replace(PROGRAM, command()) if PROGRAM in text else text
