"""The settings one Search-R1 training step reads (:class:`StepConfig`): the model and its LoRA,
the optimiser, the loss, the reward, the advantage and the rollout.

Each setting is declared once, as a field with its default, rule and help
(:mod:`searchr1.core.settings`); the flags of ``train`` are made from these declarations. A run's
other settings (its length, data, checkpoints, costs, health guard, logging, the off-policy
pipeline, the KL penalty, the offline twin) are the harness's: ``searchr1.training.config``
declares them on a subclass, and ``config.json`` is that object, flat.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from searchr1.core.advantage import ADVANTAGE_MODES, AdvantageMode
from searchr1.core.correction import Correction, CorrectionConfig
from searchr1.core.credit import Credit, StepReward
from searchr1.core.reward import REWARD_KINDS, RewardKind
from searchr1.core.rollout import RolloutConfig
from searchr1.core.settings import OnResume, SettingError, check_settings, setting
from searchr1.core.types import FORMAT_PENALTY, MAX_TOKENS
from searchr1.core.update import POLICY_LOSS_FNS, LossFn


@dataclass(frozen=True)
class StepConfig:
    """What :class:`searchr1.core.trainer.Trainer` reads: the LoRA client it creates, how it
    scores, weighs and sends a step's trajectories, and the rollout they come from (the lab port's
    recipe by default; docs/algorithms.md)."""

    base_model: str = setting("Qwen/Qwen3.5-4B", group="run",
                              help="The model trained (LoRA on it) and sampled.")
    lora_rank: int = setting(32, at_least=4, at_most=64, help="LoRA rank.")
    train_unembed: bool = setting(
        True, help="Train a LoRA on the output projection (unembedding) too, besides the attention "
                   "and MLP projections; export writes it as lm_head.")
    learning_rate: float = setting(4e-5, above=0.0, offline_defaults={"learning": 0.2},
                                   on_resume=OnResume.SEGMENT, help="Adam learning rate.")
    beta1: float = setting(0.9, at_least=0.0, below=1.0, on_resume=OnResume.SEGMENT,
                           help="Adam beta1.")
    beta2: float = setting(0.95, at_least=0.0, below=1.0, on_resume=OnResume.SEGMENT,
                           help="Adam beta2.")
    seed: int = setting(42, group="run", at_least=0, at_most=2**31 - 1,
                        help="Data order, LoRA init and sampling seeds.")
    advantage_mode: AdvantageMode = setting(
        "mean", flag="--advantage", choices=ADVANTAGE_MODES, on_resume=OnResume.SEGMENT,
        help="Group-relative advantage: reward minus group mean (the lab port), z-score, leave-one-out "
             "(reward minus the mean of the other rewards), or raw reward.")
    keep_env_failures: bool = setting(
        False, on_resume=OnResume.SEGMENT,
        help="Train on groups hit by search or sampler failures (default: leave them out and "
             "count them).")
    credit: Credit = setting(
        Credit.TRAJECTORY, group="credit", choices=tuple(c.value for c in Credit), on_resume=OnResume.SEGMENT,
        help="How a trajectory's reward reaches its turns: every turn carries the trajectory's advantage "
             "(the lab port), or gigpo adds each turn's advantage among the turns that start from the same state.")
    step_weight: float = setting(1.0, group="credit", at_least=0.0, at_most=100.0, on_resume=OnResume.SEGMENT,
                                 help="gigpo: the weight of a turn's step advantage (the paper's omega).")
    discount: float = setting(0.95, group="credit", at_least=0.0, at_most=1.0, on_resume=OnResume.SEGMENT,
                              help="gigpo: the discount of later rewards in a turn's return (gamma).")
    step_reward: StepReward = setting(
        StepReward.NONE, group="credit", choices=tuple(r.value for r in StepReward), on_resume=OnResume.SEGMENT,
        help="Rewards a turn earns on its own (with --credit gigpo): evidence pays a first sight of a "
             "reference answer in a tool result and charges each repeated call.")
    evidence_bonus: float = setting(0.1, group="credit", at_least=0.0, at_most=1.0, on_resume=OnResume.SEGMENT,
                                    help="--step-reward evidence: what a turn earns for the first result "
                                         "showing a reference answer.")
    repeat_penalty: float = setting(0.1, group="credit", at_least=0.0, at_most=1.0, on_resume=OnResume.SEGMENT,
                                    help="--step-reward evidence: what each call repeating an earlier one costs.")
    num_substeps: int = setting(
        1, at_least=1, metavar="N", on_resume=OnResume.SEGMENT,
        help="Split each step's datums into N mini-batches (a seeded order), each its own "
             "forward_backward and optim_step; later mini-batches train on moved weights, so the "
             "importance ratio leaves 1 and ppo/cispo clip. 1 = one update per step (the lab port).")
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    # The losses: searchr1.core.objective, searchr1.core.update; the rewards: searchr1.core.reward.
    loss_fn: LossFn = setting(
        "importance_sampling", choices=POLICY_LOSS_FNS, on_resume=OnResume.SEGMENT,
        help="The service's policy loss: importance_sampling (the lab port), ppo (clipped ratio, GRPO), "
             "cispo (clipped ratio as a stop-gradient weight), dro (quadratic log-ratio penalty).")
    # --loss-fn-config KEY=VALUE (repeatable) is its own flag: a dict is no single value
    loss_fn_config: dict[str, float | int | str | bool] = setting(default_factory=dict, cli=False)
    length_reward: float = setting(
        0.0, at_least=0.0, at_most=1.0, on_resume=OnResume.SEGMENT, metavar="WEIGHT",
        help="Add WEIGHT times Kimi k1.5's length reward to each trajectory's reward, lengths compared within "
             "its question's samples: 0.5 - (len - shortest)/(longest - shortest) for a right answer, at most "
             "0 for any other (0 = off).")
    overlong_buffer: int = setting(
        0, at_least=0, at_most=MAX_TOKENS, on_resume=OnResume.SEGMENT, metavar="TOKENS",
        help="DAPO's soft over-long penalty: a trajectory within TOKENS of --max-trajectory-tokens loses up to "
             "1 of its reward, linearly (0 = off).")
    judge_weight: float = setting(
        0.0, group="judge", at_least=0.0, at_most=1.0, on_resume=OnResume.SEGMENT, metavar="WEIGHT",
        help="Mix the --judge's verdict (1 yes, 0 no) into each answer's reward: (1 - WEIGHT) * rule + WEIGHT * "
             "judge; a judge that fails leaves its group out, never a reward (0 = off).")
    correction: Correction = setting(
        Correction.NONE, group="correction", choices=tuple(c.value for c in Correction), on_resume=OnResume.SEGMENT,
        help="Off-policy correction for a sampler that differs from the learner (one forward call a step): "
             "tis caps each token's importance weight at --tis-cap, mis leaves out tokens whose ratio leaves "
             "[--mis-low, --mis-high], decoupled sends the learner's logprobs as the proximal policy and caps "
             "the behaviour weight at --tis-cap (docs/algorithms.md).")
    tis_cap: float = setting(2.0, group="correction", at_least=1.0, at_most=100.0, on_resume=OnResume.SEGMENT,
                             help="tis, decoupled: the cap C of the learner/sampler ratio weighting a token.")
    mis_low: float = setting(0.5, group="correction", above=0.0, at_most=1.0, on_resume=OnResume.SEGMENT,
                             help="mis: a token whose learner/sampler ratio is below this leaves the loss.")
    mis_high: float = setting(2.0, group="correction", at_least=1.0, at_most=100.0, on_resume=OnResume.SEGMENT,
                              help="mis: a token whose learner/sampler ratio is above this leaves the loss.")
    reward: RewardKind = setting(
        "em", choices=REWARD_KINDS, on_resume=OnResume.SEGMENT,
        help="What a valid answer earns: exact match (the lab port), token F1, or cover EM (a reference "
             "anywhere inside the answer, Search-R1's subem); a format failure is "
             f"{FORMAT_PENALTY:g} for all three.")

    @property
    def correction_config(self) -> CorrectionConfig:
        return CorrectionConfig(self.correction, self.tis_cap, self.mis_low, self.mis_high)

    def __post_init__(self) -> None:
        check_settings(self)
        if self.step_reward != StepReward.NONE and self.credit != Credit.GIGPO:
            raise SettingError("--step-reward", f"{self.step_reward}: a step reward moves a turn's advantage "
                               "only through its return, under --credit gigpo; add --credit gigpo")
        if self.overlong_buffer > self.rollout.max_trajectory_tokens:
            raise SettingError("--overlong-buffer", f"{self.overlong_buffer}: more than the whole trajectory "
                               f"(--max-trajectory-tokens {self.rollout.max_trajectory_tokens})")
        if self.rollout.group_size < 2:
            raise SettingError(
                "--group-size", f"{self.rollout.group_size}: group advantages compare a question's "
                "samples with each other, so a group of one always has advantage 0 and no step "
                "could ever update; use at least 2")
