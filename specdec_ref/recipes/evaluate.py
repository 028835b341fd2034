"""Measure the zoo against its quality bars (figures for zoo/MODELS.md).

    python -m specdec_ref.recipes.evaluate [--zoo DIR] [--prompts 24] [--k 4] [--new-tokens 128]
                                           [--min-confidence 0.4]

On held-out prompts (``corpus.heldout_prompts``), greedy, it reports:
- ``draft`` vs ``target``: acceptance rate (accepted / drafted), acceptance probability
  (accepted / judged drafts, the a of the i.i.d. model) and tokens per target pass of
  ``specdec_ref.speculative_generate`` with k draft tokens.
- ``draft-xtok`` vs ``target`` through the cross-tokenizer path (Universal Assisted
  Generation, ``specdec_ref.uag``): the same figures, counted in target tokens.
- the same with dynamic draft length (``*_dynamic``): k is the most drafts per
  iteration, and a draft stops after a token it gave less than ``--min-confidence``.
- that every speculative output equals the target's own greedy output.
- whether the target's greedy outputs end in a loop, and its period in characters
  (``specdec_ref.stats.loop_period``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from transformers import PreTrainedModel

from specdec_ref import speculative_generate
from specdec_ref.stats import GenerationStats, loop_period
from specdec_ref.zoo import ZOO_DIR, load
from specdec_ref.zoo.corpus import heldout_prompts


@torch.no_grad()
def greedy(model: PreTrainedModel, ids: list[int], n: int) -> list[int]:
    """``n`` greedy tokens after ``ids`` (fewer if EOS comes first, EOS included)."""
    x = torch.tensor([ids])
    out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False)
    return out[0, len(ids):].tolist()


def evaluate(zoo_dir: Path = ZOO_DIR, n_prompts: int = 24, k: int = 4, new_tokens: int = 128,
             min_confidence: float = 0.4) -> dict:
    """All figures of the model card as a dict (acceptance, loops, samples)."""
    target, tok = load("zoo:target", zoo_dir=zoo_dir)
    draft, _ = load("zoo:draft", zoo_dir=zoo_dir)
    xtok, tok_x = load("zoo:draft-xtok", zoo_dir=zoo_dir)
    drafters = {"draft": {"draft": draft},
                "xtok": {"draft": xtok, "target_tokenizer": tok, "draft_tokenizer": tok_x}}
    drafters |= {f"{name}_dynamic": {**kwargs, "min_draft_confidence": min_confidence}
                 for name, kwargs in drafters.items()}
    runs: dict[str, list] = {name: [] for name in drafters}  # per prompt: (stats, identical)
    looping, samples = [], []
    for text in heldout_prompts(n_prompts):
        prompt = tok(text, add_special_tokens=False)["input_ids"]
        out = greedy(target, prompt, new_tokens)
        for name, kwargs in drafters.items():
            with torch.no_grad():
                spec = speculative_generate(target, input_ids=torch.tensor([prompt]), max_new_tokens=new_tokens,
                                            num_draft_tokens=k, **kwargs)
            runs[name].append((spec.stats, spec.sequences[0, len(prompt):].tolist() == out))
        continuation = tok.decode(out)
        looping.append(loop_period(continuation))
        samples.append({"prompt": text, "target": continuation, "loop_period_chars": looping[-1]})

    figures = {"prompts": n_prompts, "k": k, "new_tokens": new_tokens, "min_confidence": min_confidence}
    for name, results in runs.items():
        stats = [s for s, _ in results]
        total = GenerationStats.combined(stats)
        figures[f"{name}_acceptance"] = round(total.acceptance_rate, 4)
        figures[f"{name}_acceptance_probability"] = round(total.acceptance_probability, 4)  # the i.i.d. model's a
        # Loops are easy to predict: the figure without them says how the draft does on fresh text.
        fresh = GenerationStats.combined(s for s, period in zip(stats, looping) if period is None)
        figures[f"{name}_acceptance_without_looping_outputs"] = round(fresh.acceptance_rate, 4)
        figures[f"{name}_tokens_per_target_pass"] = round(total.tokens_per_target_pass, 3)
        figures[f"{name}_drafted_per_iteration"] = round(total.drafted_per_iteration, 3)
        figures[f"{name}_acceptance_per_prompt"] = [round(s.acceptance_rate, 3) for s in stats]
        figures[f"{name}_equals_target_greedy"] = f"{sum(same for _, same in results)}/{n_prompts}"
    return {**figures, "target_outputs_looping": sum(p is not None for p in looping),
            "loop_periods_chars": sorted(p for p in looping if p is not None), "samples": samples}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--zoo", type=Path, default=ZOO_DIR)
    p.add_argument("--prompts", type=int, default=24)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--min-confidence", type=float, default=0.4, help="for the *_dynamic figures")
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args()
    res = evaluate(args.zoo, args.prompts, args.k, args.new_tokens, args.min_confidence)
    if args.json:
        args.json.write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps({k: v for k, v in res.items() if k != "samples"}, indent=2))
    for s in res["samples"][:3]:
        print("-" * 60 + "\n" + s["prompt"] + "\u2588" + s["target"])


if __name__ == "__main__":
    main()
