"""Train ``zoo:smollm2-draft``: a small draft distilled from SmolLM2-135M-Instruct's own outputs.

    python -m specdec_ref.recipes.distill --out zoo --budget full

Stages (``--work`` keeps each stage's output, so a rerun resumes where it stopped):
  1. prompts    three kinds, each split by topic (or by file) into train and held-out:
                prose openings, chat requests (through SmolLM2's chat template) and
                Python function openings from the standard library
                (``specdec_ref.zoo.prompts``: the lessons measure on its held-out ones)
  2. teacher    SmolLM2's continuations of the training prompts (batched; bfloat16
                where the CPU has it natively, else float32):
                greedy first, then sampled at temperature 0.8 for variety, with its
                top-32 log-probabilities at every generated position
  3. draft      a narrow Llama with SmolLM2's tokenizer; its tied embedding starts as
                the top principal directions of SmolLM2's embedding table (the
                49,152-token table is most of the parameter budget), then trained with
                cross-entropy to the stored top-32 distributions
  4. save       bfloat16 safetensors, tokenizer and chat template in OUT/smollm2-draft,
                checksums added to OUT/manifest.json

Budgets are wall-clock minutes (``full``) or counts (``tiny``, for the test).
"""

from __future__ import annotations

import argparse
import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from specdec_ref.recipes.train import (Arch, budgeted, fit, native_bf16, padded, topk_distill_loss,
                                       training_autocast)
from specdec_ref.zoo import add_to_manifest
from specdec_ref.zoo.prompts import KINDS, interleave, prompts


@dataclass(frozen=True)
class Budget:
    draft: Arch
    code_prompts: int | None     # None: every training function opening
    new_tokens: int
    gen_batch: int
    greedy_batches: int | None   # teacher batches; None: until greedy_minutes
    greedy_minutes: float
    sampled_batches: int | None
    sampled_minutes: float
    steps: int | None            # draft training; None: until train_minutes
    train_minutes: float
    batch: int
    lr: float = 2e-3


BUDGETS = {
    "tiny": Budget(draft=Arch(32, 1, 2, 64), code_prompts=8, new_tokens=8, gen_batch=6,
                   greedy_batches=2, greedy_minutes=0, sampled_batches=1, sampled_minutes=0,
                   steps=3, train_minutes=0, batch=4),
    "full": Budget(draft=Arch(256, 4, 4, 768), code_prompts=1200, new_tokens=128, gen_batch=96,
                   greedy_batches=None, greedy_minutes=14, sampled_batches=None, sampled_minutes=18,
                   steps=None, train_minutes=46, batch=16),
}


@torch.no_grad()
def teacher_records(teacher: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, texts: list[str],
                    batch_index: int, budget: Budget, sampled: bool, top_k: int = 32) -> list[dict]:
    """One batch of the teacher's continuations with its top-``top_k`` log-probabilities
    per generated position (the records ``train.topk_distill_loss`` reads)."""
    chunk = [texts[(batch_index * budget.gen_batch + j) % len(texts)] for j in range(budget.gen_batch)]
    enc = tokenizer(chunk, add_special_tokens=False, return_tensors="pt", padding=True,
                    padding_side="left")
    torch.manual_seed(batch_index)
    gen = teacher.generate(**enc, max_new_tokens=budget.new_tokens, do_sample=sampled,
                           temperature=0.8 if sampled else None, top_k=0 if sampled else None,
                           top_p=1.0 if sampled else None, output_logits=True,
                           return_dict_in_generate=True, pad_token_id=tokenizer.pad_token_id)
    logp = torch.stack(gen.logits, 1).float().log_softmax(-1)
    top = logp.topk(top_k, dim=-1)
    eos = set(teacher.generation_config.eos_token_id if isinstance(teacher.generation_config.eos_token_id, list)
              else [teacher.generation_config.eos_token_id])
    width = enc.input_ids.shape[1]
    out = []
    for row, mask, top_i, top_v in zip(gen.sequences, enc.attention_mask, top.indices, top.values):
        new = row[width:].tolist()
        n = next((i + 1 for i, t in enumerate(new) if t in eos), len(new))
        prompt = row[:width][mask.bool()]
        out.append({"ids": torch.cat([prompt, row[width:width + n]]), "prompt_len": len(prompt),
                    "top_ids": top_i[:n].to(torch.int32), "top_logp": top_v[:n].half()})
    return out


def generate_stage(teacher: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, texts: list[str],
                   work: Path, name: str, batches: int | None, minutes: float, budget: Budget,
                   sampled: bool) -> list[dict]:
    """Teacher batches saved one file each under ``work/name``; a rerun skips those done."""
    folder = work / name
    folder.mkdir(parents=True, exist_ok=True)
    done = sorted(folder.glob("batch-*.pt"))
    records = [r for f in done for r in torch.load(f, weights_only=False)]
    if (folder / "complete").exists():
        return records
    with training_autocast():
        for i in budgeted(batches, minutes, name):
            index = len(done) + i
            batch = teacher_records(teacher, tokenizer, texts, index, budget, sampled)
            torch.save(batch, folder / f"batch-{index:05d}.pt")
            records += batch
    (folder / "complete").write_text("")
    return records


def make_draft(teacher: PreTrainedModel, arch: Arch, seed: int) -> LlamaForCausalLM:
    """A narrow Llama with the teacher's vocabulary and special tokens; its tied embedding
    starts as the teacher's embedding projected on its top ``arch.hidden`` principal
    directions, so token identities start where the teacher's are."""
    t = teacher.config
    config = LlamaConfig(vocab_size=t.vocab_size, hidden_size=arch.hidden, num_hidden_layers=arch.layers,
                         num_attention_heads=arch.heads, num_key_value_heads=arch.heads,
                         intermediate_size=arch.intermediate, max_position_embeddings=2048,
                         rope_theta=t.rope_parameters["rope_theta"] if getattr(t, "rope_parameters", None) else 10000.0,
                         tie_word_embeddings=True, bos_token_id=t.bos_token_id,
                         eos_token_id=t.eos_token_id, pad_token_id=t.pad_token_id)
    torch.manual_seed(seed)
    draft = LlamaForCausalLM(config)
    table = teacher.get_input_embeddings().weight.detach().float()
    centred = table - table.mean(0)
    _, _, v = torch.linalg.svd(centred[::4], full_matrices=False)  # a quarter of the rows is plenty
    projected = table @ v[:arch.hidden].T
    draft.get_input_embeddings().weight.data.copy_(projected * (0.02 / projected.std()))
    draft.generation_config.eos_token_id = teacher.generation_config.eos_token_id
    return draft


@torch.no_grad()
def greedy_agreement(draft: PreTrainedModel, teacher: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                     by_kind: dict[str, list[str]], new_tokens: int = 64) -> dict[str, float]:
    """Per kind, the fraction of positions of the teacher's greedy continuations where the
    draft's most likely next token is the teacher's: the per-token agreement that greedy
    acceptance rests on. Measured on training and on held-out prompts, a gap between the
    two says the draft has learned its training data rather than what the teacher knows."""
    result = {}
    for kind, texts in by_kind.items():
        enc = tokenizer(texts, add_special_tokens=False, return_tensors="pt", padding=True, padding_side="left")
        width = enc.input_ids.shape[1]
        out = teacher.generate(**enc, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                               pad_token_id=tokenizer.pad_token_id)
        mask = torch.cat([enc.attention_mask, torch.ones_like(out[:, width:])], 1)
        positions = (mask.cumsum(1) - 1).clamp(min=0)  # left padding: each row counts from its first token
        predicted = draft(out, attention_mask=mask, position_ids=positions).logits[:, width - 1:-1].argmax(-1)
        result[kind] = round((predicted == out[:, width:]).float().mean().item(), 3)
    return result


def n_params(model: torch.nn.Module) -> int:
    """Parameters, each tied tensor counted once."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def save_draft(draft: LlamaForCausalLM, tokenizer: PreTrainedTokenizerBase, out: Path, record: dict) -> None:
    """bfloat16 weights, tokenizer and chat template in ``out/smollm2-draft``; checksums and
    the training record merged into ``out/manifest.json`` (other entries untouched)."""
    folder = out / "smollm2-draft"
    draft.to(torch.bfloat16).save_pretrained(folder)
    draft.float()
    tokenizer.save_pretrained(folder)
    add_to_manifest(out, folder, "smollm2_draft", record)


def build(out: Path, work: Path, budget_name: str = "full", seed: int = 0, init: Path | None = None) -> dict:
    """Every stage; returns the training record written to the manifest. ``init`` (a saved
    draft folder, e.g. the shipped ``zoo/smollm2-draft``) continues training from those
    weights instead of a fresh draft."""
    from specdec_ref.zoo import load

    budget = BUDGETS[budget_name]
    teacher, tokenizer = load("zoo:smollm2", dtype=torch.bfloat16 if native_bf16() else torch.float32)
    train = prompts(tokenizer, "train", code_limit=budget.code_prompts, seed=seed)
    # interleave the kinds so every teacher batch mixes all three
    mixed = [text for _, text in interleave(train)]
    mixed += [p for k in KINDS for p in train[k][min(len(v) for v in train.values()):]]
    records = generate_stage(teacher, tokenizer, mixed, work, "greedy", budget.greedy_batches,
                             budget.greedy_minutes, budget, sampled=False)
    records += generate_stage(teacher, tokenizer, mixed[::-1], work, "sampled", budget.sampled_batches,
                              budget.sampled_minutes, budget, sampled=True)
    draft = make_draft(teacher, budget.draft, seed) if init is None else \
        LlamaForCausalLM.from_pretrained(init, dtype=torch.float32)
    del teacher
    pad = tokenizer.pad_token_id

    def batch(step: int) -> list[dict]:
        gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
        return [records[i] for i in torch.randint(0, len(records), (budget.batch,), generator=gen).tolist()]

    fit_record = fit(draft, batch, topk_distill_loss(draft, pad), steps=budget.steps,
                     minutes=budget.train_minutes, lr=budget.lr, desc="draft",
                     ckpt=work / "draft.ckpt", warmup=200)
    record = {"budget": budget_name, "seed": seed, "init": str(init) if init else "principal directions of "
              "SmolLM2's embedding", "arch": asdict(budget.draft),
              "parameters": n_params(draft), "teacher_sequences": len(records),
              "teacher_tokens": sum(len(r["top_ids"]) for r in records),
              "prompts": {k: len(v) for k, v in train.items()}, "train": fit_record}
    save_draft(draft, tokenizer, out, record)
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("zoo"), help="zoo folder to write smollm2-draft into")
    parser.add_argument("--work", type=Path, default=Path.home() / ".cache" / "specdec" / "distill",
                        help="where teacher outputs and checkpoints are kept (a rerun resumes)")
    parser.add_argument("--budget", choices=sorted(BUDGETS), default="full", help="time or step budget")
    parser.add_argument("--seed", type=int, default=0, help="seed for prompts, sampling and initialisation")
    parser.add_argument("--init", type=Path,
                        help="continue from this saved draft (e.g. zoo/smollm2-draft) instead of a fresh one")
    parser.add_argument("--agreement", metavar="DRAFT",
                        help="train nothing: print DRAFT's greedy agreement with SmolLM2 on training and "
                             "held-out prompts (8 of each kind, 64 new tokens)")
    args = parser.parse_args()
    if args.agreement is not None:
        from specdec_ref.zoo import load

        teacher, tokenizer = load("zoo:smollm2")
        draft, _ = load(args.agreement)
        for split in ("train", "heldout"):
            by_kind = {k: v[:8] for k, v in prompts(tokenizer, split, seed=args.seed).items()}
            print(split, json.dumps(greedy_agreement(draft, teacher, tokenizer, by_kind)), flush=True)
        return
    if args.init is not None:  # copied first: saving the result overwrites OUT/smollm2-draft
        shutil.copytree(args.init, args.work / "init", dirs_exist_ok=True)
        args.init = args.work / "init"
    print(json.dumps(build(args.out, args.work, args.budget, args.seed, args.init), indent=2))


if __name__ == "__main__":
    main()
