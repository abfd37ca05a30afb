"""A run's algorithm as its ``config.json`` records it (for ``show`` and ``eval``), and the
``--loss-fn-config`` flag's parser.

PyTRIO 0.2.9 accepts ``importance_sampling`` (the lab port's), ``ppo``, ``cispo`` and ``dro`` with
the same three inputs (target tokens, the sampler's logprobs, advantages) and sends
``loss_fn_config`` to the server unchanged. The keys a server reads are its own (Tinker
documents ``clip_low_threshold`` / ``clip_high_threshold`` for ``ppo`` and ``cispo`` and
``beta`` for ``dro``); this module only parses them, so a live run passes whatever the user
wrote and the offline twin is where unknown keys are refused (:mod:`searchr1.core.objective`
defines each loss and the keys it takes). The choices themselves are declared in the core
(:mod:`searchr1.core.objective`, :mod:`searchr1.core.kl`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from searchr1.core.settings import key_value
from searchr1.core.update import DEFAULT_LOSS_FN


def parse_loss_fn_config(items: Iterable[str]) -> dict[str, float | int | str | bool]:
    """``KEY=VALUE`` strings (``--loss-fn-config``, repeatable) as a dict. Values that read as
    numbers become ints or floats, ``true``/``false`` become booleans, anything else stays a
    string. A malformed item, an empty key, a repeated key or a non-finite number raises
    ValueError naming the item."""
    config: dict[str, float | int | str | bool] = {}
    for item in items:
        key, raw = key_value(item, "--loss-fn-config", "KEY=VALUE, e.g. clip_high_threshold=1.28")
        if key in config:
            raise ValueError(f"--loss-fn-config {key} is given twice")
        config[key] = _value(item, raw)
    return config


def _value(item: str, raw: str) -> float | int | str | bool:
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    try:
        return int(raw)
    except ValueError:
        pass
    try:
        number = float(raw)
    except ValueError:
        return raw
    if not math.isfinite(number):
        raise ValueError(f"--loss-fn-config {item!r}: {raw} is not a finite number")
    return number


# What a training run's config.json records about its algorithm, with the defaults a config
# written before these options existed implies (the lab port's recipe).
ALGORITHM_DEFAULTS: dict[str, object] = {
    "loss_fn": DEFAULT_LOSS_FN, "loss_fn_config": {}, "kl_coef": 0.0, "kl_estimator": "k3",
    "advantage_mode": "mean", "reward": "em", "dynamic_sampling": False,
}


def algorithm_of(config: Mapping[str, object]) -> dict[str, object]:
    """The algorithm fields of a training run's config (defaults where absent)."""
    return {key: config.get(key, default) for key, default in ALGORITHM_DEFAULTS.items()}


def describe_algorithm(algorithm: Mapping[str, object]) -> str:
    """``importance_sampling, advantage mean, reward em`` plus what else is on, in one line."""
    loss = str(algorithm.get("loss_fn", DEFAULT_LOSS_FN))
    settings = algorithm.get("loss_fn_config") or {}
    if isinstance(settings, dict) and settings:
        loss += " (" + ", ".join(f"{k}={v}" for k, v in sorted(settings.items())) + ")"
    parts = [loss, f"advantage {algorithm.get('advantage_mode', 'mean')}", f"reward {algorithm.get('reward', 'em')}"]
    kl_coef = algorithm.get("kl_coef") or 0.0
    if isinstance(kl_coef, int | float | str) and float(kl_coef):
        parts.append(f"KL {algorithm['kl_coef']} ({algorithm.get('kl_estimator', 'k3')})")
    if algorithm.get("dynamic_sampling"):
        parts.append("dynamic sampling")
    return ", ".join(parts)
