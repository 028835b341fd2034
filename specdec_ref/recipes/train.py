"""Rebuild the course model zoo from scratch: corpus, two tokenizers, target, drafts.

    python -m specdec_ref.recipes.train --out zoo --budget full

Stages, in order (``--resume`` skips those whose output already exists in OUT):
  1. corpus     cleaned stdlib sources, file-level held-out split (specdec_ref.zoo.corpus)
  2. tokenizers A (byte-level BPE, GPT-2 style pre-tokenizer) and B (different size,
                pre-tokenizer and merges) for the cross-tokenizer draft
  3. target     Llama trained from scratch on the corpus (cross-entropy)
  4. samples    the target's own continuations of corpus snippets (greedy and sampled)
  5. draft      same tokenizer, distilled with KL to the target's logits on corpus
                text and on the target's samples
  6. draft-xtok tokenizer B, trained on corpus text and on the target's samples
                decoded to text and re-encoded, so it imitates the target at text level
  7. greedy     the target's greedy continuations of library function openings, with
                its top-32 log-probabilities at every generated position
  8. tune       both drafts fine-tuned on those continuations (draft: cross-entropy to
                the stored distributions; draft-xtok: the text re-encoded with B)
  9. chat       tokenizer-only variants that differ from A only in chat_template
 10. manifest   sha256 of every shipped file, sizes and training figures

Budgets are wall-clock minutes (``full``) or step counts (``tiny``, for the test);
the learning-rate schedule follows whichever one is set, so a timed run always
ends its cosine decay exactly at its deadline.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from tqdm.auto import tqdm
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from specdec_ref.paths import sha256_file
from specdec_ref.zoo.corpus import EOS, Corpus, build_corpus, code_prompts

PAD = "<|pad|>"
SPECIAL_TOKENS = [EOS, PAD, "<|im_start|>", "<|im_end|>"]

# Two templates over the same vocabulary: target-chat uses ChatML-style markers,
# draft-chat a Markdown-style one. Only the template differs, nothing else.
CHAT_TEMPLATES = {
    "target-chat": (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    ),
    "draft-chat": (
        "{% for m in messages %}### {{ m['role'] | capitalize }}:\n{{ m['content'] }}\n\n"
        "{% endfor %}{% if add_generation_prompt %}### Assistant:\n{% endif %}"
    ),
}


@dataclass(frozen=True)
class Arch:
    hidden: int
    layers: int
    heads: int
    intermediate: int


@dataclass(frozen=True)
class Budget:
    max_files: int | None  # None: the whole stdlib
    vocab_a: int
    vocab_b: int
    target: Arch
    draft: Arch
    xtok: Arch
    seq_len: int
    batch: int
    # Each stage stops at its step count, or at its minutes when steps is None.
    target_steps: int | None
    target_minutes: float
    sample_batches: int | None
    sample_minutes: float
    draft_steps: int | None
    draft_minutes: float
    xtok_steps: int | None
    xtok_minutes: float
    sample_prompt_len: int = 64
    sample_new_tokens: int = 128
    # The drafts' last stage: fine-tuning on the target's greedy continuations.
    greedy_batches: int | None = None
    greedy_minutes: float = 0
    tune_steps: int | None = None
    tune_minutes: float = 0


BUDGETS = {
    "tiny": Budget(
        max_files=25, vocab_a=400, vocab_b=330,
        target=Arch(64, 2, 2, 128), draft=Arch(64, 1, 2, 96), xtok=Arch(64, 1, 2, 96),
        seq_len=32, batch=4, target_steps=4, target_minutes=0, sample_batches=2,
        sample_minutes=0, draft_steps=3, draft_minutes=0, xtok_steps=3, xtok_minutes=0,
        sample_prompt_len=16, sample_new_tokens=16, greedy_batches=2, tune_steps=3,
    ),
    # A small vocabulary A keeps the draft's parameters (at most 1/15 of the target's)
    # in its transformer layers rather than its embedding table.
    "full": Budget(
        max_files=None, vocab_a=2048, vocab_b=3000,
        target=Arch(512, 7, 8, 1376), draft=Arch(192, 2, 6, 640), xtok=Arch(192, 2, 6, 576),
        seq_len=256, batch=16, target_steps=None, target_minutes=55, sample_batches=None,
        sample_minutes=8, draft_steps=None, draft_minutes=25, xtok_steps=None, xtok_minutes=15,
        greedy_minutes=28, tune_minutes=8,
    ),
}


# ----------------------------------------------------------------------------- tokenizers

def _wrap(tok: Tokenizer) -> PreTrainedTokenizerFast:
    # clean_up_tokenization_spaces would rewrite " ." in decoded code; keep text exact.
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=EOS, eos_token=EOS, pad_token=PAD,
        model_max_length=1024, clean_up_tokenization_spaces=False,
    )


def train_tokenizer_a(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE with the GPT-2 pre-tokenizer (a space sticks to the next word)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return _wrap(tok)


def train_tokenizer_b(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE with a different split: whitespace runs (newline + indentation)
    are their own pieces, words carry no leading space, digits are single. Lossless
    like A, but its token boundaries and merges differ, as a real cross-family pair's do.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\s+|\w+|[^\w\s]+"), behavior="isolated"),
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return _wrap(tok)


def encode_docs(tok: PreTrainedTokenizerFast, docs: list[str]) -> np.ndarray:
    """One token stream: EOS before every document, as the models see it in training."""
    eos = tok.convert_tokens_to_ids(EOS)
    ids: list[int] = []
    for enc in tok(docs, add_special_tokens=False)["input_ids"]:
        ids.append(eos)
        ids.extend(enc)
    return np.asarray(ids, dtype=np.int32)


# ----------------------------------------------------------------------------- models

def make_model(arch: Arch, tok: PreTrainedTokenizerFast, seed: int) -> LlamaForCausalLM:
    """A Llama with tied embeddings; head_dim = hidden / heads (>= 32 for vLLM CPU)."""
    torch.manual_seed(seed)
    eos, pad = tok.convert_tokens_to_ids(EOS), tok.convert_tokens_to_ids(PAD)
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=arch.hidden, intermediate_size=arch.intermediate,
        num_hidden_layers=arch.layers, num_attention_heads=arch.heads,
        num_key_value_heads=arch.heads, max_position_embeddings=1024, rope_theta=10000.0,
        tie_word_embeddings=True, bos_token_id=eos, eos_token_id=eos, pad_token_id=pad,
    )
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(bos_token_id=eos, eos_token_id=eos,
                                               pad_token_id=pad, do_sample=False)
    return model


def n_params(model: torch.nn.Module) -> int:
    """Unique parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())


def save_model(model: LlamaForCausalLM, tok: PreTrainedTokenizerFast, path: Path) -> None:
    """bfloat16 safetensors (half the bytes; loaders upcast to float32 on CPU)."""
    path.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(path)
    model.float()
    tok.save_pretrained(path)


# ----------------------------------------------------------------------------- training

def windows(stream: np.ndarray, n: int, seq_len: int, gen: torch.Generator) -> torch.Tensor:
    """``n`` random windows of ``seq_len + 1`` tokens (inputs plus shifted labels)."""
    starts = torch.randint(0, len(stream) - seq_len - 1, (n,), generator=gen).tolist()
    return torch.from_numpy(np.stack([stream[s:s + seq_len + 1] for s in starts]).astype(np.int64))


def native_bf16() -> bool:
    """Whether this CPU computes bfloat16 matmuls natively (AVX512-BF16 or AMX)."""
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def training_autocast() -> torch.autocast:
    """bf16 autocast where the CPU has native bfloat16, float32 elsewhere. Without it, bf16
    matmuls are emulated: 6.5x slower than float32 on an AVX2-only Zen 3 (a 3200 x 256 x
    49,152 product, 6.5 s against 1.0 s), and a timed budget would train far less."""
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=native_bf16())


def fit(model: torch.nn.Module, batch_fn: Callable[[int], torch.Tensor],
        loss_fn: Callable[[torch.Tensor], torch.Tensor], *, steps: int | None, minutes: float,
        lr: float, desc: str, ckpt: Path, warmup: int = 100, ckpt_minutes: float = 5.0) -> dict:
    """AdamW + warmup + cosine decay to 10%, :func:`training_autocast`, checkpoints for resuming.

    ``batch_fn(step)`` must be deterministic in ``step`` so a resumed run sees the
    same data. Progress is step / steps, or elapsed / minutes for a timed run.
    """
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95))
    step, elapsed, tokens, losses = 0, 0.0, 0, []
    if ckpt.exists():
        state = torch.load(ckpt, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step, elapsed, tokens, losses = state["step"], state["elapsed"], state["tokens"], state["losses"]
        print(f"[{desc}] resumed at step {step}, {elapsed / 60:.1f} min")
    warmup = min(warmup, max(1, (steps or 10**9) // 10))

    def progress() -> float:
        return step / steps if steps else elapsed / (60 * minutes)

    model.train()
    bar = tqdm(total=steps or int(60 * minutes), desc=desc, unit="step" if steps else "s",
               initial=step if steps else int(elapsed))
    start, last_ckpt = time.time() - elapsed, time.time()
    while progress() < 1:
        cos = 0.5 * (1 + math.cos(math.pi * min(progress(), 1.0)))
        for g in opt.param_groups:
            g["lr"] = lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * cos)
        batch = batch_fn(step)
        with training_autocast():
            loss = loss_fn(batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        # a batch is a tensor of windows, or (tune stage) a list of greedy-continuation records
        tokens += sum(len(r["ids"]) - 1 for r in batch) if isinstance(batch, list) else batch[:, :-1].numel()
        losses.append(loss.item())
        now = time.time()
        new_elapsed = now - start
        bar.update(1 if steps else int(new_elapsed) - int(elapsed))
        elapsed = new_elapsed
        bar.set_postfix(loss=f"{np.mean(losses[-20:]):.3f}", tok_s=f"{tokens / elapsed:.0f}")
        if now - last_ckpt > 60 * ckpt_minutes:
            ckpt.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                        "elapsed": elapsed, "tokens": tokens, "losses": losses}, ckpt)
            last_ckpt = now
    bar.close()
    model.eval()
    return {"steps": step, "tokens": tokens, "minutes": round(elapsed / 60, 2),
            "tokens_per_s": round(tokens / max(elapsed, 1e-9)),
            "final_loss": round(float(np.mean(losses[-20:])), 4),
            "precision": "bf16 autocast" if native_bf16() else "float32"}


def lm_loss(model: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """Next-token cross-entropy on a batch of windows."""
    def loss(batch: torch.Tensor) -> torch.Tensor:
        logits = model(batch[:, :-1]).logits
        return F.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten())
    return loss


def kl_loss(student: torch.nn.Module, teacher: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """Forward KL(teacher || student) per position: the student learns the teacher's
    whole next-token distribution, which is what makes its argmax agree (acceptance)."""
    def loss(batch: torch.Tensor) -> torch.Tensor:
        x = batch[:, :-1]
        with torch.no_grad():
            t_logp = F.log_softmax(teacher(x).logits.float(), dim=-1)
        s_logp = F.log_softmax(student(x).logits.float(), dim=-1)
        return F.kl_div(s_logp.flatten(0, 1), t_logp.flatten(0, 1), log_target=True,
                        reduction="batchmean")
    return loss


@torch.no_grad()
def perplexity(model: torch.nn.Module, stream: np.ndarray, seq_len: int, max_windows: int = 64) -> float:
    """Perplexity on consecutive non-overlapping windows of a held-out stream."""
    model.eval()
    n = min(max_windows, (len(stream) - 1) // seq_len)
    total = 0.0
    for i in range(n):
        chunk = torch.from_numpy(stream[i * seq_len:(i + 1) * seq_len + 1].astype(np.int64))[None]
        logits = model(chunk[:, :-1]).logits.float()
        total += F.cross_entropy(logits[0], chunk[0, 1:]).item()
    return math.exp(total / n)


def budgeted(batches: int | None, minutes: float, desc: str) -> Iterator[int]:
    """Batch indices 0, 1, ... until ``batches`` are done, or ``minutes`` have passed when
    ``batches`` is None; with a progress bar in batches or seconds."""
    start = time.time()
    bar = tqdm(total=batches or int(60 * minutes), desc=desc, unit="batch" if batches else "s")
    i = 0
    while i < batches if batches else time.time() - start < 60 * minutes:
        yield i
        i += 1
        bar.update(1 if batches else int(time.time() - start) - bar.n)
    bar.close()


@torch.no_grad()
def sample_target(target: LlamaForCausalLM, stream: np.ndarray, budget: Budget, seed: int) -> list[list[int]]:
    """The target's continuations of random corpus snippets: two greedy batches, then
    one at temperature 0.8. Greedy is what acceptance is measured on, sampling adds
    variety. Each sequence is prompt + continuation, cut after EOS."""
    eos = target.generation_config.eos_token_id
    gen = torch.Generator().manual_seed(seed)
    out: list[list[int]] = []
    for i in budgeted(budget.sample_batches, budget.sample_minutes, "samples"):
        prompts = windows(stream, budget.batch * 2, budget.sample_prompt_len - 1, gen)
        sampled = i % 3 == 2
        torch.manual_seed(seed + i)
        with training_autocast():
            seqs = target.generate(prompts, attention_mask=torch.ones_like(prompts),
                                   max_new_tokens=budget.sample_new_tokens, do_sample=sampled,
                                   temperature=0.8 if sampled else None, top_k=0 if sampled else None)
        for row in seqs.tolist():
            cut = row.index(eos, budget.sample_prompt_len) + 1 if eos in row[budget.sample_prompt_len:] else len(row)
            out.append(row[:cut])
    return out


@torch.no_grad()
def greedy_continuations(target: LlamaForCausalLM, tok: PreTrainedTokenizerFast, prompts: list[str],
                         budget: Budget, top_k: int = 32) -> list[dict]:
    """The target's greedy continuations of ``prompts``, with its top-``top_k``
    log-probabilities at every generated position.

    This is exactly what acceptance is measured on (greedy continuations of function
    openings), and the stored log-probs let the draft learn the target's distribution
    there without running the target again. Each record: ``ids`` (prompt + continuation,
    cut after EOS), ``prompt_len``, ``top_ids`` [n, top_k] and ``top_logp`` [n, top_k].
    """
    eos = target.generation_config.eos_token_id
    batch = budget.batch * 4
    out: list[dict] = []
    for i in budgeted(budget.greedy_batches, budget.greedy_minutes, "greedy"):
        chunk = prompts[(i * batch) % len(prompts):][:batch]
        enc = tok(chunk, add_special_tokens=False, return_tensors="pt", padding=True, padding_side="left")
        gen = target.generate(**enc, max_new_tokens=budget.sample_new_tokens, do_sample=False,
                              output_logits=True, return_dict_in_generate=True)
        logp = torch.stack(gen.logits, 1).float().log_softmax(-1)
        top = logp.topk(top_k, dim=-1)
        id_dtype = torch.int16 if logp.shape[-1] <= 2**15 else torch.int32  # halves the stored ids
        width = enc.input_ids.shape[1]
        for row, mask, top_i, top_v in zip(gen.sequences, enc.attention_mask, top.indices, top.values):
            new = row[width:].tolist()
            n = new.index(eos) + 1 if eos in new else len(new)
            prompt = row[:width][mask.bool()]
            out.append({"ids": torch.cat([prompt, row[width:width + n]]), "prompt_len": len(prompt),
                        "top_ids": top_i[:n].to(id_dtype), "top_logp": top_v[:n].half()})
    return out


def mixed_batches(a: np.ndarray, b: np.ndarray, budget: Budget, seed: int) -> Callable[[int], torch.Tensor]:
    """Half the rows from stream ``a`` (corpus), half from ``b`` (target samples)."""
    def batch(step: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
        half = budget.batch // 2
        return torch.cat([windows(a, budget.batch - half, budget.seq_len, gen),
                          windows(b, half, budget.seq_len, gen)])
    return batch


def padded(seqs: list[torch.Tensor], pad: int) -> torch.Tensor:
    """Right-pad 1-D id tensors into one [n, max_len] batch."""
    return torch.nn.utils.rnn.pad_sequence([q.long() for q in seqs], batch_first=True, padding_value=pad)


def greedy_batches(records: list[dict], budget: Budget, seed: int) -> Callable[[int], list[dict]]:
    """``budget.batch`` random greedy-continuation records per step (deterministic in step)."""
    def batch(step: int) -> list[dict]:
        gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
        return [records[i] for i in torch.randint(0, len(records), (budget.batch,), generator=gen).tolist()]
    return batch


def topk_distill_loss(student: torch.nn.Module, pad: int) -> Callable[[list[dict]], torch.Tensor]:
    """Cross-entropy to the target's stored top-k distribution (renormalised) at every
    generated position: forward KL up to a constant, with no target forward pass."""
    def loss(records: list[dict]) -> torch.Tensor:
        ids = padded([r["ids"][:-1] for r in records], pad)
        logp = F.log_softmax(student(ids).logits.float(), dim=-1)
        total, count = 0.0, 0
        for row, r in zip(logp, records):
            n = len(r["top_ids"])
            # position t predicts token t + 1: the first generated token comes from prompt_len - 1
            s_logp = row[r["prompt_len"] - 1:r["prompt_len"] - 1 + n].gather(-1, r["top_ids"].long())
            t_prob = F.softmax(r["top_logp"].float(), dim=-1)
            total = total - (t_prob * s_logp).sum()
            count += n
        return total / count
    return loss


def text_lm_loss(student: torch.nn.Module, texts: list[str], tok: PreTrainedTokenizerFast,
                 budget: Budget, seed: int) -> tuple[Callable[[int], torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]:
    """Batches and loss for next-token cross-entropy on whole ``texts`` encoded with ``tok``
    (padding ignored): how the cross-tokenizer draft learns the target's continuations."""
    pad = tok.convert_tokens_to_ids(PAD)
    encoded = [torch.tensor(e) for e in tok(texts, add_special_tokens=False)["input_ids"]]

    def batch(step: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
        return padded([encoded[i] for i in torch.randint(0, len(encoded), (budget.batch,), generator=gen).tolist()], pad)

    def loss(ids: torch.Tensor) -> torch.Tensor:
        logits = student(ids[:, :-1]).logits.float()
        return F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten(), ignore_index=pad)
    return batch, loss


# ----------------------------------------------------------------------------- manifest

def write_manifest(out: Path, info: dict) -> None:
    """Checksums of every file in the zoo's model and tokenizer folders."""
    files = {p.relative_to(out).as_posix(): sha256_file(p)
             for p in sorted(out.rglob("*")) if p.is_file()
             and p.name not in ("manifest.json", "MODELS.md", "LOG.md") and not p.relative_to(out).parts[0].startswith("_")}
    (out / "manifest.json").write_text(json.dumps({**info, "files": files}, indent=2) + "\n")


# ----------------------------------------------------------------------------- recipe

def build(out: Path, budget_name: str = "full", seed: int = 0, resume: bool = False,
          overrides: dict | None = None) -> dict:
    """Run every stage into ``out``; returns the manifest's ``info`` part."""
    budget = replace(BUDGETS[budget_name], **(overrides or {}))
    work = out / "_work"  # checkpoints and samples, not shipped
    if not resume and out.exists():
        shutil.rmtree(out)
    work.mkdir(parents=True, exist_ok=True)
    info_path = work / "info.json"
    info = json.loads(info_path.read_text()) if resume and info_path.exists() else {}
    info["budget"] = {"name": budget_name, "seed": seed, **asdict(budget)}

    def done(name: str, record: dict) -> None:
        info[name] = record
        info_path.write_text(json.dumps(info, indent=2))

    corpus: Corpus = build_corpus(max_files=budget.max_files, seed=seed)
    train_docs = [corpus.train[k] for k in sorted(corpus.train)]
    held_docs = [corpus.heldout[k] for k in sorted(corpus.heldout)]
    if resume and info.get("corpus", {}).get("sha256") not in (None, corpus.sha256):
        raise RuntimeError("corpus changed since the run being resumed (different Python?)")

    # Tokenizers: saved inside the model folders; stage output is their tokenizer.json.
    if resume and (out / "target" / "tokenizer.json").exists():
        tok_a = PreTrainedTokenizerFast.from_pretrained(out / "target")
        tok_b = PreTrainedTokenizerFast.from_pretrained(out / "draft-xtok")
    else:
        tok_a = train_tokenizer_a(train_docs, budget.vocab_a)
        tok_b = train_tokenizer_b(train_docs, budget.vocab_b)
        tok_a.save_pretrained(out / "target")
        tok_b.save_pretrained(out / "draft-xtok")
    train_a, held_a = encode_docs(tok_a, train_docs), encode_docs(tok_a, held_docs)
    train_b, held_b = encode_docs(tok_b, train_docs), encode_docs(tok_b, held_docs)
    held_chars = sum(len(d) + len(EOS) for d in held_docs)
    done("corpus", {"sha256": corpus.sha256, "train_files": len(corpus.train),
                    "heldout_files": len(corpus.heldout),
                    "train_chars": sum(map(len, train_docs)), "heldout_chars": held_chars,
                    "train_tokens_a": len(train_a), "train_tokens_b": len(train_b)})

    def ppl_record(model, stream, held_tokens) -> dict:
        ppl = perplexity(model, stream, budget.seq_len)
        # bits per character makes tokenizers A and B comparable
        return {"params": n_params(model), "heldout_ppl": round(ppl, 3),
                "heldout_bits_per_char": round(math.log2(ppl) * held_tokens / held_chars, 4)}

    # Target
    if resume and (out / "target" / "model.safetensors").exists():
        target = LlamaForCausalLM.from_pretrained(out / "target", dtype=torch.float32)
    else:
        target = make_model(budget.target, tok_a, seed)
        batch = lambda step: windows(train_a, budget.batch, budget.seq_len,
                                     torch.Generator().manual_seed(seed * 1_000_003 + step))
        rec = fit(target, batch, lm_loss(target), steps=budget.target_steps,
                  minutes=budget.target_minutes, lr=1e-3, desc="target", ckpt=work / "target.pt")
        save_model(target, tok_a, out / "target")
        done("target", {**rec, **ppl_record(target, held_a, len(held_a))})
    target.eval()

    # Samples from the target
    samples_path = work / "samples.pt"
    if resume and samples_path.exists():
        samples = torch.load(samples_path)
    else:
        samples = sample_target(target, train_a, budget, seed)
        torch.save(samples, samples_path)
        done("samples", {"sequences": len(samples), "tokens": sum(map(len, samples))})
    eos_a = tok_a.convert_tokens_to_ids(EOS)
    samples_a = np.asarray([t for s in samples for t in [eos_a] + s], dtype=np.int32)

    # Same-tokenizer draft, distilled from the target's logits
    if not (resume and (out / "draft" / "model.safetensors").exists()):
        draft = make_model(budget.draft, tok_a, seed + 1)
        rec = fit(draft, mixed_batches(train_a, samples_a, budget, seed + 1), kl_loss(draft, target),
                  steps=budget.draft_steps, minutes=budget.draft_minutes, lr=2e-3,
                  desc="draft", ckpt=work / "draft.pt")
        save_model(draft, tok_a, out / "draft")
        done("draft", {**rec, **ppl_record(draft, held_a, len(held_a))})

    # Cross-tokenizer draft: the target's samples as text, re-encoded with tokenizer B
    if not (resume and (out / "draft-xtok" / "model.safetensors").exists()):
        texts = tok_a.batch_decode(samples, skip_special_tokens=True)
        samples_b = encode_docs(tok_b, texts)
        xtok = make_model(budget.xtok, tok_b, seed + 2)
        rec = fit(xtok, mixed_batches(train_b, samples_b, budget, seed + 2), lm_loss(xtok),
                  steps=budget.xtok_steps, minutes=budget.xtok_minutes, lr=2e-3,
                  desc="draft-xtok", ckpt=work / "draft-xtok.pt")
        save_model(xtok, tok_b, out / "draft-xtok")
        done("draft-xtok", {**rec, **ppl_record(xtok, held_b, len(held_b))})

    # Both drafts fine-tuned on the target's greedy continuations of library prompts:
    # the very distribution acceptance is measured on.
    tunes = [name for name in ("draft-tune", "xtok-tune") if not (resume and name in info)]
    greedy_path = work / "greedy.pt"
    if tunes and resume and greedy_path.exists():
        greedy = torch.load(greedy_path)
    elif tunes:
        prompts = code_prompts(corpus.train)
        random.Random(seed).shuffle(prompts)
        greedy = greedy_continuations(target, tok_a, prompts, budget)
        torch.save(greedy, greedy_path)
        done("greedy", {"sequences": len(greedy), "generated_tokens": sum(len(r["top_ids"]) for r in greedy)})
    if "draft-tune" in tunes:
        draft = LlamaForCausalLM.from_pretrained(out / "draft", dtype=torch.float32)
        rec = fit(draft, greedy_batches(greedy, budget, seed + 3), topk_distill_loss(draft, tok_a.pad_token_id),
                  steps=budget.tune_steps, minutes=budget.tune_minutes, lr=1e-3, desc="draft-tune",
                  ckpt=work / "draft-tune.pt", warmup=50)
        save_model(draft, tok_a, out / "draft")
        done("draft-tune", {**rec, **ppl_record(draft, held_a, len(held_a))})
    if "xtok-tune" in tunes:
        xtok = LlamaForCausalLM.from_pretrained(out / "draft-xtok", dtype=torch.float32)
        batch, loss = text_lm_loss(xtok, tok_a.batch_decode([r["ids"] for r in greedy], skip_special_tokens=True),
                                   tok_b, budget, seed + 4)
        rec = fit(xtok, batch, loss, steps=budget.tune_steps, minutes=budget.tune_minutes, lr=1e-3,
                  desc="xtok-tune", ckpt=work / "xtok-tune.pt", warmup=50)
        save_model(xtok, tok_b, out / "draft-xtok")
        done("xtok-tune", {**rec, **ppl_record(xtok, held_b, len(held_b))})

    # Chat variants: tokenizer A plus a chat template, pointing at existing weights
    for name, template in CHAT_TEMPLATES.items():
        tok = PreTrainedTokenizerFast.from_pretrained(out / "target")
        tok.chat_template = template
        tok.save_pretrained(out / "chat" / name)

    write_manifest(out, {k: v for k, v in info.items()})
    return info


STAGES_WITH_MINUTES = ("target", "sample", "draft", "xtok", "greedy", "tune")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="output folder (the zoo layout)")
    p.add_argument("--budget", choices=sorted(BUDGETS), default="full")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resume", action="store_true", help="keep finished stages and checkpoints in OUT")
    p.add_argument("--threads", type=int, default=2)
    for stage in STAGES_WITH_MINUTES:
        p.add_argument(f"--{stage}-minutes", type=float, help=f"wall-clock budget of the {stage} stage")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    overrides = {f"{s}_minutes": getattr(args, f"{s}_minutes") for s in STAGES_WITH_MINUTES
                 if getattr(args, f"{s}_minutes") is not None}
    info = build(args.out, args.budget, args.seed, args.resume, overrides)
    print(json.dumps({k: v for k, v in info.items() if k != "budget"}, indent=2))


if __name__ == "__main__":
    main()
