"""The data of ``zoo:smollm2-eagle``'s recipe (``specdec_ref.recipes.eagle_head``), stages 1 and 2:
the prompts, SmolLM2's continuations of them and their storage, SmolLM2's features, and the
training batches.

  prompts        the distilled draft's training prompts (``zoo.prompts.prompts``: prose, chat,
                 code), then prompts only the head trains on (:data:`EXTRA_TOPICS`, more
                 function openings): :func:`training_prompts`; the held-out ones are
                 ``zoo.prompts.heldout_prompts``. :func:`prompt_sets` builds both, or reads a
                 file ``--export-prompts`` wrote on another machine.
  continuations  SmolLM2's greedy, then sampled (T = 0.8), continuations, and chat turns on
                 questions SmolLM2 wrote itself (:func:`instruct_batch`), as token ids, one
                 ``.npz`` file per batch in ``zoo/data/smollm2-continuations/`` (:data:`DATA_DIR`;
                 committed, so a rerun generates only what its budget adds): :func:`grow_data`.
  features       one batched SmolLM2 prefill per chunk of sequences gives the feature (last
                 hidden state, after the final norm) at every position and the target's greedy
                 token after it (:class:`Features`); cached per data file (:func:`stored_features`).
  batches        sequences right-padded into a :class:`Batch`, in random groups of about
                 ``batch_tokens`` tokens (:func:`shuffled_batches`).

:class:`Budget` sizes every stage of the recipe, these and the training.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence

DATA_DIR = Path(__file__).resolve().parents[2] / "zoo" / "data" / "smollm2-continuations"


# Topics only the head trains on. Its data are SmolLM2's continuations, and the prompts of
# zoo.prompts.TOPICS had each been continued three or four times: new topics give more variety
# per generated token. None is a held-out topic of zoo.prompts.TOPICS, or close to one.
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


def training_prompts(tokenizer, code_limit: int | None, extra_code: int, seed: int = 0) -> list[str]:
    """The distilled draft's training prompts, then prompts only the head trains on (prose and
    chat on :data:`EXTRA_TOPICS`, ``extra_code`` more function openings); each part's kinds
    interleaved so every batch mixes them. Appended, so the files already generated keep
    their prompts."""
    from specdec_ref.zoo.prompts import KINDS, interleave, prompts, topic_prompts

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


def prompt_sets(tokenizer, budget: Budget, seed: int = 0, path: Path | None = None,
                ) -> tuple[list[str], dict[str, list[str]]]:
    """``(training prompts, held-out prompts by kind)``: built here (:func:`training_prompts`,
    ``zoo.prompts.heldout_prompts``), or read from ``path``, a file written by ``--export-prompts``.
    The code prompts are cut from this machine's Python library files, so another machine
    (a GPU one with another Python) reads the same prompts from the file."""
    from specdec_ref.zoo.prompts import heldout_prompts

    if path is not None:
        saved = json.loads(path.read_text())
        return saved["train"], saved["heldout"]
    return (training_prompts(tokenizer, budget.code_prompts, budget.extra_code_prompts, seed),
            heldout_prompts(tokenizer, per_kind=8, seed=seed))


def load_target(device: str = "cpu"):
    """SmolLM2 and its tokenizer: on a CPU in bfloat16 where it computes it natively, on a GPU
    in float32 with TF32 matmuls (10 mantissa bits against bfloat16's 7; plain float32 would
    make the features the slowest stage)."""
    from specdec_ref.recipes.train import native_bf16
    from specdec_ref.zoo import load

    if torch.device(device).type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    bf16 = torch.device(device).type == "cpu" and native_bf16()
    return load("zoo:smollm2", dtype=torch.bfloat16 if bf16 else torch.float32, device=device)


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
    from specdec_ref.recipes.train import budgeted, training_autocast

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


def data_files(folder: Path, files: list[str] | None = None) -> list[Path]:
    """The stored data files matching the glob patterns ``files`` (default all), sorted."""
    paths = sorted({path for pattern in files or ["*.npz"] for path in folder.glob(pattern)})
    if not paths:
        raise ValueError(f"no data files in {folder} match {files or ['*.npz']}")
    return paths


def load_continuations(folder: Path, files: list[str] | None = None) -> list[tuple[np.ndarray, int]]:
    """Every stored sequence (of the ``files`` patterns, default all) as (ids, prompt length), in file order."""
    return [seq for path in data_files(folder, files) for seq in file_continuations(path)]


@dataclass
class Features:
    """Training sequences with the target's features: ``ids`` [T], ``features`` [T, d], or
    [T, (layers + 1) d] for a multi-layer head (bfloat16) and ``labels`` [T], the target's greedy token after each position.
    ``scored_from``: the first position whose label counts in held-out agreement."""

    ids: torch.Tensor
    features: torch.Tensor
    labels: torch.Tensor
    scored_from: int = 0


@torch.no_grad()
def target_features(target, sequences: list[torch.Tensor], batch_tokens: int = 8192,
                    scored_from: list[int] | None = None, feature_layers: tuple[int, ...] = ()) -> list[Features]:
    """One batched prefill per chunk of similar-length sequences (right-padded: causal
    attention never lets a position read the padding after it). ``scored_from``: each
    sequence's :attr:`Features.scored_from` (0 for all by default). ``feature_layers``: a
    multi-layer head's lower layers (``hidden_states`` indices), whose features come before
    the top one's in :attr:`Features.features`."""
    from specdec_ref.recipes.train import training_autocast

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
            states = target.model(batch, output_hidden_states=bool(feature_layers))
            labels = target.lm_head(states.last_hidden_state).argmax(-1)
            hidden = torch.cat([*(states.hidden_states[i] for i in feature_layers), states.last_hidden_state], -1)
        for row, j in enumerate(chunk):
            n = len(sequences[j])
            out[j] = Features(batch[row, :n].clone(), hidden[row, :n].to(torch.bfloat16).clone(),
                              labels[row, :n].clone(), scored_from[j] if scored_from else 0)
        i += len(chunk)
    return [out[j] for j in range(len(sequences))]


def stored_features(target, data: Path, cache: Path | None = None, files_per_prefill: int = 16,
                    prefill_tokens: int = 8192, feature_layers: tuple[int, ...] = (),
                    files: list[str] | None = None) -> list[Features]:
    """:func:`target_features` of every stored continuation, in file order. With ``cache``,
    each data file's features are kept there (bfloat16, 1.2 KB a token, one file per data file
    and target dtype, checked against the data file's hash) and read back instead of computed:
    the prefill is the recipe's longest stage on a CPU without native bfloat16 (some 350
    tokens/s on an AVX2 Zen 3), so a stopped run resumes. Missing files are computed
    ``files_per_prefill`` at a time: sorting more sequences by length pads less (a file alone
    pads the stored sequences by 14 %, 16 files at a time by 3 %); ``prefill_tokens`` padded
    tokens per prefill. ``feature_layers`` as in :func:`target_features` (each layer another
    1.2 KB a token); ``files``: glob patterns of the data files to read (default all)."""
    paths = data_files(data, files)
    dtype = str(target.dtype).removeprefix("torch.")
    layers = "".join(f".layer{i}" for i in feature_layers)
    by_file: dict[Path, list[Features]] = {}
    missing = []
    for path in paths:
        seqs = [torch.from_numpy(ids) for ids, _ in file_continuations(path)]
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        shard = cache / f"{path.stem}.{dtype}{layers}.pt" if cache else None
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
        feats = target_features(target, [s for _, seqs, _, _ in group for s in seqs], prefill_tokens,
                                feature_layers=feature_layers)
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


def heldout_features(target, tokenizer, per_kind: int, new_tokens: int,
                     prompts: dict[str, list[str]] | None = None,
                     feature_layers: tuple[int, ...] = ()) -> dict[str, list[Features]]:
    """Features of SmolLM2's greedy continuations of held-out prompts (no topic, task or
    source file shared with training), by kind: what the learning curve is measured on.
    Agreement is scored on the continuations only, from their second token: the first comes
    from the target's prefill, and a prompt (a chat template most of all) is far easier to
    predict than what SmolLM2 writes after it. ``prompts``: the held-out prompts by kind
    (:func:`prompt_sets`); built here by default. ``feature_layers`` as in :func:`target_features`."""
    from specdec_ref.zoo.prompts import heldout_prompts

    out = {}
    for kind, texts in (prompts or heldout_prompts(tokenizer, per_kind=per_kind)).items():
        texts = texts[:per_kind]
        seqs = batch_sequences(continuation_batch(target, tokenizer, texts, new_tokens, None))
        out[kind] = target_features(target, [torch.from_numpy(ids) for ids, _ in seqs],
                                    scored_from=[prompt_len for _, prompt_len in seqs], feature_layers=feature_layers)
    return out


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
