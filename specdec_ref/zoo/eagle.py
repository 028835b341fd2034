"""Train ``zoo:smollm2-eagle``: an EAGLE-style draft head that reads SmolLM2's own features.

    python -m specdec_ref.zoo.eagle --out zoo --budget full
    python -m specdec_ref.zoo.eagle --only-generate 30     # stage 1 alone: 30 more minutes of data
    python -m specdec_ref.zoo.eagle --no-generate --init zoo/smollm2-eagle --train-minutes 90 --lr 3e-4
                                                           # the shipped head trained further
    python -m specdec_ref.zoo.eagle --evaluate zoo/smollm2-eagle   # held-out agreement of saved heads
    python -m specdec_ref.zoo.eagle --export-prompts prompts.json  # then, on a machine with a GPU:
    python -m specdec_ref.zoo.eagle --budget gpu --device cuda --prompts prompts.json --init zoo/smollm2-eagle --lr 3e-4

EAGLE (Li et al. 2024, arXiv:2401.15077) drafts from the target's last hidden state
instead of from tokens alone: one decoder layer takes (feature at t, embedding of token
t+1), predicts the feature at t+1, and the target's own LM head turns that into a draft
token. The head does not have to learn the language; it learns one more layer's worth
of the target. The architecture lives in ``specdec_ref.eagle``; this file builds it.

Stages (each resumes where it stopped):
  1. continuations  SmolLM2's greedy, then sampled (T = 0.8), continuations of the
                    training prompts of ``distill.prompts`` (prose, chat, code) and of
                    prompts only the head trains on (``training_prompts``), as token
                    ids, one file per batch in ``zoo/data/smollm2-continuations/``.
                    They are committed, so the data set grows across sessions: a rerun
                    generates only what its budget adds. The ``gpu`` budget adds sampled
                    continuations and chat turns on questions SmolLM2 wrote itself
                    (``instruct-gpu-*``), in files named after the budget's tag.
  2. features       one batched SmolLM2 prefill per chunk of sequences gives the feature
                    (last hidden state, after the final norm) at every position, and the
                    target's greedy token after it; kept in ``--work``, one file per
                    data file, never committed.
  3. head           trained with smooth-L1 on the next feature plus cross-entropy on the
                    target's next token, over two steps: the second step drafts from the
                    first step's predicted features, as drafting does (EAGLE-3's
                    "training-time test"). Held-out agreement is measured as it trains.
  4. save           bfloat16 weights (the head only: embedding and LM head are SmolLM2's),
                    the draft vocabulary, a vLLM-loadable copy, checksums in manifest.json.

Budgets are wall-clock minutes (``full``, ``gpu``) or counts (``tiny``, for the test). On a CPU
the recipe reads every stored file; the features of all of them (7.3M tokens) take about 80
minutes on a 2-core AVX-512 CPU with native bfloat16, seconds on a GPU.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import time
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence

from specdec_ref.eagle import EagleHead

DATA_DIR = Path(__file__).resolve().parents[2] / "zoo" / "data" / "smollm2-continuations"


# Topics only the head trains on. Its data are SmolLM2's continuations, and the prompts of
# distill.TOPICS had each been continued three or four times: new topics give more variety
# per generated token. None is a held-out topic of distill.TOPICS, or close to one.
EXTRA_TOPICS = [
    "origami", "the history of tennis", "octopuses", "beekeeping equipment", "the Ottoman Empire",
    "nuclear power", "the Great Depression", "rock climbing", "the violin", "wolves", "the history of medicine",
    "kites", "the Sahara", "jellyfish", "the Byzantine Empire", "the metric system", "opera", "lighthouses",
    "volunteer firefighters", "the Mongol Empire", "quantum computers", "the Aztecs", "river deltas",
    "the guitar", "ants", "the Cold War", "the Nile", "tornadoes", "fungi in soil", "the Incas",
    "recycled paper", "chocolate", "frogs", "caves", "the Great Barrier Reef", "the history of glass",
    "sailing ships", "the Maya civilization", "rice farming", "the saxophone", "foxes",
    "the history of football", "canals", "the Greek myths", "knitting", "the Panama Canal", "hydrogen fuel",
    "the history of the post office", "kangaroos", "the compass", "the Black Death", "wetlands", "bamboo",
    "the history of chess clocks", "microscopes", "the Spanish language", "apples", "the Andes",
    "textile mills", "sea turtles", "the history of soap operas", "vinegar", "marathons", "the Suez Canal",
    "windmills", "honey", "volcanic islands", "the drum", "parrots", "the history of ice cream", "the Alps",
    "video games", "ancient Greece", "the history of roads", "snakes", "the cello", "the Arctic fox",
    "the history of the lightbulb", "skiing", "ancient China", "plastic pollution", "the Eiffel Tower",
    "spiders", "the history of zoos", "the flute", "antibiotics", "the history of surfing",
    "the Hanseatic League", "potatoes", "yoga", "the Himalayas", "owls at night", "the history of typewriters",
    "the Danube", "the Crusades", "the human skeleton", "wine making", "the history of the piano's keyboard",
    "tigers", "the water supply of cities", "the Celts", "the history of bridges in Rome", "the harp", "moss",
    "sled dogs", "the Mississippi River", "coral bleaching", "gorillas", "the history of the calendar in Rome",
    "renewable energy storage", "the history of the umbrella", "dolphins", "the Reformation",
    "the history of board games", "the Wright brothers", "the history of lipstick", "ravens",
    "the history of the zipper", "the Great Lakes", "the history of tattoos", "rubber",
    "the history of the Olympic torch", "cotton", "the history of circuses", "seahorses",
    "the history of hospitals", "the human eye", "the history of cartoons", "camels", "the history of glasses",
    "the history of ballet", "bats", "the history of the toothbrush", "the Gobi Desert", "sugar cane",
    "the history of elevators", "hedgehogs", "the history of the sewing machine", "the Rhine",
    "the history of the microscope's lenses", "lemurs", "the history of fireworks in China", "the Caspian Sea",
    "the history of the stethoscope", "otters", "the history of weather forecasting",
]


@dataclass(frozen=True)
class Budget:
    gen_batch: int
    new_tokens: int
    greedy_batches: int | None     # None: every training prompt once, within greedy_minutes
    greedy_minutes: float
    sampled_batches: int | None    # None: until sampled_minutes
    sampled_minutes: float
    code_prompts: int | None
    extra_code_prompts: int        # Python function openings only the head trains on
    draft_vocab: int
    steps: int | None              # None: until train_minutes
    train_minutes: float
    batch_tokens: int
    lr: float = 3e-3
    ce_weight: float = 1.0
    instruct_minutes: float = 0    # chat turns whose question SmolLM2 wrote itself (instruct_batch)
    tag: str = ""                  # in the data file names: "sampled-gpu-00000.npz" for tag "gpu"
    prefill_tokens: int = 8192     # padded tokens per feature prefill
    eval_every_tokens: int = 400_000


BUDGETS = {
    "tiny": Budget(gen_batch=4, new_tokens=6, greedy_batches=1, greedy_minutes=0, sampled_batches=1,
                   sampled_minutes=0, code_prompts=8, extra_code_prompts=8, draft_vocab=512, steps=4, train_minutes=0,
                   batch_tokens=256, eval_every_tokens=1),
    "full": Budget(gen_batch=64, new_tokens=128, greedy_batches=None, greedy_minutes=25,
                   sampled_batches=None, sampled_minutes=15, code_prompts=1200, extra_code_prompts=3000,
                   draft_vocab=8192,
                   steps=None, train_minutes=35, batch_tokens=4096),
    # One GPU (`--device cuda`), sized for a short lease: on an H200, batches of 2,048 added
    # 4.1M tokens in 3.6 minutes (transformers' generate, about 19k tokens/s), the features of
    # all 7.3M took 27 s and training ran at up to 139k tokens/s. The greedy pass over the
    # prompts is the CPU one already stored.
    "gpu": Budget(gen_batch=2048, new_tokens=128, greedy_batches=0, greedy_minutes=0, sampled_batches=None,
                  sampled_minutes=2.0, code_prompts=1200, extra_code_prompts=3000, draft_vocab=8192, steps=None,
                  train_minutes=2.25, batch_tokens=16384, instruct_minutes=1.25, tag="gpu", prefill_tokens=65536,
                  eval_every_tokens=8_000_000),
}


def autocast(device: torch.device | str) -> torch.autocast:
    """bfloat16 autocast for training: the CPU's where it is native (``train.training_autocast``),
    always on a GPU."""
    from specdec_ref.zoo.train import training_autocast

    if torch.device(device).type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return training_autocast()


def training_prompts(tokenizer, code_limit: int | None, extra_code: int, seed: int = 0) -> list[str]:
    """The distilled draft's training prompts, then prompts only the head trains on (prose and
    chat on :data:`EXTRA_TOPICS`, ``extra_code`` more function openings); each part's kinds
    interleaved so every batch mixes them. Appended, so the files already generated keep
    their prompts."""
    from specdec_ref.zoo.distill import KINDS, interleave, prompts, topic_prompts

    def mixed(by_kind: dict[str, list[str]]) -> list[str]:
        shortest = min(len(v) for v in by_kind.values())
        return [text for _, text in interleave(by_kind)] + [p for k in KINDS for p in by_kind[k][shortest:]]

    train = prompts(tokenizer, "train", code_limit=code_limit, seed=seed)
    seen = set(train["code"])
    prose, chat = topic_prompts(tokenizer, EXTRA_TOPICS)
    for texts in (prose, chat):
        random.Random(seed).shuffle(texts)
    code = [c for c in prompts(tokenizer, "train", seed=seed)["code"] if c not in seen][:extra_code]
    return mixed(train) + mixed({"prose": prose, "code": code, "chat": chat})


@torch.no_grad()
def continuation_batch(target, tokenizer, texts: list[str], new_tokens: int, seed: int | None) -> dict:
    """SmolLM2's continuations of ``texts`` (greedy when ``seed`` is None, else sampled at
    T = 0.8) as a flat uint16 array of prompt + continuation ids, cut after EOS."""
    enc = tokenizer(texts, add_special_tokens=False, return_tensors="pt", padding=True,
                    padding_side="left").to(target.device)
    if seed is not None:
        torch.manual_seed(seed)
    out = target.generate(**enc, max_new_tokens=new_tokens, do_sample=seed is not None,
                          temperature=0.8 if seed is not None else None, top_k=0 if seed is not None else None,
                          top_p=1.0 if seed is not None else None, pad_token_id=tokenizer.pad_token_id)
    eos = eos_ids(target)
    width = enc.input_ids.shape[1]
    sequences, prompt_lens = [], []
    for row, mask in zip(out.cpu(), enc.attention_mask.cpu()):
        new = row[width:].tolist()
        n = next((i + 1 for i, t in enumerate(new) if t in eos), len(new))
        prompt = row[:width][mask.bool()].tolist()
        sequences.append(prompt + new[:n])
        prompt_lens.append(len(prompt))
    lengths = [len(s) for s in sequences]
    return {"ids": np.array([t for s in sequences for t in s], dtype=np.uint16),
            "lengths": np.array(lengths, dtype=np.int32), "prompt_lens": np.array(prompt_lens, dtype=np.int32)}


def eos_ids(target) -> set[int]:
    """The target's end-of-sequence ids (its generation config holds one or a list)."""
    eos = target.generation_config.eos_token_id
    return set(eos if isinstance(eos, list) else [eos])


def batch_sequences(record: dict) -> list[tuple[np.ndarray, int]]:
    """The sequences of a :func:`continuation_batch` record (or a stored file of one) as
    (ids, prompt length)."""
    ends = np.cumsum(record["lengths"])
    return [(record["ids"][end - length:end].astype(np.int64), int(prompt_len))
            for end, length, prompt_len in zip(ends, record["lengths"], record["prompt_lens"])]


def chat_prompt(tokenizer, question: str) -> str:
    """``question`` as a user turn through SmolLM2's chat template, ready for the answer."""
    return tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                         add_generation_prompt=True)


@torch.no_grad()
def instruct_batch(target, tokenizer, size: int, new_tokens: int, seed: int,
                   question_tokens: int = 48) -> dict | None:
    """Chat turns on questions SmolLM2 wrote itself: ``size`` user turns sampled at T = 1.0
    from the chat template's opening (up to ``question_tokens``; the ones that end, with at
    least three tokens, are kept), then SmolLM2's sampled answers as :func:`continuation_batch`
    (``None`` if no question ended).
    The training topics are a few hundred; SmolLM2's own questions range over far more."""
    opening = chat_prompt(tokenizer, "\x00").split("\x00")[0]
    asked = continuation_batch(target, tokenizer, [opening] * size, question_tokens, seed)
    eos = eos_ids(target)
    questions = []
    for ids, prompt_len in batch_sequences(asked):
        new = ids[prompt_len:].tolist()
        if len(new) > 3 and new[-1] in eos:
            text = tokenizer.decode(new[:-1], skip_special_tokens=True).strip()
            if text:
                questions.append(chat_prompt(tokenizer, text))
    return continuation_batch(target, tokenizer, questions, new_tokens, seed + 1) if questions else None


def generate_continuations(target, tokenizer, texts: list[str], folder: Path, kind: str,
                           batches: int | None, minutes: float, budget: Budget) -> None:
    """``kind``-NNNNN.npz files in ``folder`` (``kind``-TAG-NNNNN.npz with the budget's tag),
    continuing after the ones already there. Greedy batches walk the prompts once; sampled
    batches cycle through them; instruct batches are :func:`instruct_batch`."""
    from specdec_ref.zoo.train import budgeted, training_autocast

    folder.mkdir(parents=True, exist_ok=True)
    name = f"{kind}-{budget.tag}" if budget.tag else kind
    done = len(list(folder.glob(f"{name}-[0-9]*.npz")))
    # sampled seeds: the CPU files' as they were made; a tagged part's from a range of its own
    first_seed = 1_000_000 * (1 + zlib.crc32(name.encode()) % 1000) if budget.tag else 1_000
    total = -(-len(texts) // budget.gen_batch)
    if kind == "greedy":
        batches = min(batches, total - done) if batches is not None else total - done
    if batches is not None and batches <= 0:
        return
    with training_autocast():
        for i in budgeted(batches, minutes, kind):
            index = done + i
            if kind == "greedy" and index >= total:
                break
            seed = None if kind == "greedy" else first_seed + index
            if kind == "instruct":
                record = instruct_batch(target, tokenizer, budget.gen_batch, budget.new_tokens, 2 * seed)
            else:
                start = index * budget.gen_batch
                chunk = [texts[(start + j) % len(texts)] for j in range(budget.gen_batch)]
                record = continuation_batch(target, tokenizer, chunk, budget.new_tokens, seed)
            if record is not None:
                write_whole(folder / f"{name}-{index:05d}.npz", lambda file: np.savez(file, **record))


def write_whole(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Write ``path`` with ``write(file)`` into a temporary file renamed when whole: a run stopped
    mid-write leaves no file (the data files are committed; the feature shards are read back)."""
    tmp = path.with_suffix(".tmp")
    with tmp.open("wb") as file:
        write(file)
    tmp.replace(path)


def file_continuations(path: Path) -> list[tuple[np.ndarray, int]]:
    """The sequences of one stored batch as (ids, prompt length)."""
    return batch_sequences(np.load(path))


def load_continuations(folder: Path) -> list[tuple[np.ndarray, int]]:
    """Every stored sequence as (ids, prompt length), in file order."""
    return [seq for path in sorted(folder.glob("*.npz")) for seq in file_continuations(path)]


@dataclass
class Features:
    """Training sequences with the target's features: ``ids`` [T], ``features`` [T, d]
    (bfloat16) and ``labels`` [T], the target's greedy token after each position.
    ``scored_from``: the first position whose label counts in held-out agreement."""

    ids: torch.Tensor
    features: torch.Tensor
    labels: torch.Tensor
    scored_from: int = 0


@torch.no_grad()
def target_features(target, sequences: list[torch.Tensor], batch_tokens: int = 8192,
                    scored_from: list[int] | None = None) -> list[Features]:
    """One batched prefill per chunk of similar-length sequences (right-padded: causal
    attention never lets a position read the padding after it). ``scored_from``: each
    sequence's :attr:`Features.scored_from` (0 for all by default)."""
    from specdec_ref.zoo.train import training_autocast

    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    out: dict[int, Features] = {}
    i = 0
    while i < len(order):
        # ascending lengths: the chunk's last sequence sets its padded width
        end = i + 1
        while end < len(order) and (end + 1 - i) * len(sequences[order[end]]) <= batch_tokens:
            end += 1
        chunk = order[i:end]
        batch = pad_sequence([sequences[j] for j in chunk], batch_first=True).to(target.device)
        with training_autocast():  # a CPU's bfloat16 where native; a GPU's float32 (no CUDA autocast)
            hidden = target.model(batch).last_hidden_state
            labels = target.lm_head(hidden).argmax(-1)
        for row, j in enumerate(chunk):
            n = len(sequences[j])
            out[j] = Features(batch[row, :n].clone(), hidden[row, :n].to(torch.bfloat16).clone(),
                              labels[row, :n].clone(), scored_from[j] if scored_from else 0)
        i += len(chunk)
    return [out[j] for j in range(len(sequences))]


def stored_features(target, data: Path, cache: Path | None = None, files_per_prefill: int = 16,
                    prefill_tokens: int = 8192) -> list[Features]:
    """:func:`target_features` of every stored continuation, in file order. With ``cache``,
    each data file's features are kept there (bfloat16, 1.2 KB a token, one file per data file
    and target dtype, checked against the data file's hash) and read back instead of computed:
    the prefill is the recipe's longest stage on a CPU without native bfloat16 (some 350
    tokens/s on an AVX2 Zen 3), so a stopped run resumes. Missing files are computed
    ``files_per_prefill`` at a time: sorting more sequences by length pads less (a file alone
    pads the stored sequences by 14 %, 16 files at a time by 3 %); ``prefill_tokens`` padded
    tokens per prefill."""
    paths = sorted(data.glob("*.npz"))
    dtype = str(target.dtype).removeprefix("torch.")
    by_file: dict[Path, list[Features]] = {}
    missing = []
    for path in paths:
        seqs = [torch.from_numpy(ids) for ids, _ in file_continuations(path)]
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        shard = cache / f"{path.stem}.{dtype}.pt" if cache else None
        saved = torch.load(shard, map_location=target.device) if shard and shard.exists() else None
        if saved is not None and saved["source_sha256"] == digest:
            lengths = [len(s) for s in seqs]
            by_file[path] = [Features(ids.to(target.device), f, y) for ids, f, y in
                             zip(seqs, saved["features"].split(lengths), saved["labels"].split(lengths))]
        else:
            missing.append((path, seqs, digest, shard))
    computed, start = 0, time.time()
    for i in range(0, len(missing), files_per_prefill):
        group = missing[i:i + files_per_prefill]
        feats = target_features(target, [s for _, seqs, _, _ in group for s in seqs], prefill_tokens)
        for path, seqs, digest, shard in group:
            by_file[path], feats = feats[:len(seqs)], feats[len(seqs):]
            computed += sum(len(s) for s in seqs)
            if shard:
                shard.parent.mkdir(parents=True, exist_ok=True)
                shard_data = {"source_sha256": digest, "features": torch.cat([f.features for f in by_file[path]]),
                              "labels": torch.cat([f.labels for f in by_file[path]])}
                write_whole(shard, lambda file: torch.save(shard_data, file))
        print(f"features: {len(paths) - len(missing) + i + len(group)}/{len(paths)} data files, {computed} tokens "
              f"computed ({computed / (time.time() - start):.0f} tokens/s)", flush=True)
    return [f for path in paths for f in by_file[path]]


def frequent_tokens(data: list[Features], size: int, vocab_size: int) -> torch.LongTensor:
    """The ``size`` target tokens that are most often the target's next token in ``data``."""
    counts = torch.bincount(torch.cat([d.labels for d in data]), minlength=vocab_size)
    return counts.topk(min(size, vocab_size)).indices.sort().values.cpu()


def draft_lm_head(target, vocab: torch.LongTensor | None) -> tuple[torch.LongTensor, torch.Tensor]:
    """``(to_draft, lm_weight)`` for a draft vocabulary ``vocab`` (``None``: the whole one):
    each target id's index in it (-1 for ids outside it), and the target's LM-head rows for it."""
    vocab_size, device = target.config.vocab_size, target.lm_head.weight.device
    vocab = torch.arange(vocab_size, device=device) if vocab is None else vocab.to(device)
    to_draft = torch.full((vocab_size,), -1, dtype=torch.long, device=device)
    to_draft[vocab] = torch.arange(vocab.numel(), device=device)
    return to_draft, target.lm_head.weight[vocab].detach()


def frozen_float(target) -> None:
    """The target in float32 with no gradients: the head trains against it in full precision."""
    target.float()
    for p in target.parameters():
        p.requires_grad_(False)


@dataclass
class Batch:
    """Sequences right-padded to one length: ``ids`` [B, T], ``features`` [B, T, d],
    ``labels`` [B, T], ``lengths`` [B] and ``scored_from`` [B]. Causal attention never lets
    a position read the padding after it, so only the losses at padded positions need masking."""

    ids: torch.Tensor
    features: torch.Tensor
    labels: torch.Tensor
    lengths: torch.Tensor
    scored_from: torch.Tensor


def collate(seqs: list[Features]) -> Batch:
    """``seqs`` right-padded into one :class:`Batch`, on their device."""
    device = seqs[0].ids.device
    return Batch(*(pad_sequence([getattr(s, name) for s in seqs], batch_first=True)
                   for name in ("ids", "features", "labels")),
                 torch.tensor([s.ids.numel() for s in seqs], device=device),
                 torch.tensor([s.scored_from for s in seqs], device=device))


def shuffled_batches(data: list[Features], batch_tokens: int, seed: int) -> list[list[int]]:
    """Indices into ``data`` in a random order, cut into groups of about ``batch_tokens`` real
    tokens. Grouping by length pads less (2,770 tokens/s against 2,150 here), but a
    sequence's length tells its kind, and batches of one kind trained far worse: held-out
    first-draft agreement after 400k tokens 0.15 / 0.20 / 0.35 (prose / code / chat) against
    0.33 / 0.31 / 0.54 with random batches, on the same data (an Intel Xeon, 2 cores)."""
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed)).tolist()
    groups, group, size = [], [], 0
    for i in order:
        group.append(i)
        size += data[i].ids.numel()
        if size >= batch_tokens:
            groups.append(group)
            group, size = [], 0
    return groups + [group] if group else groups


def head_losses(head: EagleHead, embed: torch.nn.Module, lm_weight: torch.Tensor, to_draft: torch.Tensor,
                batch: Batch, ce_weight: float = 1.0, best_of: int = 1) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """Two drafting steps over a batch; returns the mean loss per real position and, per step,
    (correct, counted): correct where the target's token is among the head's ``best_of`` best.

    Step 1 reads the target's feature f_i with token x_{i+1} and predicts f_{i+1}. Step 2
    reads step 1's prediction instead, as the second draft does: its query attends to the
    real entries before it and to its own, never to real features of its own position.
    Each step's loss is smooth-L1 to the true next feature plus cross-entropy to the target's
    greedy next token. ``lm_weight`` holds the draft vocabulary's rows; ``to_draft`` maps a
    target id to its index there (-1: not in it, no cross-entropy there). Positions before a
    sequence's ``scored_from`` are trained on but not counted in the stats."""
    ids, feats, labels = batch.ids, batch.features.float(), batch.labels
    t, device = ids.shape[1] - 1, ids.device
    emb = embed(ids[:, 1:]).float()
    positions = torch.arange(t, device=device)
    pred1, (k1, v1) = head(emb, feats[:, :t], positions)
    # step 2: position i reads (x_{i+1}, predicted f_i from step 1 at i - 1)
    layer = head.layers[0]
    x2 = head.fc(torch.cat([emb[:, 1:], pred1[:, :-1]], -1))
    q2, k2, v2 = layer.self_attn.project(x2, positions[1:])
    real = torch.arange(t, device=device)[None, :] < torch.arange(1, t, device=device)[:, None]
    own = torch.eye(t - 1, dtype=torch.bool, device=device)
    pred2 = layer(x2, q2, torch.cat([k1, k2], 2), torch.cat([v1, v2], 2), torch.cat([real, own], 1))
    loss, stats = 0.0, []
    for pred, first in ((pred1, 0), (pred2, 1)):
        true_next = feats[:, first + 1:t + 1]
        steps = torch.arange(first + 1, t + 1, device=device)[None, :]
        counted = steps < batch.lengths[:, None]
        target_ids = to_draft[labels[:, first + 1:t + 1]]
        logits = (pred @ lm_weight.T).float()
        ce = F.cross_entropy(logits.transpose(1, 2), target_ids.clamp_min(0), reduction="none")
        l1 = F.smooth_l1_loss(pred.float(), true_next, reduction="none").mean(-1)
        n = counted.sum().clamp_min(1)
        loss = loss + (l1 * counted).sum() / n + ce_weight * (ce * (counted & (target_ids >= 0))).sum() / n
        scored = counted & (steps >= batch.scored_from[:, None])
        best = logits.topk(best_of, dim=-1).indices
        stats.append((int(((best == target_ids[..., None]).any(-1) & scored).sum()), int(scored.sum())))
    return loss, stats


@torch.no_grad()
def agreement(head: EagleHead, embed, lm_weight, to_draft, data: list[Features], best_of: int = 1) -> list[float]:
    """Held-out share of positions where the head's first and second draft would be accepted
    greedily given a correct prefix (the target's own token), counted from each sequence's
    ``scored_from``. ``best_of=2``: where the target's token is one of the head's best two
    (what a tree with two candidates per position could accept)."""
    head.eval()
    _, stats = head_losses(head, embed, lm_weight, to_draft, collate(data), best_of=best_of)
    head.train()
    return [round(right / max(n, 1), 3) for right, n in stats]


def train_head(head: EagleHead, target, data: list[Features], heldout: dict[str, list[Features]],
               to_draft: torch.Tensor, lm_weight: torch.Tensor, budget: Budget, ckpt: Path,
               seed: int = 0) -> dict:
    """AdamW with warmup and cosine decay; batches of whole sequences, about ``batch_tokens``
    each, drawn in a new random order every pass over the data;
    held-out agreement measured every ``budget.eval_every_tokens`` (the learning curve);
    checkpoints every 5 minutes, so a stopped run resumes."""
    embed = target.get_input_embeddings()
    opt = torch.optim.AdamW(head.parameters(), lr=budget.lr, betas=(0.9, 0.95), weight_decay=0.0)
    state = {"step": 0, "epoch": 0, "index": 0, "elapsed": 0.0, "tokens": 0, "curve": [], "losses": []}
    if ckpt.exists():
        saved = torch.load(ckpt, weights_only=False)
        head.load_state_dict(saved.pop("head"))
        opt.load_state_dict(saved.pop("opt"))
        state = saved
    groups = shuffled_batches(data, budget.batch_tokens, seed + state["epoch"])

    def progress() -> float:
        return state["step"] / budget.steps if budget.steps else state["elapsed"] / (60 * budget.train_minutes)

    def evaluate() -> None:
        point = {"tokens": state["tokens"]}
        for kind, seqs in heldout.items():
            point[kind] = agreement(head, embed, lm_weight, to_draft, seqs)
        state["curve"].append(point)
        print(json.dumps(point), flush=True)

    head.train()
    device = lm_weight.device
    start, last_ckpt, next_eval = time.time() - state["elapsed"], time.time(), state["tokens"]
    while progress() < 1:
        if state["tokens"] >= next_eval:
            evaluate()
            next_eval += budget.eval_every_tokens
        cos = 0.5 * (1 + np.cos(np.pi * min(progress(), 1.0)))
        for g in opt.param_groups:
            g["lr"] = budget.lr * min(1.0, (state["step"] + 1) / 50) * (0.1 + 0.9 * cos)
        if state["index"] == len(groups):
            state["epoch"], state["index"] = state["epoch"] + 1, 0
            groups = shuffled_batches(data, budget.batch_tokens, seed + state["epoch"])
        batch = collate([data[i] for i in groups[state["index"]]])
        state["index"] += 1
        size = int(batch.lengths.sum())
        with autocast(device):
            loss = head_losses(head, embed, lm_weight, to_draft, batch, budget.ce_weight)[0]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        state["step"] += 1
        state["tokens"] += size
        state["losses"].append(round(loss.item(), 4))
        state["elapsed"] = time.time() - start
        if time.time() - last_ckpt > 300:
            ckpt.parent.mkdir(parents=True, exist_ok=True)
            torch.save({**state, "head": head.state_dict(), "opt": opt.state_dict()}, ckpt)
            last_ckpt = time.time()
        if state["step"] % 20 == 0:
            print(f"step {state['step']} tokens {state['tokens']} loss {np.mean(state['losses'][-20:]):.3f} "
                  f"{state['tokens'] / state['elapsed']:.0f} tok/s", flush=True)
    evaluate()
    head.eval()
    return {"steps": state["step"], "tokens": state["tokens"], "minutes": round(state["elapsed"] / 60, 1),
            "final_loss": float(np.mean(state["losses"][-20:])), "curve": state["curve"]}


def heldout_features(target, tokenizer, per_kind: int, new_tokens: int,
                     prompts: dict[str, list[str]] | None = None) -> dict[str, list[Features]]:
    """Features of SmolLM2's greedy continuations of held-out prompts (no topic, task or
    source file shared with training), by kind: what the learning curve is measured on.
    Agreement is scored on the continuations only, from their second token: the first comes
    from the target's prefill, and a prompt (a chat template most of all) is far easier to
    predict than what SmolLM2 writes after it. ``prompts``: the held-out prompts by kind
    (:func:`prompt_sets`); built here by default."""
    from specdec_ref.zoo.distill import heldout_prompts

    out = {}
    for kind, texts in (prompts or heldout_prompts(tokenizer, per_kind=per_kind)).items():
        texts = texts[:per_kind]
        seqs = batch_sequences(continuation_batch(target, tokenizer, texts, new_tokens, None))
        out[kind] = target_features(target, [torch.from_numpy(ids) for ids, _ in seqs],
                                    scored_from=[prompt_len for _, prompt_len in seqs])
    return out


def save(head: EagleHead, vocab: torch.LongTensor, target_config, out: Path, record: dict) -> None:
    """The head in ``out/smollm2-eagle``, its checksums and record merged into ``out/manifest.json``."""
    from specdec_ref.eagle import save_head
    from specdec_ref.zoo import add_to_manifest

    folder = out / "smollm2-eagle"
    save_head(head, folder, vocab, target_config, record)
    add_to_manifest(out, folder, "smollm2_eagle", record)


def load_target(device: str = "cpu"):
    """SmolLM2 and its tokenizer: on a CPU in bfloat16 where it computes it natively, on a GPU
    in float32 with TF32 matmuls (10 mantissa bits against bfloat16's 7; plain float32 would
    make the features the slowest stage)."""
    from specdec_ref.zoo import load
    from specdec_ref.zoo.train import native_bf16

    if torch.device(device).type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    bf16 = torch.device(device).type == "cpu" and native_bf16()
    return load("zoo:smollm2", dtype=torch.bfloat16 if bf16 else torch.float32, device=device)


def prompt_sets(tokenizer, budget: Budget, seed: int = 0, path: Path | None = None,
                ) -> tuple[list[str], dict[str, list[str]]]:
    """``(training prompts, held-out prompts by kind)``: built here (:func:`training_prompts`,
    ``distill.heldout_prompts``), or read from ``path``, a file written by ``--export-prompts``.
    The code prompts are cut from this machine's Python library files, so another machine
    (a GPU one with another Python) reads the same prompts from the file."""
    from specdec_ref.zoo.distill import heldout_prompts

    if path is not None:
        saved = json.loads(path.read_text())
        return saved["train"], saved["heldout"]
    return (training_prompts(tokenizer, budget.code_prompts, budget.extra_code_prompts, seed),
            heldout_prompts(tokenizer, per_kind=8, seed=seed))


def grow_data(target, tokenizer, data: Path, budget: Budget, seed: int = 0,
              sampled_minutes: float | None = None, texts: list[str] | None = None) -> dict:
    """Stage 1 alone: the greedy continuations still missing, then sampled ones for
    ``sampled_minutes`` (the budget's by default), then the budget's instruct batches.
    ``texts``: the training prompts (:func:`prompt_sets`). Returns what ``data`` holds now."""
    if texts is None:
        texts = training_prompts(tokenizer, budget.code_prompts, budget.extra_code_prompts, seed)
    generate_continuations(target, tokenizer, texts, data, "greedy", budget.greedy_batches,
                           budget.greedy_minutes, budget)
    minutes = budget.sampled_minutes if sampled_minutes is None else sampled_minutes
    generate_continuations(target, tokenizer, texts, data, "sampled", budget.sampled_batches if sampled_minutes is None
                           else None, minutes, budget)
    if budget.instruct_minutes:
        generate_continuations(target, tokenizer, texts, data, "instruct", None, budget.instruct_minutes, budget)
    stored = load_continuations(data)
    return {"files": len(list(data.glob("*.npz"))), "sequences": len(stored),
            "tokens": int(sum(len(ids) for ids, _ in stored)),
            "continuation_tokens": int(sum(len(ids) - n for ids, n in stored))}


def build(out: Path, work: Path, budget_name: str = "full", data: Path = DATA_DIR, seed: int = 0,
          generate: bool = True, init: Path | None = None, train_minutes: float | None = None,
          lr: float | None = None, device: str = "cpu", prompts: Path | None = None,
          sampled_minutes: float | None = None, instruct_minutes: float | None = None) -> dict:
    """Every stage; returns the record written to the manifest. ``generate=False`` trains on
    the continuations already stored in ``data``. ``init``: a saved head to go on training
    (with its draft vocabulary) instead of a fresh one; ``train_minutes`` and ``lr`` (the
    peak learning rate) override the budget's, as do ``sampled_minutes`` and ``instruct_minutes``
    (stage 1's time). ``device``: where SmolLM2 and the head run
    ("cuda" for the ``gpu`` budget); ``prompts``: a ``--export-prompts`` file. On a CPU the
    features are cached in ``work/features`` (a GPU recomputes them in seconds); the training
    checkpoint is kept in ``work``."""
    from specdec_ref.eagle import CONFIG_NAME, EagleConfig, init_head, load_head
    from specdec_ref.zoo.train import native_bf16

    budget = BUDGETS[budget_name]
    overrides = {"train_minutes": train_minutes, "lr": lr, "sampled_minutes": sampled_minutes,
                 "instruct_minutes": instruct_minutes}
    budget = replace(budget, **{key: value for key, value in overrides.items() if value is not None})
    target, tokenizer = load_target(device)
    train_texts, heldout_texts = prompt_sets(tokenizer, budget, seed, prompts)
    t0 = time.time()
    if generate:
        grow_data(target, tokenizer, data, budget, seed, texts=train_texts)
    generate_seconds = time.time() - t0
    stored = load_continuations(data)
    t0 = time.time()
    on_cpu = torch.device(device).type == "cpu"
    train_data = stored_features(target, data, work / "features" if on_cpu else None,
                                 prefill_tokens=budget.prefill_tokens)
    tiny = budget_name == "tiny"
    heldout = heldout_features(target, tokenizer, per_kind=2 if tiny else 8, new_tokens=8 if tiny else 64,
                               prompts=heldout_texts)
    feature_seconds = time.time() - t0
    frozen_float(target)
    if init is None:
        head = init_head(EagleConfig.for_target(target.config), seed)
        vocab = frequent_tokens(train_data, budget.draft_vocab, target.config.vocab_size)
    else:
        head, vocab = load_head(init)
    head.to(device)
    to_draft, lm_weight = draft_lm_head(target, vocab)
    labels = torch.cat([d.labels for d in train_data])
    fit = train_head(head, target, train_data, heldout, to_draft, lm_weight, budget,
                     work / "eagle-head.ckpt", seed)
    record = {
        "budget": budget_name, "seed": seed, "parameters": head.num_parameters, "generated_this_run": generate,
        "data": {"sequences": len(stored), "tokens": int(labels.numel()),
                 "continuation_tokens": int(sum(len(ids) - n for ids, n in stored)),
                 "files": len(list(data.glob("*.npz"))), "generate_seconds": round(generate_seconds),
                 "feature_seconds": round(feature_seconds)},
        "draft_vocab": {"size": int(vocab.numel()),
                        "coverage": round((to_draft[labels] >= 0).float().mean().item(), 4)},
        "loss": {"smooth_l1_features": 1.0, "cross_entropy": budget.ce_weight, "steps_unrolled": 2},
        "train": fit | {"precision": "bf16 autocast" if not on_cpu or native_bf16() else "float32",
                        "peak_lr": budget.lr, "device": device_name(device)},
    }
    if init is not None:
        before = json.loads((init / CONFIG_NAME).read_text())["specdec_eagle"]["record"]
        trained = {key: value for key, value in before.get("train", {}).items()
                   if key in ("steps", "tokens", "minutes", "precision")}
        record["init"] = {"from": str(init), "train": trained, "init": before.get("init")}
    save(head.cpu(), vocab, target.config, out, record)
    return record


def device_name(device: str) -> str:
    """The processor a run used, for its record: the GPU's name, or the CPU's model name."""
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_name(device)
    from specdec_ref.vllm.recorded import cpu_model

    return cpu_model()


def evaluate(heads: list[Path], per_kind: int = 8, new_tokens: int = 64, best_of: int = 1,
             ) -> dict[str, dict[str, list[float]]]:
    """Held-out first- and second-draft agreement of saved heads, by kind, on the learning
    curve's held-out set: heads trained on different data compared on one footing.
    ``best_of=2`` counts a position where SmolLM2's token is one of the head's best two."""
    from specdec_ref.eagle import load_head

    target, tokenizer = load_target()
    heldout = heldout_features(target, tokenizer, per_kind, new_tokens)
    frozen_float(target)
    embed = target.get_input_embeddings()
    out = {}
    for folder in heads:
        head, vocab = load_head(folder)
        to_draft, lm_weight = draft_lm_head(target, vocab)
        out[str(folder)] = {kind: agreement(head, embed, lm_weight, to_draft, seqs, best_of)
                            for kind, seqs in heldout.items()}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("zoo"), help="zoo folder to write smollm2-eagle into")
    parser.add_argument("--work", type=Path, default=Path.home() / ".cache" / "specdec" / "eagle",
                        help="where the features and the training checkpoint are kept (a rerun resumes)")
    parser.add_argument("--data", type=Path, default=DATA_DIR,
                        help="where SmolLM2's continuations are stored (committed; a rerun adds to them)")
    parser.add_argument("--budget", choices=sorted(BUDGETS), default="full", help="time or step budget")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--init", type=Path, metavar="HEAD",
                        help="go on training a saved head (and keep its draft vocabulary) instead of a fresh one")
    parser.add_argument("--train-minutes", type=float, metavar="MINUTES",
                        help="training time instead of the budget's (a stopped run resumes its checkpoint)")
    parser.add_argument("--lr", type=float, help="peak learning rate instead of the budget's (3e-3); going on "
                        "from a trained head at 3e-3 undid much of its training; 3e-4 is where the shipped one ended")
    stage = parser.add_mutually_exclusive_group()
    stage.add_argument("--no-generate", action="store_true",
                       help="train on the stored continuations only (stage 1 skipped)")
    stage.add_argument("--only-generate", type=float, metavar="MINUTES",
                       help="stage 1 alone: add sampled continuations for MINUTES (commit them; "
                            "a later run trains on everything stored)")
    stage.add_argument("--evaluate", type=Path, nargs="+", metavar="HEAD",
                       help="print the held-out agreement of saved head folders, nothing trained")
    parser.add_argument("--best-of", type=int, default=1, metavar="N",
                        help="with --evaluate: count a position where SmolLM2's token is among the head's best N")
    parser.add_argument("--sampled-minutes", type=float, metavar="MINUTES",
                        help="time for sampled continuations instead of the budget's")
    parser.add_argument("--instruct-minutes", type=float, metavar="MINUTES",
                        help="time for chat turns on SmolLM2's own questions instead of the budget's")
    parser.add_argument("--device", default="cpu", help='where SmolLM2 and the head run: "cuda" with --budget gpu')
    parser.add_argument("--prompts", type=Path, metavar="FILE",
                        help="read the training and held-out prompts from FILE (written by --export-prompts)")
    stage.add_argument("--export-prompts", type=Path, metavar="FILE",
                       help="write the training and held-out prompts to FILE, for a run on another machine "
                            "(whose Python library files would give other code prompts), and stop")
    args = parser.parse_args()
    if args.export_prompts:
        from specdec_ref.zoo import load_tokenizer

        train, heldout = prompt_sets(load_tokenizer("zoo:smollm2"), BUDGETS[args.budget], args.seed)
        args.export_prompts.write_text(json.dumps({"train": train, "heldout": heldout}) + "\n")
        print(f"{len(train)} training prompts, {sum(map(len, heldout.values()))} held-out: {args.export_prompts}")
        return
    if args.evaluate:
        print(json.dumps(evaluate(args.evaluate, best_of=args.best_of), indent=2))
        return
    if args.only_generate is not None:
        target, tokenizer = load_target(args.device)
        texts = prompt_sets(tokenizer, BUDGETS[args.budget], args.seed, args.prompts)[0]
        print(json.dumps(grow_data(target, tokenizer, args.data, BUDGETS[args.budget], args.seed,
                                   args.only_generate, texts), indent=2))
        return
    print(json.dumps(build(args.out, args.work, args.budget, args.data, args.seed, not args.no_generate,
                           args.init, args.train_minutes, args.lr, args.device, args.prompts,
                           args.sampled_minutes, args.instruct_minutes), indent=2))


if __name__ == "__main__":
    main()
