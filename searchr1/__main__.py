"""``python -m searchr1``: the same command group as the ``searchr1`` script and ``python cli.py``."""

from searchr1.cli import main

if __name__ == "__main__":
    main()
