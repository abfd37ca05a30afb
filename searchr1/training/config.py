"""The settings a training run starts with (``config.json``) and the names its checkpoints get.

:class:`TrainConfig` is the core step's settings (:class:`searchr1.core.config.StepConfig`) and
the run's around them: its length, data and checkpoints, the batch and how it is drawn (dynamic
sampling, the off-policy pipeline), how the update is accumulated, the KL penalty, the health
guard, logging, costs and budgets, and what the offline twin serves. Each setting is declared once
(:mod:`searchr1.core.settings`), here or in the core; the flags of ``train`` are made from these
declarations, and ``config.json`` is this object, flat, read back through the same rules.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Literal, get_args

from searchr1.core.config import StepConfig
from searchr1.core.kl import KL_ESTIMATORS, KlEstimator
from searchr1.core.rollout import RolloutConfig
from searchr1.core.settings import OnResume, SettingError, setting
from searchr1.core.types import JsonValue
from searchr1.offline import OFFLINE_POLICIES, OfflinePolicy

Accumulation = Literal["sdk", "manual"]
ACCUMULATION_MODES: tuple[Accumulation, ...] = get_args(Accumulation)
CHECKPOINT_NAME = r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9_-])?$"


def _checkpoint_prefix_rule(name: object) -> str | None:
    """pytrio's checkpoint-name rule, matched whole (``$`` alone would let a trailing newline
    through into a directory name), at most 150 characters."""
    if isinstance(name, str) and re.fullmatch(CHECKPOINT_NAME, name) and len(name) <= 150:
        return None
    shown = repr(name) if len(repr(name)) <= 60 else repr(name)[:57] + "..."
    return (f"{shown} cannot prefix PyTRIO checkpoint names: use letters, digits, '.', '_' and '-' "
            "(at most 150 characters, not starting or ending with '.')")


@dataclass(frozen=True, kw_only=True)
class TrainConfig(StepConfig):
    """Everything a run is started with; ``config.json`` is this object. The core step's settings
    are :class:`StepConfig`'s; each of the run's is declared once here (:mod:`searchr1.core.settings`),
    and the flags of ``train`` are made from both."""

    max_steps: int = setting(group="run", at_least=1, at_most=1_000_000, help="Training steps (required live).",
                             offline_defaults={OfflinePolicy.LEARNING: 20, OfflinePolicy.SCRIPTED: 4},
                             on_resume=OnResume.FREE)
    data: str = setting(group="run", metavar="PATH",
                        help="Training JSONL [default: datasets/train.jsonl; the shipped offline "
                             "set with --offline].")
    run_name: str = setting("search-r1-qwen35-4b", group="run", check=_checkpoint_prefix_rule,
                            help="Also the checkpoint name prefix.")
    questions_per_batch: int = setting(8, at_least=1, at_most=4096,
                                       help="Questions per step (each sampled --group-size times).")
    max_train_samples: int = setting(0, group="run", at_least=0,
                                     help="Use only the first N shuffled examples (0 = all).")
    save_every: int = setting(50, group="run", at_least=0, on_resume=OnResume.SEGMENT,
                              help="Checkpoint every N steps (0 = only the final save).")
    accumulation: Accumulation = setting("sdk", choices=ACCUMULATION_MODES,
                                         on_resume=OnResume.SEGMENT,
                                         help="sdk: one forward_backward per step (exact whatever the server's "
                                              "reduction); manual: the lab port's micro-batches with n_k/N weights.")
    max_micro_batch_items: int = setting(32, at_least=1, cli=False)
    max_micro_batch_padded_tokens: int = setting(64_000, at_least=1, cli=False)
    search: dict[str, JsonValue] = field(default_factory=dict)  # backend settings, recorded as given
    offline: bool = False
    data_sha256: str = ""
    code_version: str = ""  # the package version that started the run (the train command sets it)
    # A random id drawn when the run starts and kept by --resume: it is part of every
    # checkpoint name, so two runs with the same --run-name never save under the same name.
    run_id: str = ""
    # What the service reported for base_model when the run started (searchr1.runtime.preflight).
    server_limits: dict[str, JsonValue] | None = None
    # Rollouts for step b run on the weights after b - K steps (searchr1.training.off_policy); 0 = on-policy.
    max_steps_off_policy: int = setting(
        0, group="pipeline", at_least=0, on_resume=OnResume.SEGMENT,
        help="Roll out the batches of the next K steps while a step trains, on weights up to K steps old (the "
             "importance ratio corrects for it); 0 = on-policy. Worth it when steps are long or training calls "
             "are expensive.")
    # Partial rollouts (searchr1.training.partial): in-flight trajectories move on to newer samplers.
    partial_rollouts: bool = setting(
        False, group="pipeline", on_resume=OnResume.FIXED,
        help="With --max-steps-off-policy K >= 1: a trajectory in flight moves on to the next newer sampler every "
             "--turns-per-version turns, and a group of long trajectories is trained one step later for each such "
             "move instead of holding up its own step; exact on resume.")
    turns_per_version: int = setting(
        2, group="pipeline", at_least=1, at_most=1000, metavar="T", on_resume=OnResume.FIXED,
        help="With --partial-rollouts: turn j of step b's batch samples on the weights after b - K + j // T steps.")
    max_version_lag: int = setting(
        3, group="pipeline", at_least=1, at_most=1000, metavar="S", on_resume=OnResume.FIXED,
        help="With --partial-rollouts: how many versions a trajectory's oldest turn may lag the step that trains "
             "it (at least K); a trajectory ends on its turn budget after (S - K + 1) * T turns.")
    transcripts_per_step: int = setting(
        4, group="logging", at_least=0,
        on_resume=OnResume.SEGMENT,
        help="Trajectories per step written to <run-dir>/transcripts.jsonl (read them with `show`).")
    # Offline runs: the policy the twin serves; None for live runs.
    offline_policy: OfflinePolicy | None = None
    # Offline runs: the twin's --offline-fault ("collapse@N"), kept by --resume unless cleared; None: no fault.
    offline_fault: str | None = None
    # The collapse guard (searchr1.health.rules): stop after N consecutive unhealthy steps (0: only
    # warn), and thresholds that replace the defaults (None turns a rule off).
    stop_on_collapse: int = setting(
        0, group="health", at_least=0, metavar="N",
        on_resume=OnResume.GUARD,
        help="Stop (exit code 3) after N consecutive unhealthy steps, saving a checkpoint and printing the "
             "last healthy one and the command that restarts from it; 0: only warn.")
    health_rules: dict[str, float | None] = field(default_factory=dict)
    # The KL penalty (searchr1.training.base_model, searchr1.core.kl) and dynamic sampling
    # (searchr1.training.dynamic_sampling); docs/algorithms.md.
    kl_coef: float = setting(0.0, at_least=0.0,
                             on_resume=OnResume.SEGMENT,
                             help="KL penalty toward the base model, subtracted from each action token's advantage "
                                  "(0 = off, the lab port); one prompt-logprob request per datum to a base-weights "
                                  "sampler.")
    kl_estimator: KlEstimator = setting("k3", choices=KL_ESTIMATORS,
                                        on_resume=OnResume.SEGMENT,
                                        help="Per-token KL estimate: k1 = logp - logp_base; k3 = exp(-d) + d - 1.")
    dynamic_sampling: bool = setting(False, help="Keep drawing questions until --questions-per-batch groups have "
                                                 "unequal rewards (DAPO); needs --max-steps-off-policy 0.")
    max_oversample_batches: int = setting(2, at_least=0, on_resume=OnResume.SEGMENT,
                                          help="With --dynamic-sampling: at most this many extra batches of "
                                               "questions per step.")
    # Which questions train (searchr1.training.filters, searchr1.training.curriculum): a probe-data file,
    # the filters it feeds, and the curriculum; config.json records the questions dropped and why.
    probe: str | None = setting(None, group="data", metavar="FILE",
                                help="A `probe-data` file of the training data: each question's pass rate "
                                     "closed-book and with tools, for --drop-guessable, --drop-solved and "
                                     "--curriculum.")
    drop_guessable: int = setting(0, group="data", at_least=0, at_most=256, metavar="K",
                                  help="Leave out questions the probe answered right closed-book in at least K "
                                       "attempts (they reward guessing; Kimi k1.5: K=1 of 8); 0 = off. Needs --probe.")
    drop_solved: bool = setting(False, group="data",
                                help="Leave out questions the probe solved with tools in every attempt. Needs --probe.")
    curriculum: bool = setting(False, group="data",
                               help="Draw each step's questions with weight 1 - success rate (Kimi k1.5), the rate "
                                    "starting from the probe's with tools (else 0) and then the latest group's; "
                                    "seeded, exact on resume. Not with --dynamic-sampling.")
    curriculum_floor: float = setting(0.05, group="data", at_least=0.0, at_most=1.0, metavar="W",
                                      help="With --curriculum: the smallest weight a question keeps, so a solved one "
                                           "is still drawn now and then.")
    probe_sha256: str = ""  # the probe file's, when the run started (a resume refuses another)
    dropped_questions: dict[str, list[str]] = field(default_factory=dict)  # reason -> ids left out
    # The judge of --judge-weight (a StepConfig setting): searchr1.training.judging, docs/algorithms.md.
    judge: str | None = setting(
        None, group="judge", metavar="MODEL", on_resume=OnResume.SEGMENT,
        help="With --judge-weight: the judge asked whether each answer means the same as a gold answer, as "
             "eval --judge asks it: 'twin' offline (the twin's documented rule), a deepseek-* model (the "
             "DeepSeek chat API, DEEPSEEK_API_KEY), or a PyTRIO model name.")
    judge_cache: str | None = setting(
        None, group="judge", metavar="PATH|off", on_resume=OnResume.SEGMENT,
        help="Judgements by (question, gold, prediction, judge, prompt version), shared with eval "
             "[default: runs/judge-cache.jsonl].")
    judge_cassette: str | None = setting(
        None, group="judge", metavar="PATH", on_resume=OnResume.SEGMENT,
        help="With a deepseek-* judge: replay its answers from this cassette (offline), or record them into "
             "it (live; the key is never written).")
    # What the run costs (searchr1.run.costs): a price table, and budgets a resume may raise.
    prices: str | None = setting(None, metavar="FILE", group="cost",
                                 on_resume=OnResume.COST,
                                 help="TOML price table (docs/prices.example.toml): cost/... keys next to the "
                                      "usage/... counts of every metrics line.")
    budget: float | None = setting(None, above=0.0, metavar="AMOUNT", group="cost",
                                   on_resume=OnResume.COST,
                                   help="Stop (exit code 4, checkpoint saved) before a step projected to pass this "
                                        "cost, in the price table's currency; needs --prices.")
    budget_tokens: int | None = setting(None, at_least=1, metavar="N", group="cost",
                                        on_resume=OnResume.COST,
                                        help="Stop (exit code 4, checkpoint saved) before a step projected to pass "
                                             "this many model tokens (sampled, trained and KL).")

    def __post_init__(self) -> None:
        if self.offline_policy is not None:  # config.json holds its text
            if self.offline_policy not in OFFLINE_POLICIES:
                raise SettingError("--offline-policy", f"must be one of {', '.join(OFFLINE_POLICIES)}, "
                                   f"got {self.offline_policy!r}")
            object.__setattr__(self, "offline_policy", OfflinePolicy(self.offline_policy))
        super().__post_init__()
        if (self.drop_guessable or self.drop_solved) and not self.probe:
            raise SettingError("--drop-guessable" if self.drop_guessable else "--drop-solved",
                               "needs --probe FILE (a `probe-data` file of the training data)")
        if self.curriculum and self.dynamic_sampling:
            raise SettingError("--curriculum", "does not go with --dynamic-sampling, which draws questions in the "
                               "data's order until a batch has enough signal")
        if self.judge_weight and self.judge is None:
            raise SettingError("--judge-weight", f"{self.judge_weight:g}: names no judge to ask; add --judge MODEL")
        if self.judge is not None and not self.judge_weight:
            raise SettingError("--judge", f"{self.judge}: a training judge is a reward term; give it a weight with "
                               "--judge-weight W (0 < W <= 1), or judge an eval with eval --judge")
        if self.partial_rollouts:
            self._check_partial_rollouts()
        if self.dynamic_sampling and self.max_steps_off_policy:
            raise SettingError("--dynamic-sampling", "needs --max-steps-off-policy 0: how many questions a step "
                               "draws is known only when it has finished, so the next step's batch cannot start "
                               "earlier")

    def _check_partial_rollouts(self) -> None:
        """--partial-rollouts needs an off-policy pipeline, a bound it can keep, and a fixed draw."""
        if not self.max_steps_off_policy:
            raise SettingError("--partial-rollouts", "needs --max-steps-off-policy K >= 1: a trajectory moves on to "
                               "a newer sampler only while later steps train")
        if self.max_version_lag < self.max_steps_off_policy:
            raise SettingError("--max-version-lag", f"{self.max_version_lag} is below --max-steps-off-policy "
                               f"{self.max_steps_off_policy}: a batch's first turn already lags its step by K")
        if self.curriculum:
            raise SettingError("--curriculum", "does not go with --partial-rollouts: a resume redraws the batches "
                               "it rolls out again, and the draw depends on when it is made")

    def to_json(self) -> dict[str, JsonValue]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, payload: dict[str, JsonValue]) -> TrainConfig:
        values: dict[str, object] = dict(payload)
        values.pop("segments", None)  # the run's history of flag changes (commands/train.py)
        rollout = values.get("rollout", {})
        if not isinstance(rollout, dict):
            raise ValueError(f"config.json's rollout must be an object, not {type(rollout).__name__}")
        values["rollout"] = RolloutConfig(**rollout)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"config.json holds unknown fields {unknown}; written by another version?")
        return cls(**values)  # type: ignore[arg-type]  # JSON values: each setting's own rule checks its value
