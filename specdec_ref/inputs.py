"""Checks and small helpers shared by every decoding loop.

Each check turns a bad request into a clear error *before* any model runs, so a
failed call never leaves a half-written cache or a half-streamed answer behind.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import torch


def context_length(model: torch.nn.Module) -> int | None:
    """The longest sequence the model's position embeddings cover, if the config says."""
    config = model.config
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def check_request(
    model: torch.nn.Module, input_ids: torch.Tensor, max_new_tokens: int, role: str = "model"
) -> torch.LongTensor:
    """Validate a single-prompt request; return the prompt as a 1-D tensor on the model's device."""
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0 (got {max_new_tokens!r})")
    if not isinstance(input_ids, torch.Tensor) or input_ids.dtype not in (torch.int64, torch.int32):
        raise TypeError("input_ids must be an integer torch.Tensor of token ids, shape [1, prompt_len]")
    if input_ids.dim() == 2 and input_ids.shape[0] != 1:
        raise ValueError(
            f"batch size {input_ids.shape[0]} is not supported: each prompt accepts a different number "
            "of draft tokens per iteration, so rows would need ragged caches and padding. "
            "Call once per prompt (the course's reference loop is batch-1, like transformers' assisted generation)."
        )
    if input_ids.dim() not in (1, 2):
        raise ValueError(f"input_ids must have shape [1, prompt_len] (got {tuple(input_ids.shape)})")
    prompt = input_ids.reshape(-1).to(device=model.device, dtype=torch.long)
    if prompt.numel() == 0:
        raise ValueError("the prompt is empty: give at least one token (for example the BOS token)")
    check_context(model, prompt.numel() + max_new_tokens, role)
    return prompt


def check_context(model: torch.nn.Module, total_length: int, role: str) -> None:
    """Refuse a request whose prompt plus new tokens is longer than the model's context."""
    limit = context_length(model)
    if limit is not None and total_length > limit:
        raise ValueError(
            f"prompt + max_new_tokens = {total_length} tokens exceeds the {role}'s context length of "
            f"{limit}: shorten the prompt or lower max_new_tokens"
        )


def eos_ids(model: torch.nn.Module, eos_token_id: int | Iterable[int] | None) -> torch.LongTensor:
    """EOS ids as a tensor; ``None`` means the model's generation config (as in ``generate``), ``[]`` none."""
    if eos_token_id is None:
        generation_config = getattr(model, "generation_config", None)
        eos_token_id = getattr(generation_config, "eos_token_id", None)
    if eos_token_id is None:
        eos_token_id = []
    elif isinstance(eos_token_id, int):
        eos_token_id = [eos_token_id]
    return torch.tensor(list(eos_token_id), dtype=torch.long, device=model.device)


def clock(device: torch.device) -> Callable[[], float]:
    """A wall clock that waits for queued GPU work first, so timings are attributed correctly."""
    if device.type == "cuda":
        def now() -> float:
            torch.cuda.synchronize(device)
            return time.perf_counter()
        return now
    return time.perf_counter
