"""The warm interpreter (``tests/warm_python.py``) runs a ``-c`` script as a cold ``python -c``
does: the same exit status, output and errors, script for script."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from warm_python import COLD, run_python

SCRIPTS = {
    "prints": "import sys; print('out', sys.argv[1:]); print('err', file=sys.stderr)",
    "exits-3": "import sys; print('before'); sys.exit(3)",
    "exits-with-a-message": "import sys; sys.exit('went wrong')",
    "raises": "print('partial', flush=True)\nraise ValueError('bad value')",
    "ctrl-c-uncaught": "import os, signal; os.kill(os.getpid(), signal.SIGINT)",
    "ctrl-c-handled": textwrap.dedent("""
        import os, signal, sys
        try:
            os.kill(os.getpid(), signal.SIGINT)
        except KeyboardInterrupt:
            print('stopped', file=sys.stderr); sys.exit(130)
        """),
    "killed": "import os, signal; print('lost'); os.kill(os.getpid(), signal.SIGKILL)",
    "thread-and-atexit": textwrap.dedent("""
        import atexit, threading, time
        atexit.register(lambda: print('atexit ran'))
        threading.Thread(target=lambda: (time.sleep(0.2), print('thread ended'))).start()
        """),
    "where": "import os, sys, __main__; print(os.getcwd(), sys.argv[0], __main__.__name__, sys.path[0] == '')",
}


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_script_ends_as_it_ends_in_a_cold_python(name, tmp_path):
    args = ["-c", SCRIPTS[name], "one", "two words"]
    before = len(COLD)
    warm = run_python(args, cwd=tmp_path, timeout=60)
    assert len(COLD) == before, "the run was started cold"
    cold = subprocess.run([sys.executable, *args], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert (warm.returncode, warm.stdout, warm.stderr) == (cold.returncode, cold.stdout, cold.stderr)


def test_another_environment_is_started_cold(tmp_path):
    before = len(COLD)
    done = run_python(["-c", "import os; print(os.environ['WARM_PYTHON_PROBE'])"], cwd=tmp_path,
                      env={**os.environ, "WARM_PYTHON_PROBE": "read"}, timeout=60)
    assert done.stdout == "read\n" and len(COLD) == before + 1


def test_a_run_past_its_timeout_is_killed_and_said(tmp_path):
    with pytest.raises(subprocess.TimeoutExpired):
        run_python(["-c", "import time; print('started', flush=True); time.sleep(60)"], cwd=tmp_path, timeout=1)
    assert run_python(["-c", "print('next')"], cwd=tmp_path, timeout=60).stdout == "next\n"  # the server goes on
