"""Input a user hands a command (a data file, a preset, a number on a flag) is taken or refused in
one line naming the file (line, key) or the flag, with exit 1 or 2, before any work is paid for;
never a traceback."""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import typing

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from searchr1.cli import main
from searchr1.commands.search_options import SearchOptions
from searchr1.training.config import TrainConfig
from searchr1.core.rollout import RolloutConfig
from searchr1.core.settings import LARGEST, settings_of


def invoke(*args: object) -> tuple[int, str, BaseException | None]:
    result = CliRunner().invoke(main, [str(arg) for arg in args])
    error = result.exception if not isinstance(result.exception, SystemExit) else None
    return result.exit_code, result.output, error


def error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("Error")]


# --- data rows ------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["train", "eval"])
@pytest.mark.parametrize("field", ["answers", "id", "question"])
def test_a_lone_surrogate_in_a_row_is_refused_before_any_step(tmp_path, command, field):
    """The row is refused in one line naming file:line and the field; nothing is rolled out, so
    no run directory or eval output exists afterwards."""
    row = {"id": "q1", "question": "Who wrote it?", "answers": ["Kafka"], "data_source": "nq"}
    text = json.dumps(row).replace('"Kafka"' if field == "answers" else f'"{row[field]}"', '"x\\udfffy"', 1)
    data = tmp_path / "rows.jsonl"
    data.write_text(text + "\n")
    out = tmp_path / "out"
    target = ["--run-dir", out] if command == "train" else ["--output", out]
    code, output, error = invoke(command, "--offline", "--data", data, *target)
    assert error is None and code == 1
    assert error_lines(output) == [f"Error: {data}:1: field {field}{'[0]' if field == 'answers' else ''} holds "
                                   "a lone surrogate (an escaped \\ud800-\\udfff that is not text); write the "
                                   "character itself, or a valid pair"]
    assert not out.exists()


# --- presets --------------------------------------------------------------------------------------


def preset_verdict(tmp_path, text: str, command: str = "train") -> tuple[int, str]:
    """Read a preset the way ``command`` does and stop there: ``--config`` is eager and comes
    first, so ``--help`` after it answers only once the preset was taken (exit 0)."""
    path = tmp_path / "preset.toml"
    path.write_text(text, encoding="utf-8")
    code, output, error = invoke(command, "--config", path, "--help")
    assert error is None, output
    return code, output


@pytest.mark.parametrize(("text", "says"), [
    ("group_size = [1, 2]", "line 1: group_size must be an integer, not an array"),
    ("seed = 1979-05-27T07:32:00Z", "line 1: seed must be an integer, not a date-time"),
    ("dynamic_sampling = [true]", "line 1: dynamic_sampling must be a boolean (true or false), not an array"),
    ("run_dir = 5", "line 1: run_dir must be a string, not an integer (5)"),
    ("group_size = 8.5", "line 1: group_size must be an integer, not a float (8.5)"),
    ("\n\na.b.c = 1", "line 3: unknown setting 'a'"),
    ('loss_fn = "ppo"\nloss-fn = "ppo"', "line 2: 'loss-fn' and 'loss_fn' are the same setting; keep one"),
    ("learning_rate = nan", "line 1: learning_rate must be a finite number, got nan"),
    ("beta1 = inf", "line 1: beta1 must be a finite number, got inf"),
])
def test_a_preset_value_of_the_wrong_shape_names_the_file_line_and_key(tmp_path, text, says):
    code, output = preset_verdict(tmp_path, text + "\n")
    assert code == 2
    (line,) = error_lines(output)
    assert line.startswith(f"Error: Invalid value for --config: {tmp_path / 'preset.toml'}, {says}")


def test_a_later_check_of_a_preset_value_names_the_file(tmp_path):
    path = tmp_path / "preset.toml"
    path.write_text('\nhealth_rule = ["bogus=1"]\n')
    code, output, error = invoke("train", "--offline", "--config", path, "--run-dir", tmp_path / "run")
    assert error is None and code == 2
    (line,) = error_lines(output)
    assert "unknown rule 'bogus'" in line and line.endswith(f"(set in {path}, line 2)")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("command", "other", "key"), [("eval", "train", "loss_fn"), ("train", "eval", "limit")])
def test_one_preset_serves_train_and_eval_noting_the_other_commands_keys(tmp_path, command, other, key):
    value = '"ppo"' if key == "loss_fn" else "5"
    code, output = preset_verdict(tmp_path, f"group_size = 4\n{key} = {value}\n", command)
    assert code == 0
    assert f"note: {tmp_path / 'preset.toml'}: {key} is a setting of {other}; {command} ignores it" in output


def test_eval_help_says_where_eval_records_the_merged_settings():
    code, output, _ = invoke("eval", "--help")
    assert code == 0 and "config.json" not in output.split("--config", 1)[1].split("\n  --", 1)[0]


TOML_KEYS = st.sampled_from(["group_size", "seed", "learning_rate", "run_dir", "loss_fn", "loss-fn", "health_rule",
                             "dynamic_sampling", "temperature", "limit", "a.b", '"quoted key"', "max_steps"])
SCALARS = st.one_of(st.integers(-2**70, 2**70), st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
                    st.text(max_size=12), st.datetimes(), st.dates())


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, datetime.date):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(map(toml_value, value)) + "]"
    return str(value)


PRESETS = st.one_of(
    st.lists(st.tuples(TOML_KEYS, st.one_of(SCALARS, st.lists(SCALARS, max_size=3))), max_size=4).map(
        lambda pairs: "".join(f"{key} = {toml_value(value)}\n" for key, value in pairs)),
    st.text(max_size=80),
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=PRESETS, command=st.sampled_from(["train", "eval"]))
def test_any_preset_is_taken_or_refused_in_one_line_naming_it(tmp_path, text, command):
    """Invariant: train and eval read any TOML text (valid or not, any keys, any value shapes)
    as a preset they take (exit 0), or refuse it with exit 2 and one error line that names the
    file; never a traceback."""
    code, output = preset_verdict(tmp_path, text, command)
    if code == 0:
        return
    assert code == 2 and "Traceback" not in output
    (line,) = error_lines(output)
    assert str(tmp_path / "preset.toml") in line


# --- numbers --------------------------------------------------------------------------------------


def numeric_settings():
    for cls in (TrainConfig, RolloutConfig, SearchOptions):
        hints = typing.get_type_hints(cls)
        for field, rule in settings_of(cls):
            base = [t for t in typing.get_args(hints[field.name]) if t is not type(None)] or [hints[field.name]]
            if base[0] in (int, float):
                yield pytest.param(cls, field, rule, base[0], id=f"{cls.__name__}.{field.name}")


@pytest.mark.parametrize(("cls", "field", "rule", "kind"), list(numeric_settings()))
def test_every_numeric_setting_is_finite_and_bounded(cls, field, rule, kind):
    """nan and inf break every numeric setting's rule, and so does a number past LARGEST or past
    the setting's own bound (which is never above LARGEST)."""
    for bad in (math.nan, math.inf, -math.inf):
        assert rule.violation(bad) is not None
    too_big = (LARGEST + 1) if kind is int else float(LARGEST) * 2
    assert rule.violation(too_big) is not None and rule.violation(-too_big) is not None
    default = field.default if field.default is not dataclasses.MISSING else None
    if default is not None:
        assert rule.violation(default) is None


@pytest.mark.parametrize(("flag", "value", "says"), [
    ("--learning-rate", "nan", "must be a finite number, got nan"),
    ("--learning-rate", "inf", "must be a finite number, got inf"),
    ("--beta1", "nan", "must be a finite number, got nan"),
    ("--seed", "99999999999999999999999999", "must be <= 2147483647"),
    ("--group-size", "99999999999999999", "must be <= 256"),
    ("--max-trajectory-tokens", "99999999999", "must be <= 262144"),
])
def test_a_number_no_service_can_serve_is_refused_before_the_run_starts(tmp_path, flag, value, says):
    code, output, error = invoke("train", "--offline", flag, value, "--run-dir", tmp_path / "run")
    assert error is None and code == 2
    (line,) = error_lines(output)
    assert flag in line and says in line
    assert not (tmp_path / "run").exists()


# --- cassettes ------------------------------------------------------------------------------------


SHIPPED = "cassettes/deepseek/offline.yaml"


def test_a_cassette_with_a_malformed_status_is_refused_naming_the_file_before_the_run(tmp_path):
    from searchr1.offline import REPO_ROOT

    cassette = tmp_path / "bad.yaml"
    cassette.write_text((REPO_ROOT / SHIPPED).read_text("utf-8").replace("code: 200", "code: abc", 1))
    code, output, error = invoke("train", "--offline", "--cassette", cassette, "--run-dir", tmp_path / "run")
    assert error is None and code == 1
    (line,) = error_lines(output)
    assert line.startswith(f"Error: {cassette} is not a search cassette (interaction ")
    assert "response.status.code must be an HTTP status (100-599), got 'abc'" in line
    assert not (tmp_path / "run").exists()


YAML_SCALARS = st.one_of(st.integers(-10**6, 10**6), st.text(max_size=8), st.booleans(), st.none(),
                         st.lists(st.text(max_size=4), max_size=2), st.dictionaries(st.text(max_size=4),
                                                                                       st.text(max_size=4), max_size=2))


FIELDS = [("request",), ("request", "method"), ("request", "uri"), ("request", "body"), ("request", "headers"),
          ("response",), ("response", "status"), ("response", "status", "code"), ("response", "status", "message"),
          ("response", "headers"), ("response", "headers", "a"), ("response", "body"), ("response", "body", "string")]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mutations=st.lists(st.tuples(st.sampled_from(FIELDS), YAML_SCALARS), min_size=1, max_size=3),
       raw=st.one_of(st.none(), st.binary(max_size=60)))
@example(mutations=[(("response", "headers", "a"), ["\x80"])], raw=None)  # a header value that is not ASCII
@example(mutations=[(("request", "method"), "\na")], raw=None)  # a method with a line break: the miss names it on one line
def test_any_cassette_loads_or_is_refused_in_one_line_naming_it(tmp_path, mutations, raw):
    """Invariant: a cassette whose fields hold values of any shape (or that is arbitrary bytes)
    either loads into a transport that answers every recorded request, or is refused by
    read_cassette_data and load_cassette with one CassetteFormatError line naming the file;
    never another exception."""
    import asyncio

    import httpx
    import yaml

    from searchr1.search.replay import (
        CassetteFormatError,
        CassetteMissError,
        CassetteTransport,
        load_cassette,
        read_cassette_data,
    )

    path = tmp_path / "c.yaml"
    if raw is not None:
        path.write_bytes(raw)
    else:
        interaction = {"request": {"method": "POST", "uri": "http://127.0.0.1/x", "body": "{}", "headers": {}},
                       "response": {"status": {"code": 200, "message": "OK"}, "headers": {"a": ["b"]},
                                    "body": {"string": "{}"}}}
        for field, value in mutations:
            holder = interaction
            for name in field[:-1]:
                holder = holder.get(name) if isinstance(holder, dict) else None
            if isinstance(holder, dict):
                holder[field[-1]] = value
        path.write_text(yaml.safe_dump({"interactions": [interaction], "version": 1}))
    try:
        read_cassette_data(path)
        cassette = load_cassette(path)
    except CassetteFormatError as error:
        assert str(path) in str(error) and "\n" not in str(error)
        return
    transport = CassetteTransport(cassette)
    for request in cassette.requests:
        try:  # the request a client would send for this recording (none can for a URL httpx refuses)
            sent = httpx.Request(request.method, request.uri, content=request.body or b"",
                                 headers=dict(request.headers))
        except httpx.InvalidURL:
            continue
        try:
            asyncio.run(transport.handle_async_request(sent))
        except CassetteMissError as error:  # e.g. a method httpx spells in capitals: a miss, named
            assert str(path) in str(error) and "\n" not in str(error)


# --- flags that would do nothing ------------------------------------------------------------------


@pytest.mark.parametrize(("flags", "says"), [
    (["--backend", "retriever", "--retriever-url", "http://127.0.0.1:18777/retrieve"],
     "--retriever-url has no effect with --offline"),
    (["--index", "some-index"], "--index is read only by --backend local (this command searches with deepseek)"),
    (["--search-topk", "5"], "--search-topk is read only by --backend local or retriever"),
])
@pytest.mark.parametrize("command", ["train", "eval"])
def test_a_search_flag_the_run_would_not_use_is_refused_saying_what_would(tmp_path, command, flags, says):
    target = ["--run-dir", tmp_path / "out"] if command == "train" else ["--output", tmp_path / "out"]
    code, output, error = invoke(command, "--offline", *flags, *target)
    assert error is None and code == 2
    (line,) = error_lines(output)
    assert says in line
    assert not (tmp_path / "out").exists()


# --- bench -o -------------------------------------------------------------------------------------


def test_bench_refuses_an_output_it_cannot_write_before_measuring(tmp_path, monkeypatch):
    import searchr1.bench.runner as runner

    def measured(*args, **kwargs):
        raise AssertionError("the figures ran before the output was checked")

    monkeypatch.setattr(runner, "run_figures", measured)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code, output, error = invoke("bench", "--quick", "--only", "3", "-o", blocker / "bench.json")
    assert error is None and code == 1
    assert error_lines(output) == [f"Error: cannot write bench report {blocker / 'bench.json'}: {blocker} "
                                   "is not a directory"]


# --- train --help ---------------------------------------------------------------------------------


def test_train_help_lists_every_option_under_a_heading_made_from_its_declaration():
    from searchr1.commands.help_layout import SECTIONS
    from searchr1.commands.train import train

    code, output, _ = invoke("train", "--help")
    assert code == 0
    headings = [line for line in output.splitlines() if line.endswith(" options:")]
    train_sections = ("run", "data", "rollout", "context", "algorithm", "credit", "correction", "pipeline", "search",
                      "judge", "service", "health", "cost", "logging")
    assert headings == [f"{name.capitalize()} options:" for name in SECTIONS if name in train_sections] + [
        "Other options:"]
    for param in train.params:
        section = train.section_of(param)
        assert section in SECTIONS or param.name == "help", param.name
    rollout = output.split("Rollout options:", 1)[1].split("Context options:", 1)[0]
    assert "--group-size" in rollout and "--learning-rate" not in rollout


# --- install --------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["train", "eval"])
def test_a_missing_data_file_of_the_user_is_named_without_advice_to_reinstall(tmp_path, command):
    target = ["--run-dir", tmp_path / "run"] if command == "train" else ["--output", tmp_path / "out.jsonl"]
    code, output, error = invoke(command, "--offline", "--data", tmp_path / "x.jsonl", *target)
    assert error is None and code == 1
    (line,) = error_lines(output)
    assert str(tmp_path / "x.jsonl") in line and "does not exist" in line and "reinstall" not in line


@pytest.mark.parametrize(("args", "flag"), [
    (["train", "--connect-timeout", "nan"], "--connect-timeout"),
    (["twin", "serve", "--sample-latency", "inf"], "--sample-latency"),
    (["record", "--backend", "wikipedia", "--query", "q", "--cassette", "c.yaml", "--search-timeout", "nan"],
     "--search-timeout"),
])
def test_a_plain_number_flag_refuses_nan_and_inf(args, flag):
    code, output, error = invoke(*args)
    assert error is None and code == 2
    (line,) = error_lines(output)
    assert flag in line and "must be a finite number" in line
