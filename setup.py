"""Build hook: a wheel also carries the data files the offline commands read from outside the
package (every metadata field is in pyproject.toml).

``cassettes/`` (the recorded search answers and their specs) and ``golden/`` (the golden
trajectories) live at the top of the checkout, where ``cassettes build`` and ``golden --update``
write them. pyproject.toml's ``[tool.searchr1.shipped-data]`` names them; a wheel copies them into
``searchr1/_shipped/``, where ``searchr1.offline.REPO_ROOT`` finds them when the package runs
outside a checkout.
"""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
SHIPPED: dict[str, list[str]] = tomllib.loads((HERE / "pyproject.toml").read_text("utf-8"))["tool"]["searchr1"][
    "shipped-data"]


class BuildPyWithData(build_py):
    """``build_py``, then the files of :data:`SHIPPED` copied under ``searchr1/_shipped``."""

    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "searchr1" / "_shipped"
        for folder, patterns in SHIPPED.items():
            for pattern in patterns:
                for source in sorted((HERE / folder).rglob(pattern)):
                    destination = target / source.relative_to(HERE)
                    destination.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(source, destination)


setup(cmdclass={"build_py": BuildPyWithData})
