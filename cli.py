"""Entry point: ``python cli.py --help`` (the same commands as the ``searchr1`` script)."""

from searchr1.cli import main

if __name__ == "__main__":
    main()
