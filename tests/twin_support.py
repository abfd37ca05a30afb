"""Helpers for tests that run the real pytrio client against the twin."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from pytrio.types import Datum, ModelInput, SamplingParams, TensorData

from searchr1.twin import Twin, start_twin
from searchr1.twin.client import FAST_RETRIES

MODEL = "Qwen/Qwen3.5-4B"
PROMPT = "Question: what is the capital of France?\nAnswer:"
# The tokenizers the SDK loaded for the twins, by directory (conftest's
# _sdk_loads_the_twins_tokenizer_once). Kept here, in a module imported once per process, so that
# a tokenizer loaded before a pytest session starts (mutmut's fork server) serves every session.
SDK_TOKENIZERS: dict[str, object] = {}


def preload_sdk_tokenizer(tokenizer: Any) -> None:
    """Load, once per process, the tokenizer directory the twins serve to the SDK."""
    import os

    import modelscope

    from searchr1.twin.served_tokenizer import served_tokenizer_dir

    served = os.path.realpath(served_tokenizer_dir(tokenizer))
    if served not in SDK_TOKENIZERS:
        SDK_TOKENIZERS[served] = modelscope.AutoTokenizer.from_pretrained(served)


def hand_loaded_tokenizers_to_modelscope() -> Callable[[], None]:
    """pytrio loads the model's tokenizer with ModelScope in the first forward_backward of every
    training client (about two seconds each). The twin serves it from a local directory: from now
    on, this process loads each such directory once and hands every later caller that same
    object (:data:`SDK_TOKENIZERS`). Returns what puts ModelScope's own loader back."""
    import os

    import modelscope

    original = modelscope.AutoTokenizer
    loaded = SDK_TOKENIZERS

    class OncePerDirectory:
        @staticmethod
        def from_pretrained(name, *args, **kwargs):
            key = os.path.realpath(str(name))
            if not os.path.isdir(key):
                return original.from_pretrained(name, *args, **kwargs)
            if key not in loaded:
                loaded[key] = original.from_pretrained(name, *args, **kwargs)
            return loaded[key]

    modelscope.AutoTokenizer = OncePerDirectory
    return lambda: setattr(modelscope, "AutoTokenizer", original)


@contextmanager
def running_twin(home: Path, tokenizer: Any, **options: Any) -> Iterator[tuple[Twin, Any]]:
    """A twin and a real ServiceClient on it with millisecond retries."""
    with start_twin(home=home, tokenizer=tokenizer, **{"policy": "toy", **options}) as twin:
        yield twin, twin.service_client(sdk_options=FAST_RETRIES)


def sample_once(sampler: Any, prompt: list[int], *, max_tokens: int = 6, seed: int = 1,
                num_samples: int = 1, stop: Any = None) -> Any:
    params = SamplingParams(max_tokens=max_tokens, seed=seed, stop=stop)
    return sampler.sample(ModelInput.from_ints(prompt), num_samples=num_samples, sampling_params=params).result()


def datum_from(prompt: list[int], tokens: list[int], logprobs: list[float], *, advantage: float = 1.0) -> Datum:
    """The trainer's layout: one shifted datum, advantage and sampler logprobs on the sampled tokens."""
    sequence = list(prompt) + list(tokens)
    is_action = np.arange(1, len(sequence)) >= len(prompt)
    old = np.zeros(len(sequence) - 1, dtype=np.float32)
    old[len(prompt) - 1:] = np.asarray(logprobs, dtype=np.float32)
    return Datum(
        model_input=ModelInput.from_ints(sequence[:-1]),
        loss_fn_inputs={
            "target_tokens": TensorData.from_numpy(np.asarray(sequence[1:], dtype=np.int64)),
            "logprobs": TensorData.from_numpy(old),
            "advantages": TensorData.from_numpy(np.where(is_action, advantage, 0.0).astype(np.float32)),
        },
    )


def sampled_datum(sampler: Any, prompt: list[int], *, advantage: float = 1.0, **kwargs: Any) -> Datum:
    sequence = sample_once(sampler, prompt, **kwargs).sequences[0]
    return datum_from(prompt, list(sequence.tokens), list(sequence.logprobs), advantage=advantage)


class RawTrainingRun:
    """Speaks the actor protocol directly, with pytrio's own protocol builders, for the strict
    rules the real client never breaks (event order, totals, token range)."""

    def __init__(self, twin: Twin) -> None:
        import httpx

        self.twin = twin
        headers = {"X-API-Key": twin.api_key}
        base = f"{twin.base_url}/api/openapi/v1"
        session = httpx.post(f"{base}/service-sessions", json={"sdk_version": "0.2.9"}, headers=headers).json()
        run = httpx.post(
            f"{base}/service-sessions/{session['service_session_cuid']}/training-runs", headers=headers,
            json={"base_model": MODEL, "lora_rank": 8, "train_mlp": True, "train_attn": True, "train_unembed": True},
        ).json()
        self.cuid = run["training_run_cuid"]
        self.actor = run["actor"]["endpoint"]
        self.headers = {"Authorization": f"Bearer {run['actor_jwt']['token']}"}

    def send(self, event_type: Any, payload: Any, *, index: int, step: int = 0) -> dict[str, Any]:
        """Submit one event and wait for its final state."""
        import httpx
        import msgpack
        from pytrio.protocol.actor.events.codec import payload_to_wire_value
        from pytrio.protocol.actor.events.event import EventMetadata, build_event_envelope, pack_event_envelope

        metadata = EventMetadata(index=index, step=step, timestamp=0, sdk="pytrio", sdk_version="0.2.9",
                                 run_id=self.cuid)
        envelope = build_event_envelope(event_type, payload_to_wire_value(event_type, payload), metadata)
        submitted = httpx.post(f"{self.actor}/v1/events", content=pack_event_envelope(envelope),
                               headers={**self.headers, "Content-Type": "application/msgpack"})
        assert submitted.status_code == 200, submitted.text
        answer = httpx.get(f"{self.actor}/v1/events/{envelope.event_id}",
                           headers={**self.headers, "Prefer": "wait=10"}, timeout=15)
        return msgpack.unpackb(answer.content, raw=False)

    def init(self, *, index: int = 1) -> dict[str, Any]:
        from pytrio.client.builders.training import build_trainer_init_payload
        from pytrio.protocol.actor.events.event import EventType
        from pytrio.protocol.actor.events.trainer.lora import FreshLoraSource, LoraRunSpec

        lora = LoraRunSpec(MODEL, 8, None, True, True, True, FreshLoraSource())
        return self.send(EventType.TRAINER_INIT_RUN, build_trainer_init_payload(lora, source=FreshLoraSource()),
                         index=index)

    def forward_backward(self, data: list[Datum], *, index: int, step: int = 0, vocab_size: int = 248_077,
                         totals: Any = None) -> dict[str, Any]:
        """One chunk holding ``data`` (with the call's real totals unless ``totals`` is given)."""
        from dataclasses import replace

        from pytrio.client.builders.training import build_trainer_forward_payload
        from pytrio.client.training_batch import plan_training_batch
        from pytrio.model.limits import TrainingLimits
        from pytrio.protocol.actor.events.event import EventType

        plan = plan_training_batch(data, loss_fn="importance_sampling", auto_shift=False,
                                   limits=TrainingLimits(None, None, None), tokenizer_vocab_size=vocab_size)
        sent = plan.totals if totals is None else replace(plan.totals, **totals)
        payload = build_trainer_forward_payload(plan.chunks[0], None, False, sent)
        return self.send(EventType.TRAINER_FORWARD_BACKWARD, payload, index=index, step=step)

    def optim_step(self, *, index: int, step: int) -> dict[str, Any]:
        from pytrio.client.builders.training import build_trainer_optimize_payload
        from pytrio.protocol.actor.events.event import EventType
        from pytrio.types import AdamParams

        return self.send(EventType.TRAINER_OPTIMIZE_STEP, build_trainer_optimize_payload(AdamParams()),
                         index=index, step=step)


def train_steps(trainer: Any, tokenizer: Any, steps: int, *, start: int = 0, lr: float = 0.05) -> None:
    """``steps`` on-policy updates; the data of update ``k`` is sampled with seed ``k``."""
    from pytrio.types import AdamParams

    prompt = tokenizer.encode(PROMPT)
    for k in range(start, start + steps):
        sampler = trainer.save_weights_and_get_sampling_client()
        good = sampled_datum(sampler, prompt, seed=2 * k, advantage=1.0 + k)
        bad = sampled_datum(sampler, prompt, seed=2 * k + 1, advantage=-0.5)
        trainer.forward_backward([good, bad], loss_fn="importance_sampling").result()
        trainer.optim_step(AdamParams(learning_rate=lr, weight_decay=0.01)).result()


# Metrics that describe wall-clock behaviour rather than what was trained: timings, and the
# search service's own counters (how many requests single-flight merged, how many reached the
# service, their tokens and latency depend on which concurrent trajectory asked first).
TIMING_DEPENDENT_PREFIXES = ("time/", "search/")


def without_timing_metrics(record: dict) -> dict:
    """A metrics line (or summary metrics) without wall-clock observations; two runs with the
    same seed agree on everything else."""
    from searchr1.run.usage import depends_on_timing

    return {k: v for k, v in record.items() if not k.startswith(TIMING_DEPENDENT_PREFIXES) and not depends_on_timing(k)}


# A `python -c` script: run the CLI (argv[2:]) and SIGKILL the process right after the metrics
# line of step argv[1] is on disk (a crash between two steps, as hard as crashes get).
KILL_AFTER_STEP = """
import os, signal, sys
from searchr1.run import directory as run_dir
kill_after = int(sys.argv[1])
original = run_dir.RunDir.append_metrics
def append_then_maybe_die(self, record):
    original(self, record)
    if record["step"] == kill_after:
        os.kill(os.getpid(), signal.SIGKILL)
run_dir.RunDir.append_metrics = append_then_maybe_die
from searchr1.cli import main
main(sys.argv[2:])
"""


def killed_resumed_and_straight(args: list[str], tmp_path: Path) -> tuple[Path, list[dict], list[dict]]:
    """``train`` with ``args`` (ending in ``--run-dir``, saving every 2 steps) killed right after
    step 3 and resumed from its checkpoint at step 2, then the same run uninterrupted: the killed
    run's directory and both runs' metrics lines without wall-clock keys."""
    from click.testing import CliRunner

    from searchr1.cli import main
    from searchr1.run.directory import RunDir
    from warm_python import run_python

    killed, straight = tmp_path / "killed", tmp_path / "straight"
    process = run_python(["-c", KILL_AFTER_STEP, "3", *args, str(killed)], cwd=Path(__file__).resolve().parents[1],
                         timeout=300)
    assert process.returncode == -9, process.stderr[-2000:]
    assert RunDir(killed).resume_point().step == 2
    for invocation in (["train", "--offline", "--resume", str(killed)], [*args, str(straight)]):
        result = CliRunner().invoke(main, invocation)
        assert result.exit_code == 0, result.output
    return (killed, [without_timing_metrics(m) for m in RunDir(killed).metrics()],
            [without_timing_metrics(m) for m in RunDir(straight).metrics()])
