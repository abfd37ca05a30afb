"""--logger: choosing writers, a missing package as one line before any work, and the one
interface (log, finish) over SwanLab, Weights & Biases and TensorBoard, tested with fake modules
in sys.modules (the real packages are optional extras, not installed for the tests)."""

from __future__ import annotations

import math
import sys
import types
from pathlib import Path

import pytest

from searchr1.run import loggers
from searchr1.run.loggers import (
    FanOut,
    LoggerSettings,
    LoggerSetupError,
    check_available,
    open_loggers,
    resolve_loggers,
)

METRICS = {"reward/mean": 0.5, "trainer/loss_mean": -0.01, "train/update_skipped": 0.0, "bad": math.nan}


class Recorder:
    """What a fake package was asked to do, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []


def fake_swanlab(recorder: Recorder) -> types.ModuleType:
    module = types.ModuleType("swanlab")

    class Run:
        def finish(self):
            recorder.calls.append(("finish",))

    def init(**kwargs):
        recorder.calls.append(("init", kwargs))
        return Run()

    def log(data, step=None):
        recorder.calls.append(("log", step, dict(data)))

    module.init, module.log = init, log
    return module


def fake_wandb(recorder: Recorder) -> types.ModuleType:
    module = types.ModuleType("wandb")

    class Run:
        def log(self, data, step=None):
            recorder.calls.append(("log", step, dict(data)))

        def finish(self):
            recorder.calls.append(("finish",))

    def init(**kwargs):
        recorder.calls.append(("init", kwargs))
        return Run()

    module.init = init
    return module


def fake_tensorboard(recorder: Recorder) -> types.ModuleType:
    module = types.ModuleType("tensorboardX")

    class SummaryWriter:
        def __init__(self, logdir):
            recorder.calls.append(("init", logdir))

        def add_scalar(self, tag, value, global_step=None):
            recorder.calls.append(("scalar", tag, value, global_step))

        def flush(self):
            recorder.calls.append(("flush",))

        def close(self):
            recorder.calls.append(("close",))

    module.SummaryWriter = SummaryWriter
    return module


@pytest.fixture
def settings(tmp_path: Path) -> LoggerSettings:
    return LoggerSettings(run_name="demo", run_dir=tmp_path, config={"learning_rate": 4e-5}, project="proj")


def absent(monkeypatch, *modules: str) -> None:
    """Make ``import module`` fail as if the package were not installed."""
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)


# --- choosing ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("requested", "offline", "mode", "has_swanlab", "expected"), [
    ((), True, "auto", True, []),                         # offline default: nothing outside metrics.jsonl
    ((), False, "auto", True, ["swanlab"]),               # live default, as before: swanlab when installed
    ((), False, "auto", False, []),
    ((), False, "disabled", True, []),
    ((), True, "local", True, ["swanlab"]),               # an explicit --swanlab-mode still means swanlab
    (("none",), False, "auto", True, []),
    (("wandb", "tensorboard", "wandb"), True, "auto", True, ["wandb", "tensorboard"]),
    (("swanlab", "wandb"), False, "offline", True, ["swanlab", "wandb"]),
])
def test_which_writers_open(requested, offline, mode, has_swanlab, expected):
    assert resolve_loggers(requested, offline=offline, swanlab_mode=mode,
                           installed=lambda name: has_swanlab) == expected


@pytest.mark.parametrize(("requested", "mode", "message"), [
    (("none", "wandb"), "auto", "--logger none contradicts --logger wandb"),
    (("swanlab",), "disabled", "--logger swanlab contradicts --swanlab-mode disabled"),
    (("mlflow",), "auto", "--logger mlflow is not one of none, swanlab, wandb, tensorboard"),
])
def test_contradictory_choices_are_refused_in_one_line(requested, mode, message):
    with pytest.raises(LoggerSetupError) as info:
        resolve_loggers(requested, offline=False, swanlab_mode=mode, installed=lambda name: True)
    assert str(info.value) == message


@pytest.mark.parametrize(("name", "module", "extra"), [
    ("swanlab", "swanlab", "swanlab"), ("wandb", "wandb", "wandb"), ("tensorboard", "tensorboardX", "tensorboard"),
])
def test_a_missing_package_is_one_line_naming_the_flag_and_the_extra(monkeypatch, name, module, extra):
    absent(monkeypatch, module)  # as if not installed, for the real check
    with pytest.raises(LoggerSetupError) as info:
        check_available([name])
    message = str(info.value)
    assert "\n" not in message
    assert f"--logger {name} needs the {module} package" in message
    assert f"pip install 'searchr1[{extra}]'" in message


def test_an_installed_package_passes_the_check(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", fake_wandb(Recorder()))
    check_available(["wandb"])


def test_nothing_is_started_when_a_package_is_missing(monkeypatch, settings):
    recorder = Recorder()
    monkeypatch.setitem(sys.modules, "wandb", fake_wandb(recorder))
    absent(monkeypatch, "tensorboardX")
    with pytest.raises(LoggerSetupError, match="--logger tensorboard needs the tensorboardX package"):
        open_loggers(["wandb", "tensorboard"], settings)
    assert recorder.calls == []


# --- the writers ----------------------------------------------------------------------------------


def test_swanlab_gets_the_run_and_each_step(monkeypatch, settings):
    recorder = Recorder()
    monkeypatch.setitem(sys.modules, "swanlab", fake_swanlab(recorder))
    fan = open_loggers(["swanlab"], LoggerSettings(**{**settings.__dict__, "swanlab_mode": "local"}))
    fan.log(3, METRICS)
    fan.finish()
    init, log, finish = recorder.calls
    assert init == ("init", {"project": "proj", "experiment_name": "demo", "config": {"learning_rate": 4e-5},
                             "mode": "local"})
    assert log == ("log", 3, {k: v for k, v in METRICS.items() if k != "bad"})  # NaN left out
    assert finish == ("finish",)


def test_swanlab_without_a_mode_uses_its_own_default(monkeypatch, settings):
    recorder = Recorder()
    monkeypatch.setitem(sys.modules, "swanlab", fake_swanlab(recorder))
    open_loggers(["swanlab"], settings).finish()
    assert "mode" not in recorder.calls[0][1]


def test_wandb_gets_the_run_and_each_step(monkeypatch, settings):
    recorder = Recorder()
    monkeypatch.setitem(sys.modules, "wandb", fake_wandb(recorder))
    fan = open_loggers(["wandb"], settings)
    fan(0, METRICS)  # the trainer's calling convention
    fan.log(1, {"reward/mean": 0.7})
    fan.finish()
    assert recorder.calls[0] == ("init", {"project": "proj", "name": "demo", "config": {"learning_rate": 4e-5},
                                          "dir": str(settings.run_dir)})
    assert recorder.calls[1:] == [("log", 0, {k: v for k, v in METRICS.items() if k != "bad"}),
                                  ("log", 1, {"reward/mean": 0.7}), ("finish",)]


def test_tensorboard_writes_scalars_under_the_run_and_flushes_every_step(monkeypatch, settings):
    recorder = Recorder()
    monkeypatch.setitem(sys.modules, "tensorboardX", fake_tensorboard(recorder))
    fan = open_loggers(["tensorboard"], settings)
    fan.log(2, {"reward/mean": 0.5, "note": "text"})
    fan.finish()
    assert recorder.calls == [("init", str(settings.run_dir / "tensorboard")),
                              ("scalar", "reward/mean", 0.5, 2), ("flush",), ("close",)]


def test_every_chosen_writer_receives_every_step(monkeypatch, settings):
    recorders = {name: Recorder() for name in ("swanlab", "wandb", "tensorboardX")}
    monkeypatch.setitem(sys.modules, "swanlab", fake_swanlab(recorders["swanlab"]))
    monkeypatch.setitem(sys.modules, "wandb", fake_wandb(recorders["wandb"]))
    monkeypatch.setitem(sys.modules, "tensorboardX", fake_tensorboard(recorders["tensorboardX"]))
    fan = open_loggers(["swanlab", "wandb", "tensorboard"], settings)
    assert fan.names == ["swanlab", "wandb", "tensorboard"]
    for step in range(3):
        fan.log(step, {"reward/mean": step / 10})
    fan.finish()
    for name in ("swanlab", "wandb"):
        assert [c[1] for c in recorders[name].calls if c[0] == "log"] == [0, 1, 2]
    assert [c[3] for c in recorders["tensorboardX"].calls if c[0] == "scalar"] == [0, 1, 2]


class Failing:
    name = "flaky"

    def __init__(self) -> None:
        self.logged = 0

    def log(self, step, metrics):
        self.logged += 1
        raise ConnectionError("service unreachable\nsecond line")

    def finish(self):
        raise AssertionError("a dropped writer is not finished")


class Keeping:
    name = "keeping"

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.finished = False

    def log(self, step, metrics):
        self.steps.append(step)

    def finish(self):
        self.finished = True


def test_a_writer_that_fails_mid_run_is_reported_once_and_the_others_go_on():
    warnings: list[str] = []
    failing, keeping = Failing(), Keeping()
    fan = FanOut([failing, keeping], warn=warnings.append)
    for step in range(3):
        fan.log(step, {"reward/mean": 0.1})
    fan.finish()
    assert failing.logged == 1
    assert keeping.steps == [0, 1, 2] and keeping.finished
    assert len(warnings) == 1
    assert "flaky logger failed while logging step 0" in warnings[0] and "service unreachable" in warnings[0]
    assert "second line" not in warnings[0]


def test_a_writer_that_cannot_start_is_named_and_the_started_ones_are_finished(monkeypatch, settings):
    recorder = Recorder()
    monkeypatch.setitem(sys.modules, "wandb", fake_wandb(recorder))
    broken = types.ModuleType("tensorboardX")

    def refuse(logdir):
        raise PermissionError(f"cannot write {logdir}")

    broken.SummaryWriter = refuse
    monkeypatch.setitem(sys.modules, "tensorboardX", broken)
    with pytest.raises(LoggerSetupError, match=r"^--logger tensorboard could not start: cannot write"):
        open_loggers(["wandb", "tensorboard"], settings)
    assert recorder.calls[-1] == ("finish",)


def test_no_writer_means_a_fan_out_that_does_nothing(settings):
    fan = open_loggers([], settings)
    fan.log(0, METRICS)
    fan.finish()
    assert fan.names == []


def test_the_extras_are_declared_in_pyproject():
    import tomllib

    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    extras = pyproject["project"]["optional-dependencies"]
    for name, (module, extra) in loggers.PACKAGES.items():
        assert extra in extras, f"extra {extra!r} for --logger {name} is missing"
        assert any(requirement.lower().startswith(module.lower()) for requirement in extras[extra])


def test_planned_loggers_check_packages_at_once_and_write_nothing_until_started(monkeypatch, settings):
    recorder = Recorder()
    monkeypatch.setitem(sys.modules, "tensorboardX", fake_tensorboard(recorder))
    absent(monkeypatch, "wandb")
    with pytest.raises(LoggerSetupError, match="--logger wandb needs"):
        loggers.Loggers(["tensorboard", "wandb"], settings)
    planned = loggers.Loggers(["tensorboard"], settings)
    assert recorder.calls == []  # nothing opened, nothing written yet
    planned.log(0, {"reward/mean": 1.0})  # before start: nowhere to go, no error
    planned.start().log(1, {"reward/mean": 0.5})
    planned.finish()
    assert [c[0] for c in recorder.calls] == ["init", "scalar", "flush", "close"]


# --- train --logger -----------------------------------------------------------------------------------

TRAIN = ["train", "--offline", "--questions-per-batch", "2", "--group-size", "2", "--max-steps", "2"]


def invoke_train(*args) -> tuple[int, str]:
    from click.testing import CliRunner

    from searchr1.cli import main

    result = CliRunner().invoke(main, [*TRAIN, *map(str, args)])
    return result.exit_code, result.output


def test_train_refuses_a_missing_logger_package_in_one_line_before_any_work(monkeypatch, tmp_path):
    absent(monkeypatch, "wandb")
    code, output = invoke_train("--run-dir", tmp_path / "run", "--logger", "wandb")
    assert code == 2
    assert "--logger wandb needs the wandb package" in output and "Traceback" not in output
    assert not (tmp_path / "run").exists()


@pytest.mark.slow  # a training run through the CLI
def test_train_sends_every_step_to_the_chosen_logger(monkeypatch, tmp_path):
    recorder = Recorder()
    monkeypatch.setitem(sys.modules, "tensorboardX", fake_tensorboard(recorder))
    code, output = invoke_train("--run-dir", tmp_path / "run", "--logger", "tensorboard", "--quiet")
    assert code == 0, output
    assert recorder.calls[0] == ("init", str(tmp_path / "run" / "tensorboard"))
    steps = {c[3] for c in recorder.calls if c[0] == "scalar" and c[1] == "reward/mean"}
    assert steps == {0, 1}
    assert recorder.calls[-1] == ("close",)


@pytest.mark.slow  # a training run through the CLI
def test_the_old_swanlab_flags_still_choose_swanlab(monkeypatch, tmp_path):
    recorder = Recorder()
    monkeypatch.setitem(sys.modules, "swanlab", fake_swanlab(recorder))
    code, output = invoke_train("--run-dir", tmp_path / "run", "--swanlab-mode", "local",
                                "--swanlab-project", "old-name", "--quiet")
    assert code == 0, output
    init = recorder.calls[0]
    assert init[0] == "init" and init[1]["mode"] == "local" and init[1]["project"] == "old-name"
    assert [c[1] for c in recorder.calls if c[0] == "log"] == [0, 1]
