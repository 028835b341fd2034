"""Plain autoregressive decoding with a KV cache: one target forward per token.

This is the baseline every speedup in the course is measured against.
"""
from __future__ import annotations

from collections.abc import Iterable

import torch

from .inputs import check_request, clock, eos_ids
from .kv_cache import new_cache
from .sampling import Sampler
from .stats import GenerationOutput, GenerationStats


@torch.inference_mode()
def autoregressive_generate(
    model: torch.nn.Module,
    input_ids: torch.LongTensor,
    max_new_tokens: int = 64,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_token_id: int | Iterable[int] | None = None,
    generator: torch.Generator | None = None,
    streamer=None,
) -> GenerationOutput:
    """Generate up to ``max_new_tokens`` tokens for one prompt, one forward pass per token.

    Greedy (``do_sample=False``) output equals ``model.generate(do_sample=False)``.
    ``eos_token_id=None`` uses the model's generation config; pass ``[]`` to ignore EOS.
    ``streamer`` is any ``transformers`` streamer (``put`` / ``end``).
    """
    sampler = Sampler(do_sample, temperature, top_k, top_p, generator)
    prompt = check_request(model, input_ids, max_new_tokens)
    eos = eos_ids(model, eos_token_id)
    now = clock(model.device)
    stats = GenerationStats()
    start = now()

    tokens = torch.empty(prompt.numel() + max_new_tokens, dtype=torch.long, device=model.device)
    tokens[: prompt.numel()] = prompt
    length = prompt.numel()
    if streamer is not None:
        streamer.put(prompt[None].cpu())

    if max_new_tokens > 0:
        cache = new_cache(model)
        t0 = now()
        logits = model(prompt[None], past_key_values=cache, use_cache=True, logits_to_keep=1).logits[0, -1]
        stats.prefill_seconds = now() - t0
        stats.target_forward_calls = 1
    for step in range(max_new_tokens):
        token = sampler.choose(logits)
        tokens[length] = token
        length += 1
        if streamer is not None:
            streamer.put(token.view(1).cpu())
        if step == max_new_tokens - 1 or torch.isin(token, eos).item():
            break
        t0 = now()
        logits = model(token.view(1, 1), past_key_values=cache, use_cache=True, logits_to_keep=1).logits[0, -1]
        stats.verify_seconds += now() - t0
        stats.target_forward_calls += 1

    stats.iterations = stats.target_forward_calls  # one target pass per new token
    stats.new_tokens = length - prompt.numel()
    stats.total_seconds = now() - start
    if streamer is not None:
        streamer.end()
    return GenerationOutput(sequences=tokens[None, :length].clone(), stats=stats)
