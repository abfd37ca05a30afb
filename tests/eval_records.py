"""Hand-made eval records and the config of their files, shared by the evaluation tests."""

from __future__ import annotations

CONFIG = {"dataset_sha256": "d" * 64, "search_backend": "local", "search_topk": 3, "search_index": "shipped:c@1",
          "sampling": {"temperature": 0.0, "top_p": 1.0, "max_tokens": 500, "seed": 42},
          "rollout": {"group_size": 1, "max_search_calls": 4, "max_assistant_turns": 5,
                      "max_assistant_tokens": 500, "max_tool_response_tokens": 500, "max_trajectory_tokens": 8192}}


def record(source: str, index: int, em: bool, f1: float, cover: bool) -> dict:
    return {"type": "trajectory", "id": f"{source}-{index}", "question": f"q {source} {index}", "answers": ["x"],
            "data_source": source, "group_index": 0, "turns": [], "searches": [], "final_text": "Answer: x",
            "termination": "answer", "reward": 1.0 if em else 0.0, "exact_match": em, "f1": f1, "cover_em": cover,
            "valid_format": True, "search_calls": 0, "assistant_turns": 1, "env_error": False}
