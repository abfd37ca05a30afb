"""Shipped cassettes replay through the real clients; record/build/replay mechanics."""

from __future__ import annotations

import asyncio
import json
import shutil
import time

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from click.testing import CliRunner

from searchr1.cli import main
from searchr1.search.cassette_specs import (
    CASSETTE_ROOT,
    SpecError,
    build_cassettes,
    discover_specs,
    load_spec,
)
from searchr1.search.clock import RealClock
from searchr1.search.fake_service import DEFAULT_DEEPSEEK_USAGE
from searchr1.search.recording import recording
from searchr1.search.replay import CassetteFormatError, CassetteMissError, open_replay_backend
from searchr1.core.observation.text import format_observation

SPECS = discover_specs()
CASES = [(spec, backend) for spec in SPECS for backend in spec.backends]
RATE_LIMIT_SIGNALS = ({"status": 429}, {"code": 30001})


def scripted_rate_limit(query) -> bool:
    """Whether the script (the input) throttles this query at least once."""
    for response in query.responses:
        if response.get("status") == 429 or response.get("code") == 30001:
            return True
        if response.get("api_error", {}).get("code") in ("maxlag", "ratelimited"):
            return True
    return False


def test_every_backend_ships_a_demo_cassette_and_the_required_scenarios():
    names = {(backend, spec.name) for spec, backend in CASES}
    for backend in ("wikipedia", "zhihu", "deepseek", "retriever"):
        assert (backend, "demo") in names and (backend, "basic") in names
    scenarios = " ".join(q.scenario for spec in SPECS for q in spec.queries)
    for needle in (
        "no results",
        "429 with Retry-After",
        "503 then",
        "persistent",
        "maxlag",
        "30001",
        "30002",
        "SSE error",
        "JSON",
        "normal results",
    ):
        assert needle in scenarios, needle


@pytest.mark.parametrize(("spec", "backend"), CASES, ids=[f"{b}/{s.name}" for s, b in CASES])
def test_shipped_cassette_replays_to_the_scripted_results_and_stats(spec, backend):
    path = spec.cassette_path(backend)

    async def replay():
        async with open_replay_backend(backend, path) as replayed:
            results = [await replayed.search(q.query) for q in spec.queries]
            return results, replayed.stats.drain()

    results, metrics = asyncio.run(replay())
    n = len(spec.queries)
    for query, result in zip(spec.queries, results, strict=True):
        label = f"{backend}/{spec.name}: {query.query!r}"
        assert result.ok is query.expected_ok, f"{label}: {result.error}"
        assert format_observation(result)
        if query.expected_ok:
            assert [item.title for item in result.items] == query.expected_titles(), label
        if "error" in query.expect:
            assert query.expect["error"] in result.error, label
        if "status" in query.expect:
            assert result.status == query.expect["status"], label
        if "min_latency" in query.expect:
            assert result.latency >= query.expect["min_latency"], label
        if "rate_limited" in query.expect:
            assert query.expect["rate_limited"] is scripted_rate_limit(query), (
                f"{label}: spec disagrees with itself"
            )
    expected_ok = sum(q.expected_ok for q in spec.queries)
    assert metrics["search/requests"] == n
    assert metrics["search/success_rate"] == pytest.approx(expected_ok / n)
    assert metrics["search/error_rate"] == pytest.approx((n - expected_ok) / n)
    assert metrics["search/429_rate"] == pytest.approx(sum(map(scripted_rate_limit, spec.queries)) / n)
    assert metrics["search/results"] == pytest.approx(
        sum(len(q.expected_titles()) for q in spec.queries if q.expected_ok) / n
    )
    assert metrics["search/timeout_rate"] == 0.0 and metrics["search/cache_hit_rate"] == 0.0
    if backend == "deepseek":  # answers written without a web search are counted, not used
        unsearched = sum(q.responses[-1].get("web_searches", 1) == 0 for q in spec.queries)
        assert metrics["search/no_web_search_rate"] == pytest.approx(unsearched / n)


def test_demo_items_carry_the_scripted_text_in_each_backend_layout():
    spec = next(s for s in SPECS if s.name == "demo")

    async def replay(backend):
        async with open_replay_backend(backend, spec.cassette_path(backend)) as replayed:
            return [await replayed.search(q.query) for q in spec.queries]

    for backend in spec.backends:
        for query, result in zip(spec.queries, asyncio.run(replay(backend)), strict=True):
            scripted = [(r["title"], r["text"]) for r in query.responses[-1]["results"]]
            assert [(i.title, i.content) for i in result.items] == scripted
            observation = format_observation(result)
            layout = "Evidence:" if backend == "deepseek" else "Content:"
            assert observation.count(layout) == len(scripted)


def test_deepseek_usage_is_summed_from_the_streams():
    spec = load_spec(CASSETTE_ROOT / "specs" / "deepseek" / "basic.json")

    async def replay():
        async with open_replay_backend("deepseek", spec.cassette_path("deepseek")) as replayed:
            for query in spec.queries:
                await replayed.search(query.query)
            return replayed.stats.drain()

    metrics = asyncio.run(replay())
    usages = [{**DEFAULT_DEEPSEEK_USAGE, **r.get("usage", {})} for q in spec.queries for r in q.responses]
    for field in ("input_tokens", "cache_read_input_tokens", "output_tokens"):
        assert metrics[f"search/{field}"] == sum(u[field] for u in usages)
    assert metrics["search/web_search_requests"] == len(spec.queries)
    assert metrics["search/cache_read_input_tokens"] > 0


@pytest.fixture(scope="module")
def shipped_check():
    """`cassettes build --check` run once (recording every shipped cassette takes seconds): the
    command's outcome, and each call it made to build_cassettes with the report it got back."""
    import searchr1.commands.search_cassettes as command

    calls = []

    def watched(*args, **kwargs):
        calls.append((args, kwargs, build_cassettes(*args, **kwargs)))
        return calls[-1][-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(command, "build_cassettes", watched)
        outcome = CliRunner().invoke(main, ["cassettes", "build", "--check"])
    return outcome, calls


@pytest.mark.slow  # the first of the two tests runs shipped_check
def test_shipped_cassettes_match_their_specs(shipped_check):
    _, [(args, kwargs, report)] = shipped_check
    assert (args, kwargs) == ((CASSETTE_ROOT,), {"check": True, "only": None})  # build_cassettes(check=True)
    assert report.clean, f"stale: {report.differing} orphans: {report.orphans} readme: {report.readme_stale}"
    assert len(report.unchanged) == len(CASES)


@pytest.mark.slow  # the first of the two tests runs shipped_check
def test_cassettes_build_check_command_passes(shipped_check):
    outcome, _ = shipped_check
    assert outcome.exit_code == 0, outcome.output


def test_a_query_missing_from_the_cassette_names_the_query():
    async def replay():
        async with open_replay_backend("wikipedia", CASSETTE_ROOT / "wikipedia" / "demo.yaml") as replayed:
            await replayed.search("a question nobody recorded")

    with pytest.raises(CassetteMissError) as caught:
        asyncio.run(replay())
    assert caught.value.query == "a question nobody recorded"
    assert "a question nobody recorded" in str(caught.value) and "cassettes build" in str(caught.value)


def test_replaying_a_query_again_replays_the_same_episode():
    async def replay():
        async with open_replay_backend("wikipedia", CASSETTE_ROOT / "wikipedia" / "faults.yaml") as replayed:
            results = [await replayed.search("Mount Everest first ascent") for _ in range(3)]
            return results, replayed.stats.drain()

    results, metrics = asyncio.run(replay())
    assert all(r.ok and r.latency >= 3 for r in results)
    assert metrics["search/429_rate"] == 1.0


def test_replay_waits_cost_no_real_time():
    spec = load_spec(CASSETTE_ROOT / "specs" / "wikipedia" / "faults.json")

    async def replay():
        async with open_replay_backend("wikipedia", spec.cassette_path("wikipedia")) as replayed:
            return [await replayed.search(q.query) for q in spec.queries]

    started = time.monotonic()
    results = asyncio.run(replay())
    assert sum(r.latency for r in results) > 8  # 3 s + 5 s of honoured waits, plus backoff
    assert time.monotonic() - started < 3


def test_replay_with_a_real_clock_really_waits():
    """The opposite check: the virtual clock is what makes replay fast."""

    async def replay():
        async with open_replay_backend(
            "deepseek", CASSETTE_ROOT / "deepseek" / "demo.yaml", clock=RealClock()
        ) as b:
            return await b.search("The Little Prince author")

    assert asyncio.run(replay()).ok


def test_replay_does_not_intercept_other_httpx_clients():
    def handler(request):
        return httpx.Response(200, text="untouched")

    async def scenario():
        async with open_replay_backend("retriever", CASSETTE_ROOT / "retriever" / "demo.yaml") as replayed:
            async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as other:
                response = await other.get("https://example.invalid/anything")
            result = await replayed.search("capital of Australia")
        return response.text, result.ok

    assert asyncio.run(scenario()) == ("untouched", True)


def test_replay_refuses_a_cassette_of_another_backend():
    with pytest.raises(CassetteFormatError, match="recorded for 'wikipedia'"):
        open_replay_backend("zhihu", CASSETTE_ROOT / "wikipedia" / "demo.yaml")
    with pytest.raises(CassetteFormatError, match="does not exist"):
        open_replay_backend("zhihu", CASSETTE_ROOT / "zhihu" / "no-such.yaml")


# ----------------------------------------------------------------------------- building


@pytest.fixture
def cassette_copy(tmp_path):
    root = tmp_path / "cassettes"
    shutil.copytree(CASSETTE_ROOT, root)
    return root


@pytest.mark.slow  # records every shipped cassette once (seconds)
def test_check_notices_a_changed_spec_and_build_fixes_it(cassette_copy):
    spec_path = cassette_copy / "specs" / "retriever" / "basic.json"
    data = json.loads(spec_path.read_text())
    data["queries"][0]["results"][0]["text"] = "A different text."
    spec_path.write_text(json.dumps(data))
    target = cassette_copy / "retriever" / "basic.yaml"
    report = build_cassettes(cassette_copy, check=True)
    assert report.differing == [target] and len(report.unchanged) == len(CASES) - 1
    # The check above found every other cassette equal to a fresh recording; the build and the
    # check after it are scoped to the spec's name ("basic", one spec per backend), so the other
    # cassettes are neither recorded a second and a third time nor touched.
    built = build_cassettes(cassette_copy, only="basic")
    assert built.written == [target]
    after = build_cassettes(cassette_copy, check=True, only="basic")
    assert after.clean and target in after.unchanged and len(after.unchanged) == len(built.unchanged) + 1
    assert "A different text." in target.read_text()


@pytest.mark.slow
def test_check_notices_orphans_and_a_stale_readme(cassette_copy):
    (cassette_copy / "wikipedia" / "stray.yaml").write_text(
        (cassette_copy / "wikipedia" / "demo.yaml").read_text()
    )
    readme = cassette_copy / "README.md"
    readme.write_text(readme.read_text().replace("capital of Australia", "capital of Austria"))
    report = build_cassettes(cassette_copy, check=True)
    assert report.orphans == [cassette_copy / "wikipedia" / "stray.yaml"] and report.readme_stale


@pytest.mark.slow
def test_build_leaves_live_recordings_alone(cassette_copy):
    target = cassette_copy / "retriever" / "basic.yaml"
    live = target.read_text().replace(
        "generator: python cli.py cassettes build", "generator: python cli.py record"
    )
    live = live.replace("provenance: 'synthetic", "provenance: live\n  note: 'synthetic")
    target.write_text(live)
    # Only the spec that makes the target ("basic", one per backend): the other cassettes are
    # not what the test is about, and recording them takes seconds.
    report = build_cassettes(cassette_copy, only="basic")
    assert target in report.skipped_live and target.read_text() == live
    assert target not in report.written and report.unchanged  # the other basic cassettes were built


def replace_first_query(**entry):
    def mutate(data):
        data["queries"][0] = {"query": data["queries"][0]["query"], **entry}

    return mutate


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["queries"][0].update(resluts=[]), "unknown key"),
        (replace_first_query(responses=[{"status": 503, "colour": "red"}]), "colour"),
        (replace_first_query(results=[], responses=[]), "exactly one of"),
        (lambda d: d["queries"].append(dict(d["queries"][0])), "appears twice"),
        (lambda d: d.update(options={"no_such_option": 1}), "no_such_option"),
        (replace_first_query(responses=[{"status": 503}] * 5), "never asked"),
    ],
)
def test_bad_specs_fail_with_the_file_and_the_culprit(cassette_copy, mutate, message):
    spec_path = cassette_copy / "specs" / "retriever" / "basic.json"
    data = json.loads(spec_path.read_text())
    mutate(data)
    spec_path.write_text(json.dumps(data))
    with pytest.raises(SpecError, match=message) as caught:
        build_cassettes(cassette_copy, only="basic")
    assert "basic.json" in str(caught.value)


@pytest.mark.slow
def test_cassettes_add_command_extends_the_demo_set(cassette_copy):
    outcome = CliRunner().invoke(
        main,
        [
            "cassettes",
            "add",
            "demo",
            "--root",
            str(cassette_copy),
            "--query",
            "Who wrote Hamlet",
            "--result",
            "Hamlet::Hamlet is a tragedy written by William Shakespeare.",
            "--result",
            "William Shakespeare::An English playwright.",
        ],
    )
    assert outcome.exit_code == 0, outcome.output

    async def replay(backend):
        async with open_replay_backend(backend, cassette_copy / backend / "demo.yaml") as replayed:
            return await replayed.search("Who wrote Hamlet")

    for backend in ("wikipedia", "zhihu", "deepseek", "retriever"):
        result = asyncio.run(replay(backend))
        assert [i.title for i in result.items] == ["Hamlet", "William Shakespeare"]
    again = CliRunner().invoke(
        main, ["cassettes", "add", "demo", "--root", str(cassette_copy), "--query", "Who wrote Hamlet"]
    )
    assert again.exit_code != 0 and "--replace" in again.output


# ----------------------------------------------------------------------------- recording


def test_recording_keeps_the_existing_cassette_when_the_block_fails(tmp_path):
    target = tmp_path / "keep.yaml"
    target.write_text("the old cassette\n")

    async def crash():
        async with httpx.AsyncClient(transport=httpx.MockTransport(lambda r: httpx.Response(200))) as client:
            with recording(target, secrets=[], metadata={}, overwrite=True):
                await client.get("https://example.invalid/")
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        asyncio.run(crash())
    assert target.read_text() == "the old cassette\n"
    assert [p.name for p in tmp_path.iterdir()] == ["keep.yaml"]


def test_recording_refuses_to_overwrite_by_default(tmp_path):
    target = tmp_path / "exists.yaml"
    target.write_text("x")
    with pytest.raises(FileExistsError, match="--overwrite"):
        with recording(target, secrets=[], metadata={}):
            pass


def test_record_command_refuses_to_overwrite_and_validates_sources(tmp_path):
    target = tmp_path / "exists.yaml"
    target.write_text("x")
    runner = CliRunner()
    outcome = runner.invoke(
        main, ["record", "--backend", "wikipedia", "--query", "q", "--cassette", str(target)]
    )
    assert outcome.exit_code != 0 and "--overwrite" in outcome.output and target.read_text() == "x"
    outcome = runner.invoke(
        main, ["record", "--backend", "wikipedia", "--cassette", str(tmp_path / "n.yaml")]
    )
    assert outcome.exit_code != 0 and "exactly one of" in outcome.output
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "ok"}\n{"answer": "no question"}\n')
    outcome = runner.invoke(
        main,
        [
            "record",
            "--backend",
            "wikipedia",
            "--from-dataset",
            str(bad),
            "--cassette",
            str(tmp_path / "n.yaml"),
        ],
    )
    assert outcome.exit_code != 0 and "bad.jsonl:2" in outcome.output


def test_record_command_records_a_dataset_through_the_real_client(tmp_path, monkeypatch):
    import searchr1.commands.record as record_module
    from searchr1.search.fake_service import FakeSearchService

    questions = ["who got the first nobel prize in physics?", "capital of Australia?", "third question?"]
    dataset = tmp_path / "dev.jsonl"
    dataset.write_text(
        "".join(json.dumps({"id": str(n), "question": q}) + "\n" for n, q in enumerate(questions))
    )
    fake = FakeSearchService(
        "retriever", {q: [{"results": [{"title": "T", "text": q}]}] for q in questions[:2]}
    )
    real_factory = record_module.create_search_backend
    monkeypatch.setattr(
        record_module,
        "create_search_backend",
        lambda name, **kw: real_factory(name, transport=httpx.MockTransport(fake.handler), **kw),
    )
    target = tmp_path / "dev.yaml"
    outcome = CliRunner().invoke(
        main,
        [
            "record",
            "--backend",
            "retriever",
            "--from-dataset",
            str(dataset),
            "--limit",
            "2",
            "--cassette",
            str(target),
        ],
    )
    assert outcome.exit_code == 0, outcome.output

    async def replay():
        async with open_replay_backend("retriever", target) as replayed:
            return [await replayed.search(q) for q in questions[:2]]

    assert [r.items[0].content for r in asyncio.run(replay())] == questions[:2]


# ----------------------------------------------------------------------------- installed versions

library_versions = st.from_regex(r"[0-9]{1,3}(\.[0-9]{1,3}){0,3}((a|b|rc|\.dev|\.post)[0-9]{1,3})?(\+[a-z0-9.]{1,8})?",
                                 fullmatch=True)


@pytest.mark.slow
@settings(max_examples=3, deadline=None, phases=[Phase.generate],  # a failure is clear without shrinking
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(version=library_versions)
def test_generated_files_do_not_depend_on_the_installed_httpx(version, monkeypatch):
    """Whatever httpx release is installed (its reported version drawn at random), the live client
    sends that version in its User-Agent and the shipped cassettes and offline files still check
    clean: the version never reaches a generated file."""
    from searchr1.offline import PAGES, build_long_files, build_offline_files, build_page_files, load_source
    from searchr1.offline.long_world import long_source
    from searchr1.search.wikipedia import user_agent

    monkeypatch.setattr(httpx, "__version__", version)
    assert user_agent(None).endswith(" httpx/" + ".".join(version.split(".")[:2]))
    # What `offline-data --check` compares (tests/tools/test_golden.py runs the command): its
    # generated files here, and its cassettes (cassettes/*/offline.yaml) in the check of every
    # cassette below, so that they are recorded once per example, not twice.
    files = {**build_offline_files(load_source()), **build_page_files(load_source(PAGES)),
             **build_long_files(long_source())}
    stale = [path for path, text in files.items() if not path.is_file() or path.read_text("utf-8") != text]
    assert files and not stale, f"stale under httpx {version}: {stale}"
    report = build_cassettes(check=True)
    assert report.clean, f"stale under httpx {version}: {report.differing}"
    offline = {spec.cassette_path(backend) for spec in SPECS if spec.name == "offline" for backend in spec.backends}
    assert offline and offline <= set(report.unchanged)


product_names = st.from_regex(r"[A-Za-z][A-Za-z0-9._-]{0,11}", fullmatch=True).filter(lambda n: n != "searchr1")
versions = st.from_regex(r"[0-9A-Za-z][0-9A-Za-z.+_-]{0,11}", fullmatch=True)
comments = st.text(st.characters(blacklist_characters="()", blacklist_categories=("Cs",)), max_size=30)


@given(products=st.lists(st.tuples(product_names, versions, versions), max_size=4), comment=comments,
       own=versions)
def test_a_recorded_user_agent_keeps_names_and_comment_and_drops_library_versions(products, comment, own):
    """Two User-Agents that differ only in their libraries' versions are recorded alike; the
    client's own version, every product name and the comment are recorded as sent."""
    from searchr1.search.recording import VERSION_PLACEHOLDER, unversioned_user_agent

    def agent(which: int) -> str:
        tokens = " ".join(f"{name}/{pair[which]}" for name, *pair in products)
        return f"searchr1/{own} ({comment}) {tokens}".rstrip()

    first, second = unversioned_user_agent(agent(0)), unversioned_user_agent(agent(1))
    assert first == second
    assert first.startswith(f"searchr1/{own} ({comment})")
    assert first.split(f"({comment})", 1)[1].split() == [f"{name}/{VERSION_PLACEHOLDER}" for name, *_ in products]


def test_a_cassette_read_again_is_not_parsed_again_but_a_changed_one_is(tmp_path, monkeypatch):
    """The second read of an unchanged cassette comes from the process's parsed copy (no YAML
    parse), each caller gets a copy of its own, and a file changed in place is parsed afresh."""
    from searchr1.search import replay

    path = tmp_path / "demo.yaml"
    shutil.copyfile(CASSETTE_ROOT / "wikipedia" / "demo.yaml", path)
    first = replay.read_cassette_data(path)
    parses = []
    real_parse = replay._parse_cassette
    monkeypatch.setattr(replay, "_parse_cassette", lambda p: parses.append(p) or real_parse(p))
    second = replay.read_cassette_data(path)
    assert second == first and parses == []
    second["interactions"].clear()
    assert replay.read_cassette_data(path) == first  # the kept copy was not the caller's
    shutil.copyfile(CASSETTE_ROOT / "wikipedia" / "faults.yaml", path)
    changed = replay.read_cassette_data(path)
    assert parses == [path] and changed != first
