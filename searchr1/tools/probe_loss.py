"""Ask a PyTRIO service how it reduces a loss, with the fewest (billed) calls.

The second part (``probe_policy_losses``, below) checks that ``ppo``, ``cispo`` and ``dro``
compute what Tinker documents: clip bounds, which factor carries no gradient, DRO's beta.

Whether the lab port's hand micro-batching with n_k/N weights reproduces the full-batch
gradient depends on two server behaviours that pytrio 0.2.9 does not document: how one
``forward_backward`` call is reduced, and how several calls before one ``optim_step``
combine. The checks, on ONE training client with
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
from typing import TYPE_CHECKING

import numpy as np
from pytrio.types import AdamParams, Datum, ModelInput, SamplingParams, TensorData

from searchr1.core.types import Tokenizer

if TYPE_CHECKING:
    from pytrio import ServiceClient, TrainingClient

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
    losses: LossProbe | None = None  # ppo / cispo / dro against Tinker's definitions

    @property
    def nk_over_n_exact(self) -> bool | None:
        """Whether the lab port's n_k/N reweighting reproduces the full-batch gradient."""
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
        if self.losses is not None:
            lines.append(self.losses.render())
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


def _step_metrics(trainer: TrainingClient, batches: list[list[Datum]]) -> dict[str, float]:
    """One ``forward_backward`` per batch, then one ``optim_step`` at learning rate 0."""
    for batch in batches:
        trainer.forward_backward(batch, loss_fn="importance_sampling").result()
    return dict(trainer.optim_step(ZERO_LR).result().metrics)


def probe_loss(
    service: ServiceClient,
    *,
    base_model: str = DEFAULT_BASE_MODEL,
    lora_rank: int = 32,
    tokenizer: Tokenizer | None = None,
    rel_tol: float = 0.05,
    check_losses: bool = False,
) -> ProbeReport:
    """Run the checks on one new training client (the only billed resource) and decide;
    ``check_losses`` adds the policy-loss checks (``probe_policy_losses``: 7 forward, 2
    forward_backward and 2 optim_step calls more, old logprobs deliberately not the sampler's)."""
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

    # the policy losses, at learning rate 0 (weights unchanged for what follows)
    if check_losses:
        base = replace(base, losses=probe_policy_losses(trainer, tokens, action_start))

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


# --- the policy losses: do ppo, cispo and dro compute what Tinker documents? ---------------
#
# A handful of calls on the same training client, at learning rate 0. A first ``forward``
# reads the learner's logprob of every target (``loss_fn_outputs[i]["logprobs"]``); then the
# old logprobs sent are those minus ``log r`` on the action tokens (and equal to them
# elsewhere), which sets the importance ratio to exactly ``r``. ``forward``'s ``loss_sum``
# under each loss then gives the clip bounds, CISPO's weight and DRO's beta (normalised by the
# importance-sampling value of the same datum, so a service that divides ``loss_sum`` by a
# count still reads right), and ``forward_backward`` + ``optim_step`` tells whether a token
# clipped against its advantage still gets a gradient. Tinker's definitions
# (searchr1.core.objective): ppo clips the ratio to [0.8, 1.2] and a token with ``A > 0`` and
# ``r > 1.2`` has no gradient; cispo weights ``logp`` by ``clip(r, 0.8, 1.2)`` and keeps the
# gradient; dro's quadratic term is ``beta / 2 * (log r) ** 2`` (no documented default).

HIGH_RATIO, LOW_RATIO = 1.5, 0.5
DOCUMENTED = {"ppo_high": 1.2, "ppo_low": 0.8, "cispo_high": 1.2}


@dataclass(frozen=True)
class LossProbe:
    """What the service's policy losses did (``None`` where it could not be observed)."""

    ppo_high: float | None = None  # upper clip bound read from loss_sum at r = 1.5, A = +1
    ppo_low: float | None = None  # lower clip bound read at r = 0.5, A = -1
    cispo_high: float | None = None  # CISPO's weight at r = 1.5
    dro_beta: float | None = None  # from loss_sum at r = 1.5, A = 0
    ppo_clipped_grad_norm: float | None = None  # A = +1, r = 1.5 (documented: 0)
    cispo_clipped_grad_norm: float | None = None  # same datum (documented: > 0)
    notes: tuple[str, ...] = ()

    def agreements(self, rel_tol: float = 0.02) -> dict[str, bool | None]:
        """Each documented statement: matched (True), contradicted (False) or not observed."""
        out: dict[str, bool | None] = {}
        for name, documented in DOCUMENTED.items():
            value = getattr(self, name)
            out[name] = None if value is None else _close(value, documented, rel_tol)
        out["ppo_clipped_no_gradient"] = (None if self.ppo_clipped_grad_norm is None
                                          else self.ppo_clipped_grad_norm <= 1e-9)
        out["cispo_clipped_keeps_gradient"] = (None if self.cispo_clipped_grad_norm is None
                                               else self.cispo_clipped_grad_norm > 1e-9)
        return out

    def render(self) -> str:
        def show(value: float | None) -> str:
            return "not observed" if value is None else f"{value:.4g}"

        verdict = {True: "as documented", False: "DIFFERS from Tinker's definition", None: "unknown"}
        found = self.agreements()
        lines = [
            "Policy losses (importance ratio r set exactly on the action tokens; Tinker's definitions in "
            "searchr1/core/objective.py)",
            f"  ppo   upper clip at r={HIGH_RATIO}, A=+1: {show(self.ppo_high)} (documented 1.2: "
            f"{verdict[found['ppo_high']]})",
            f"  ppo   lower clip at r={LOW_RATIO}, A=-1: {show(self.ppo_low)} (documented 0.8: "
            f"{verdict[found['ppo_low']]})",
            f"  ppo   |grad| of tokens clipped against A: {show(self.ppo_clipped_grad_norm)} (documented 0: "
            f"{verdict[found['ppo_clipped_no_gradient']]})",
            f"  cispo weight at r={HIGH_RATIO}: {show(self.cispo_high)} (documented 1.2: "
            f"{verdict[found['cispo_high']]})",
            f"  cispo |grad| of the same tokens: {show(self.cispo_clipped_grad_norm)} (documented > 0: "
            f"{verdict[found['cispo_clipped_keeps_gradient']]})",
            f"  dro   beta of the quadratic term: {show(self.dro_beta)} (Tinker documents no default; "
            "pass --loss-fn-config beta=... to choose it)",
        ]
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)


def ratio_datum(tokens: Sequence[int], action_start: int, learner: np.ndarray, *, ratio: float,
                advantage: float) -> Datum:
    """A datum whose importance ratio is exactly ``ratio`` on its action tokens and 1 elsewhere."""
    old = np.asarray(learner, dtype=np.float64).copy()
    is_action = np.arange(1, len(tokens)) >= action_start
    old[is_action] -= np.log(ratio)
    return policy_datum(tokens, action_start, old_logprobs=old.astype(np.float32).tolist(), advantage=advantage)


def read_loss_probe(sums: dict[str, float], *, action_logprob_sum: float, action_tokens: int,
                    grad_norms: dict[str, float | None]) -> LossProbe:
    """The findings from ``forward`` loss sums (pure). ``sums`` holds ``is_high`` (importance
    sampling at r = 1.5, A = +1), ``ppo_high``, ``ppo_low`` (r = 0.5, A = -1), ``cispo_high`` and
    ``dro`` (r = 1.5, A = 0); a constant normalisation of ``loss_sum`` cancels through ``is_high``."""
    notes: list[str] = []
    reference = sums.get("is_high")
    if not reference:
        return LossProbe(notes=("the importance-sampling loss sum was 0 or missing; nothing could be read",))
    scale = reference / (-HIGH_RATIO * action_tokens)  # loss_sum per unit of the documented sum
    unit = {name: value / scale for name, value in sums.items()}
    ppo_high = -unit["ppo_high"] / action_tokens if "ppo_high" in unit else None
    ppo_low = unit["ppo_low"] / action_tokens if "ppo_low" in unit else None
    cispo_high = (-unit["cispo_high"] / action_logprob_sum
                  if "cispo_high" in unit and action_logprob_sum else None)
    dro_beta = (2 * unit["dro"] / (action_tokens * np.log(HIGH_RATIO) ** 2) if "dro" in unit else None)
    if scale != 1.0 and not _close(scale, 1.0, 1e-3):
        notes.append(f"loss_sum is {scale:.4g} times the documented sum (a normalised sum); values are rescaled")
    return LossProbe(ppo_high=ppo_high, ppo_low=ppo_low, cispo_high=cispo_high,
                     dro_beta=None if dro_beta is None else float(dro_beta),
                     ppo_clipped_grad_norm=grad_norms.get("ppo"), cispo_clipped_grad_norm=grad_norms.get("cispo"),
                     notes=tuple(notes))


def probe_policy_losses(trainer: TrainingClient, tokens: Sequence[int], action_start: int) -> LossProbe:
    """Run the policy-loss checks on ``trainer`` (whose fresh weights sampled ``tokens[action_start:]``)."""
    plain = policy_datum(tokens, action_start, advantage=0.0)
    first = trainer.forward([plain], loss_fn="importance_sampling").result()
    outputs = first.loss_fn_outputs[0] if first.loss_fn_outputs else {}
    if "logprobs" not in outputs:
        return LossProbe(notes=(f"forward returned no per-token logprobs (keys: {sorted(outputs) or 'none'}); "
                                "the importance ratio cannot be set, so nothing was measured",))
    learner = np.asarray(outputs["logprobs"].to_numpy(), dtype=np.float64).reshape(-1)
    is_action = np.arange(1, len(tokens)) >= action_start
    cases = {"is_high": ("importance_sampling", HIGH_RATIO, 1.0), "ppo_high": ("ppo", HIGH_RATIO, 1.0),
             "ppo_low": ("ppo", LOW_RATIO, -1.0), "cispo_high": ("cispo", HIGH_RATIO, 1.0),
             "dro": ("dro", HIGH_RATIO, 0.0)}
    sums = {}
    for name, (loss_fn, ratio, advantage) in cases.items():
        datum = ratio_datum(tokens, action_start, learner, ratio=ratio, advantage=advantage)
        sums[name] = float(trainer.forward([datum], loss_fn=loss_fn).result().metrics["loss_sum"])
    clipped = ratio_datum(tokens, action_start, learner, ratio=HIGH_RATIO, advantage=1.0)
    norms: dict[str, float | None] = {}
    for loss_fn in ("ppo", "cispo"):
        trainer.forward_backward([clipped], loss_fn=loss_fn).result()
        metrics = dict(trainer.optim_step(ZERO_LR).result().metrics)
        key = find_grad_norm_key(metrics)
        norms[loss_fn] = float(metrics[key]) if key else None
    return read_loss_probe(sums, action_logprob_sum=float(learner[is_action].sum()),
                           action_tokens=int(is_action.sum()), grad_norms=norms)
