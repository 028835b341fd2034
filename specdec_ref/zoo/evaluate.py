"""Measure the zoo against its quality bars (figures for zoo/MODELS.md).

    python -m specdec_ref.zoo.evaluate [--zoo DIR] [--prompts 24] [--k 4] [--new-tokens 128]

On held-out prompts (``corpus.heldout_prompts``), greedy, it reports:
- ``draft`` vs ``target`` acceptance rate and tokens per target pass of
  ``specdec_ref.speculative_generate`` with k draft tokens, whose output is also
  checked to be identical to the target's own greedy output.
- ``draft-xtok`` vs ``target`` at text level: greedy speculative decoding emits the
  target's greedy tokens, so each iteration is replayed against that sequence: the
  draft's k tokens are decoded to text, the target tokens lying wholly inside the
  text both agree on count as accepted (out of the draft text's length in target
  tokens), then the target's own token is taken.
- whether the target's greedy outputs loop (a short period repeating to the end).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from specdec_ref import speculative_generate
from specdec_ref.zoo import ZOO_DIR, load
from specdec_ref.zoo.corpus import heldout_prompts


@torch.no_grad()
def greedy(model: PreTrainedModel, ids: list[int], n: int) -> list[int]:
    """``n`` greedy tokens after ``ids`` (fewer if EOS comes first, EOS included)."""
    x = torch.tensor([ids])
    out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False)
    return out[0, len(ids):].tolist()


def text_acceptance(xtok: PreTrainedModel, tok_x: PreTrainedTokenizerBase, tok_t: PreTrainedTokenizerBase,
                    prompt: list[int], target_out: list[int], k: int) -> tuple[int, int, int, int]:
    """(accepted, drafted, agreeing chars, drafted chars) of a cross-tokenizer draft,
    counted in target tokens; the draft sees the target's text re-encoded with its own tokenizer."""
    pos = accepted = drafted = chars_ok = chars = 0
    pieces = [tok_t.decode([t]) for t in target_out]
    while pos < len(target_out):
        context = tok_t.decode(prompt + target_out[:pos])
        proposal = greedy(xtok, tok_x(context, add_special_tokens=False)["input_ids"], k)
        text = tok_x.decode(proposal, skip_special_tokens=True)
        truth = "".join(pieces[pos:])
        common = 0
        while common < min(len(text), len(truth)) and text[common] == truth[common]:
            common += 1
        n_draft = min(len(tok_t(text, add_special_tokens=False)["input_ids"]), len(target_out) - pos)
        agree, covered = 0, 0
        while agree < n_draft and covered + len(pieces[pos + agree]) <= common:
            covered += len(pieces[pos + agree])
            agree += 1
        accepted, drafted = accepted + agree, drafted + n_draft
        chars_ok, chars = chars_ok + common, chars + len(text)
        pos += agree + 1
    return accepted, drafted, chars_ok, chars


def loops(tokens: list[int], tail: int = 48, max_period: int = 16) -> bool:
    """True when the last ``tail`` tokens repeat with a period of at most ``max_period``."""
    end = tokens[-tail:]
    return len(end) == tail and any(all(end[i] == end[i - p] for i in range(p, tail))
                                    for p in range(1, max_period + 1))


def evaluate(zoo_dir: Path = ZOO_DIR, n_prompts: int = 24, k: int = 4, new_tokens: int = 128) -> dict:
    """All figures of the model card as a dict (acceptance, loops, samples)."""
    target, tok = load("zoo:target", zoo_dir=zoo_dir)
    draft, _ = load("zoo:draft", zoo_dir=zoo_dir)
    xtok, tok_x = load("zoo:draft-xtok", zoo_dir=zoo_dir)
    prompts = heldout_prompts(n_prompts)
    totals = dict(accepted=0, drafted=0, new=0, passes=0, x_accepted=0, x_drafted=0, x_chars_ok=0, x_chars=0)
    per_prompt, looping, identical, samples = [], 0, 0, []
    for text in prompts:
        prompt = tok(text, add_special_tokens=False)["input_ids"]
        out = greedy(target, prompt, new_tokens)
        with torch.no_grad():
            spec = speculative_generate(target, draft, torch.tensor([prompt]), max_new_tokens=new_tokens,
                                        num_draft_tokens=k)
        st = spec.stats
        identical += spec.sequences[0, len(prompt):].tolist() == out
        xa, xd, xc, xn = text_acceptance(xtok, tok_x, tok, prompt, out, k)
        for key, v in zip(totals, (st.accepted_tokens, st.drafted_tokens, st.new_tokens, st.iterations,
                                   xa, xd, xc, xn)):
            totals[key] += v
        looping += loops(out)
        per_prompt.append(round(st.acceptance_rate, 3))
        samples.append({"prompt": text, "target": tok.decode(out)})
    return {
        "prompts": n_prompts, "k": k, "new_tokens": new_tokens,
        "draft_acceptance": round(totals["accepted"] / totals["drafted"], 4),
        "draft_tokens_per_target_pass": round(totals["new"] / totals["passes"], 3),
        "draft_acceptance_per_prompt": per_prompt,
        "speculative_equals_target_greedy": f"{identical}/{n_prompts}",
        "xtok_text_acceptance": round(totals["x_accepted"] / totals["x_drafted"], 4),
        "xtok_char_agreement": round(totals["x_chars_ok"] / totals["x_chars"], 4),
        "target_outputs_looping": looping,
        "samples": samples,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--zoo", type=Path, default=ZOO_DIR)
    p.add_argument("--prompts", type=int, default=24)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args()
    res = evaluate(args.zoo, args.prompts, args.k, args.new_tokens)
    if args.json:
        args.json.write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps({k: v for k, v in res.items() if k != "samples"}, indent=2))
    for s in res["samples"][:3]:
        print("-" * 60 + "\n" + s["prompt"] + "\u2588" + s["target"])


if __name__ == "__main__":
    main()
