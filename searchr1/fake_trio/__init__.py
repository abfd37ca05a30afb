"""An offline fake of the PyTRIO 0.2.9 clients, faithful where the SDK is known.

Why it exists: the real service is remote, billed and slow, and several of its behaviours
are not published. The training loop is written against the Protocols in
:mod:`searchr1.trio_types`; this fake satisfies them, so the whole loop (rollouts, datums,
updates, checkpoints, resume after SIGKILL, failures) runs in tests with no key and no
network, and the gradient it applies is computed exactly on a toy policy, so "did the
update do the right thing" is a question with an answer.

Reproduced exactly (from the 0.2.9 source; much of it by calling pytrio's own code):

* signatures, parameter names and defaults of ``ServiceClient``, ``TrainingClient`` and
  ``SamplingClient`` (the subset in ``pytrio-sdk.md`` §3.1, §4.1, §9, §16);
* future shapes: sync methods return pytrio's ``APIFuture`` (``.result()``/``await``);
  trainer ``*_async`` methods resolve to a future (await twice); ``sample_async``,
  ``compute_logprobs_async``, ``save_weights_and_get_sampling_client_async`` and the
  factories' ``*_async`` resolve to the value (await once);
* client-side validation, raised synchronously by the call with pytrio's classes and codes:
  LoRA rank in [4, 64] (``validation.invalid_lora_rank``); the whole training batch check
  of pytrio's ``plan_training_batch`` (empty batch, missing keys, int64 targets, shapes,
  finite values, token ids ``< len(tokenizer)`` with ``-100`` allowed in targets,
  ``TrainingLimits``); checkpoint names (spaces become ``-``, the name pattern, names over
  200 characters shortened to 180 + 20 hex of their sha256) via pytrio's payload builder;
  sampling requests (empty prompt, ``max_tokens`` required, ``num_samples >= 1``) via
  pytrio's request builder; ``load_state*`` only before the first operation
  (``validation.already_initialized``) and only for a matching configuration
  (``validation.checkpoint_config_mismatch`` with the ``mismatches`` details);
* the micro-batch split of one call (same chunks as pytrio) and the global totals every
  chunk carries, hence a result independent of the split;
* metric keys and their client-side aggregation: ``loss_sum`` and ``token_count`` summed
  over chunks, ``loss_mean = loss_sum / token_count`` (0.0 when no tokens);
* a broken client raises ``PyTrioError(code="training.run_broken")`` on every later call;
* ``save_weights_and_get_sampling_client`` saves ``temp-sampling-<32 hex>`` weights and
  returns a new sampling client on them.

Invented (the server does not reveal it; tests must not depend on these being real):

* the model and every number it produces: the toy policy of :mod:`searchr1.toy_policy`
  (base table drawn from the model name, LoRA delta starting at zero);
* the loss reduction (constructor switch ``reduction``: ``per_token`` default over
  pytrio's ``total_active_tokens``, ``per_sample``, ``sum``) and how calls before one
  ``optim_step`` combine (``accumulation``: ``sum`` default, or ``mean``);
* the chunk metrics: ``loss_sum`` is the unreduced sum of the per-token loss terms and
  ``token_count`` the active (non ``-100``) targets;
* ``loss_fn_outputs``: ``{"logprobs": float32 per position}`` for every loss;
  ``ppo``/``cispo``/``dro`` pass validation, then fail through the future
  (``fake.unsupported_loss``);
* ``OptimStepResponse.metrics == {"grad_norm": <pre-clipping L2 norm>}``, an
  ``optim_step`` without accumulated gradients changes nothing; AdamW follows
  ``torch.optim.AdamW``;
* checkpoint paths ``trio://fake/<run>/<state|weights>/<name>``, stored on disk under
  ``home``; saving under an existing name without ``overwrite=True`` fails through the
  future (``fake.checkpoint_exists``); unknown paths raise ``ControlAPIError``
  (``checkpoint_not_found``); TTLs are ignored; temporary sampler names use a
  deterministic hex instead of a random uuid;
* sampling (default backend :class:`ToySampler`): ``stop_reason`` ``"stop"``/``"length"``,
  the stop token kept in ``tokens``, seeds, tempered logprobs;
* fault injection (:class:`FakeFaults`, code ``fake.injected_failure``).
"""

from .faults import INJECTED_FAILURE_CODE, FakeFaults
from .sampling import FakeSamplingClient, ToySampler
from .service import DEFAULT_BASE_MODEL, FakeServiceClient, SamplerFactory
from .store import PATH_PREFIX
from .training import CHECKPOINT_EXISTS_CODE, UNSUPPORTED_LOSS_CODE, FakeTrainingClient

__all__ = [
    "CHECKPOINT_EXISTS_CODE",
    "DEFAULT_BASE_MODEL",
    "INJECTED_FAILURE_CODE",
    "PATH_PREFIX",
    "UNSUPPORTED_LOSS_CODE",
    "FakeFaults",
    "FakeSamplingClient",
    "FakeServiceClient",
    "FakeTrainingClient",
    "SamplerFactory",
    "ToySampler",
]
