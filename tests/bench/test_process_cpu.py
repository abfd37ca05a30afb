"""Another process's CPU, as the bench reads a served twin's: its ended threads count."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from searchr1.bench.thread_cpu import available, process_seconds, thread_seconds

# A thread that spins for half a second of CPU and ends; the process then waits to be read.
CHILD = """
import sys, threading, time
def spin():
    end = time.thread_time() + 0.5
    while time.thread_time() < end:
        pass
worker = threading.Thread(target=spin)
worker.start()
worker.join()
print("done", flush=True)
sys.stdin.readline()
"""


@pytest.mark.slow  # a child process spinning half a second
@pytest.mark.skipif(not available(), reason="needs /proc")
def test_the_cpu_of_a_thread_that_ended_is_still_the_processs() -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "done"
        time.sleep(0.05)
        assert process_seconds(child.pid) >= 0.45
        assert sum(thread_seconds(child.pid).values()) < 0.45  # the live threads alone miss it
    finally:
        child.communicate("\n", timeout=10)


def test_a_process_that_is_not_there_reads_zero() -> None:
    assert process_seconds(2 ** 22 + 12345) == 0.0  # above Linux's largest pid
