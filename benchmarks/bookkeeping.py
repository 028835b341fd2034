"""How much of a speculative run is bookkeeping (acceptance, rollback, streaming), not model time?

    python benchmarks/bookkeeping.py

Random-init Llama models, a ~29M target and a ~2M draft (the acceptance rate is near 0,
which maximises the number of iterations and so the bookkeeping share).
"""
import statistics

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specdec_ref import speculative_generate


def llama(hidden: int, layers: int, heads: int, seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=8192, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=1024)
    return LlamaForCausalLM(config).eval()


def main() -> None:
    target, draft = llama(512, 6, 8, seed=0), llama(96, 2, 3, seed=1)
    for name, model in (("target", target), ("draft", draft)):
        print(f"{name}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters")
    prompt = torch.randint(0, 8192, (1, 64), generator=torch.Generator().manual_seed(0))
    shares = []
    for _ in range(5):
        stats = speculative_generate(target, draft, prompt, max_new_tokens=128, num_draft_tokens=4,
                                     eos_token_id=[]).stats
        shares.append(stats.bookkeeping_seconds / stats.total_seconds)
    print(stats)
    print(f"bookkeeping share of total time: median {statistics.median(shares):.2%} over 5 runs "
          f"(min {min(shares):.2%}, max {max(shares):.2%})")


if __name__ == "__main__":
    main()
