"""``python cli.py twin serve`` starts a twin that another program reaches with only an address
and a key, and stops on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from pytrio.types import AdamParams
from twin_support import MODEL, PROMPT, sampled_datum

from searchr1.twin.client import FAST_RETRIES, TWIN_API_KEY, connect

ROOT = Path(__file__).resolve().parents[2]


def test_twin_serve_answers_a_real_client_and_stops_on_sigterm(tmp_path, tokenizer):
    server = subprocess.Popen(
        [sys.executable, "cli.py", "twin", "serve", "--home", str(tmp_path / "home"), "--policy", "toy"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        first = server.stdout.readline().strip()
        assert first.startswith("PYTRIO_BASE_URL=http://127.0.0.1:"), first + server.stderr.read()
        service = connect(first.split("=", 1)[1], home=tmp_path / "sdk", api_key=TWIN_API_KEY,
                          sdk_options=FAST_RETRIES)
        trainer = service.create_lora_training_client(MODEL, rank=8)
        sampler = trainer.save_weights_and_get_sampling_client()
        trainer.forward_backward([sampled_datum(sampler, tokenizer.encode(PROMPT))], loss_fn="importance_sampling").result()
        assert trainer.optim_step(AdamParams(learning_rate=0.01)).result().metrics["grad_norm"] > 0
        saved = trainer.save_state("served").result()
        del trainer, sampler, service
    finally:
        server.send_signal(signal.SIGTERM)
        _, err = server.communicate(timeout=30)
    assert server.returncode == 0, err
    assert "protocol violation" not in err
    assert (tmp_path / "home" / "runs" / saved.path.split("/")[3] / "state" / "served.npz").is_file()
