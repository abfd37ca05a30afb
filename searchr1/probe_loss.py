"""Ask a PyTRIO service how it reduces a loss, with the fewest (billed) calls.

Whether the seed's hand micro-batching with n_k/N weights reproduces the full-batch
gradient depends on two server behaviours that pytrio 0.2.9 does not document
(``pytrio-sdk.md`` §7.2): how one ``forward_backward`` call is reduced, and how several
calls before one ``optim_step`` combine. The checks of §7.5, on ONE training client with
tiny datums:

0. The action tokens of ``d`` are *sampled* from the run's own weights (a few tokens after a
   fixed prompt), with the sampler's logprobs as old logprobs, as a training step would send
   them: a service may refuse to train on tokens it never sampled (the twin's strict mode does).
1. ``forward`` on a datum ``d`` and on the same datum with every non-action target set to
   ``-100``: does ``token_count`` drop, i.e. are ``-100`` targets ignored and what is
   counted?
2. ``forward_backward([d])`` then ``optim_step`` at learning rate 0 (weights unchanged),
   reading a gradient norm from the optimiser metrics. Without one, nothing more can be
   learned and the probe stops ("undetermined").
3. ``[d, d]``: a mean (per token or per sample) keeps the norm, a sum doubles it.
4. If a mean: ``[d, e]`` where ``e`` has zero advantages and a different token count. A
   per-sample mean halves the norm; a per-token mean scales it by
   ``active(d) / (active(d) + active(e))``; a mean over advantage tokens keeps it.
5. Two calls ``[d]``, ``[d]`` before one ``optim_step``: summed calls double the norm,
   averaged calls keep it.

n_k/N reweighting is exact iff the reduction is per sample AND calls are summed. One call
per step is exact whatever the answers are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from pytrio.types import AdamParams, Datum, ModelInput, SamplingParams, TensorData

DEFAULT_BASE_MODEL = "Qwen/Qwen3.5-4B"
PROBE_PROMPT = "Question: what is the capital of France?\nAnswer:"
PROBE_ANSWER_TOKENS = 4
ZERO_LR = AdamParams(learning_rate=0.0)
IGNORE_INDEX = -100


@dataclass(frozen=True)
class ProbeReport:
    base_model: str
    token_count_full: float
    token_count_masked: float
    masked_targets_ignored: bool
    grad_norm_key: str | None
    norms: dict[str, float] = field(default_factory=dict)
    expected_per_token_ratio: float | None = None
    reduction: str = "undetermined"  # per_token | per_sample | sum | per_advantage_token
    accumulation: str = "undetermined"  # sum | mean
    notes: tuple[str, ...] = ()

    @property
    def nk_over_n_exact(self) -> bool | None:
        """Whether the seed's n_k/N reweighting reproduces the full-batch gradient."""
        if self.reduction == "undetermined" or self.accumulation == "undetermined":
            return None
        return self.reduction == "per_sample" and self.accumulation == "sum"

    def render(self) -> str:
        exact = {True: "yes", False: "no", None: "unknown"}[self.nk_over_n_exact]
        masking = "-100 targets are ignored" if self.masked_targets_ignored else "-100 targets count"
        lines = [
            f"Loss-reduction probe ({self.base_model})",
            f"  token_count as is / with -100 on non-action targets: "
            f"{self.token_count_full:g} / {self.token_count_masked:g} "
            f"({masking})",
            f"  gradient norm metric: {self.grad_norm_key or 'none reported'}",
        ]
        for name, value in self.norms.items():
            lines.append(f"  |grad| {name:<28} {value:.6g}")
        lines += [
            f"  reduction within a call:      {self.reduction}",
            f"  calls before one optim_step:  {self.accumulation}",
            f"  n_k/N reweighting exact:      {exact}",
            "  (one forward_backward per step is exact in every case)",
        ]
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)


# --- pure decisions ----------------------------------------------------------------------


def _close(value: float, target: float, rel_tol: float) -> bool:
    return abs(value - target) <= rel_tol * abs(target)


def classify_reduction(
    ratio_double: float, ratio_mixed: float | None, per_token_ratio: float, *, rel_tol: float = 0.05
) -> str:
    """From |g([d,d])|/|g([d])| and |g([d,e])|/|g([d])| (``e`` without advantages)."""
    if _close(ratio_double, 2.0, rel_tol):
        return "sum"
    if not _close(ratio_double, 1.0, rel_tol) or ratio_mixed is None:
        return "undetermined"
    candidates = {
        "per_sample": 0.5,
        "per_token": per_token_ratio,
        "per_advantage_token": 1.0,
    }
    matches = [name for name, target in candidates.items() if _close(ratio_mixed, target, rel_tol)]
    return matches[0] if len(matches) == 1 else "undetermined"


def classify_accumulation(ratio_two_calls: float, *, rel_tol: float = 0.05) -> str:
    """From |g([d]) + g([d]) before one step| / |g([d])|."""
    if _close(ratio_two_calls, 2.0, rel_tol):
        return "sum"
    if _close(ratio_two_calls, 1.0, rel_tol):
        return "mean"
    return "undetermined"


def find_grad_norm_key(metrics: dict[str, float]) -> str | None:
    """The optimiser metric that looks like a gradient norm (server-defined names)."""
    for key in sorted(metrics):
        lowered = key.lower().replace("/", "_").replace(":", "_")
        if "grad" in lowered and "norm" in lowered:
            return key
    return None


# --- datums ------------------------------------------------------------------------------


def policy_datum(
    tokens: Sequence[int],
    action_start: int,
    *,
    old_logprobs: Sequence[float] | None = None,
    advantage: float = 1.0,
    mask_non_action: bool = False,
) -> Datum:
    """Shifted importance-sampling datum: targets from ``action_start`` on are actions."""
    inputs = list(tokens[:-1])
    targets = np.asarray(tokens[1:], dtype=np.int64)
    is_action = np.arange(1, len(tokens)) >= action_start
    if mask_non_action:
        targets = np.where(is_action, targets, IGNORE_INDEX).astype(np.int64)
    logprobs = (
        np.zeros(len(inputs), dtype=np.float32)
        if old_logprobs is None
        else np.asarray(old_logprobs, dtype=np.float32)
    )
    advantages = np.where(is_action, advantage, 0.0).astype(np.float32)
    return Datum(
        model_input=ModelInput.from_ints(inputs),
        loss_fn_inputs={
            "target_tokens": TensorData.from_numpy(targets),
            "logprobs": TensorData.from_numpy(logprobs),
            "advantages": TensorData.from_numpy(advantages),
        },
    )


def _step_metrics(trainer: Any, batches: list[list[Datum]]) -> dict[str, float]:
    """One ``forward_backward`` per batch, then one ``optim_step`` at learning rate 0."""
    for batch in batches:
        trainer.forward_backward(batch, loss_fn="importance_sampling").result()
    return dict(trainer.optim_step(ZERO_LR).result().metrics)


def probe_loss(
    service: Any,
    *,
    base_model: str = DEFAULT_BASE_MODEL,
    lora_rank: int = 32,
    tokenizer: Any = None,
    rel_tol: float = 0.05,
) -> ProbeReport:
    """Run the checks on one new training client (the only billed resource) and decide."""
    trainer = service.create_lora_training_client(base_model, rank=lora_rank)
    tokenizer = tokenizer if tokenizer is not None else trainer.get_tokenizer()
    prompt = list(tokenizer.encode(PROBE_PROMPT))
    # 0. the action tokens, sampled from the run's own (fresh) weights
    sampler = trainer.save_weights_and_get_sampling_client()
    sequence = sampler.sample(
        ModelInput.from_ints(prompt), num_samples=1,
        sampling_params=SamplingParams(max_tokens=PROBE_ANSWER_TOKENS, seed=0),
    ).result().sequences[0]
    answer = list(sequence.tokens)
    if not answer:
        raise ValueError("the sampler returned no token to train on; the probe needs at least one")
    tokens = prompt + answer
    action_start = len(prompt)
    old = [0.0] * (len(prompt) - 1) + [float(x) for x in sequence.logprobs]
    notes: list[str] = []

    # 1. -100 masking, through forward (no gradient, no optimiser state).
    full = trainer.forward(
        [policy_datum(tokens, action_start, old_logprobs=old)], loss_fn="importance_sampling"
    ).result()
    masked = trainer.forward(
        [policy_datum(tokens, action_start, old_logprobs=old, mask_non_action=True)], loss_fn="importance_sampling"
    ).result()
    count_full = float(full.metrics["token_count"])
    count_masked = float(masked.metrics["token_count"])

    d = policy_datum(tokens, action_start, old_logprobs=old)
    filler = tokens * 3  # longer, zero advantage: changes the active-token count only
    e = policy_datum(filler, len(filler), advantage=0.0)
    active_d, active_e = len(tokens) - 1, len(filler) - 1
    base = ProbeReport(
        base_model=base_model,
        token_count_full=count_full,
        token_count_masked=count_masked,
        masked_targets_ignored=count_masked < count_full,
        grad_norm_key=None,
        expected_per_token_ratio=active_d / (active_d + active_e),
    )

    # 2. one datum, learning rate 0.
    metrics = _step_metrics(trainer, [[d]])
    key = find_grad_norm_key(metrics)
    single = float(metrics[key]) if key else 0.0
    if key is None or not single:
        notes.append(
            "optim_step reports no usable gradient norm "
            f"(metrics keys: {sorted(metrics) or 'none'}); reduction cannot be observed"
        )
        return replace(base, grad_norm_key=key, notes=tuple(notes))
    norms = {"[d]": single}
    norm_key: str = key

    def measure(label: str, batches: list[list[Datum]]) -> float:
        """Norm ratio to the single datum (NaN, hence undetermined, if the key vanishes)."""
        norms[label] = float(_step_metrics(trainer, batches).get(norm_key, float("nan")))
        return norms[label] / single

    # 3. [d, d]: mean or sum within a call.
    ratio_double = measure("[d, d]", [[d, d]])
    ratio_mixed = None
    if _close(ratio_double, 1.0, rel_tol):
        # 4. [d, e]: which count the mean divides by.
        ratio_mixed = measure("[d, e] (e: no advantage)", [[d, e]])
    reduction = classify_reduction(
        ratio_double, ratio_mixed, active_d / (active_d + active_e), rel_tol=rel_tol
    )

    # 5. two calls before one step.
    accumulation = classify_accumulation(
        measure("[d] + [d], one step", [[d], [d]]), rel_tol=rel_tol
    )
    return replace(
        base,
        grad_norm_key=key,
        norms=norms,
        reduction=reduction,
        accumulation=accumulation,
        notes=tuple(notes),
    )
