"""The ``searchr1`` entry point (also ``python cli.py``, ``python -m searchr1`` and ``python -m searchr1.cli``).

The command group itself is click code and lives with the commands, in
:mod:`searchr1.commands.main`.
"""

from searchr1.commands.main import COMMANDS, main

__all__ = ["COMMANDS", "main"]

if __name__ == "__main__":
    main()
