"""The core stands on its own: importing it loads none of the harness around it."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys

import searchr1.core

FORBIDDEN = ("searchr1.twin", "searchr1.bench", "searchr1.commands", "searchr1.search.wikipedia",
             "searchr1.search.zhihu", "searchr1.search.deepseek", "searchr1.search.retriever",
             "searchr1.search.replay", "searchr1.search.recording", "searchr1.search.base", "vcr", "yaml",
             "matplotlib", "rich", "click")
CORE_MODULES = sorted(f"searchr1.core.{m.name}" for m in pkgutil.iter_modules(searchr1.core.__path__))


def loaded_after_importing(modules: list[str]) -> set[str]:
    script = ("import json, sys\n" + "".join(f"import {m}\n" for m in modules)
              + "print(json.dumps(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    return set(json.loads(out))


def test_importing_the_core_loads_no_twin_bench_command_transport_vcrpy_matplotlib_or_rich():
    assert {"searchr1.core.trainer", "searchr1.core.rollout", "searchr1.core.protocol"} <= set(CORE_MODULES)
    loaded = loaded_after_importing(CORE_MODULES)
    offending = sorted(m for m in loaded if m.split(".")[0] in FORBIDDEN
                       or any(m == f or m.startswith(f + ".") for f in FORBIDDEN))
    assert offending == []


def test_the_check_sees_a_forbidden_import():
    """The same probe does see the harness when it is imported (the test above can fail)."""
    loaded = loaded_after_importing(["searchr1.core.trainer", "searchr1.search.replay"])
    assert "vcr" in loaded and "searchr1.search.replay" in loaded
