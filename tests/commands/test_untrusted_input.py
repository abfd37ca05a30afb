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
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from searchr1.cli import main
from searchr1.commands.search_options import SearchOptions
from searchr1.core.config import TrainConfig
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
