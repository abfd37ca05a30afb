"""Which policy loss a run asks the service for, and the ``--loss-fn-config`` it sends.

PyTRIO 0.2.9 accepts ``importance_sampling`` (the seed's), ``ppo``, ``cispo`` and ``dro`` with
the same three inputs (target tokens, the sampler's logprobs, advantages) and sends
``loss_fn_config`` to the server unchanged. The keys a server reads are its own (Tinker
documents ``clip_low_threshold`` / ``clip_high_threshold`` for ``ppo`` and ``cispo`` and
``beta`` for ``dro``); this module only parses them, so a live run passes whatever the user
wrote and the offline twin (:mod:`searchr1.twin.losses`) is where unknown keys are refused.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

POLICY_LOSS_FNS = ("importance_sampling", "ppo", "cispo", "dro")
DEFAULT_LOSS_FN = "importance_sampling"
KL_ESTIMATORS = ("k1", "k3")  # searchr1.kl


def parse_loss_fn_config(items: Iterable[str]) -> dict[str, float | int | str | bool]:
    """``KEY=VALUE`` strings (``--loss-fn-config``, repeatable) as a dict. Values that read as
    numbers become ints or floats, ``true``/``false`` become booleans, anything else stays a
    string. A malformed item, an empty key, a repeated key or a non-finite number raises
    ValueError naming the item."""
    config: dict[str, float | int | str | bool] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key, raw = key.strip(), raw.strip()
        if not sep or not key or not raw:
            raise ValueError(f"--loss-fn-config {item!r}: expected KEY=VALUE, e.g. clip_high_threshold=1.28")
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
