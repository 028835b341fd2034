"""Train ``zoo:smollm2-eagle``: an EAGLE-style draft head that reads SmolLM2's own features.

    python -m specdec_ref.recipes.eagle_head --out zoo --budget full
    python -m specdec_ref.recipes.eagle_head --only-generate 30     # stage 1 alone: 30 more minutes of data
    python -m specdec_ref.recipes.eagle_head --no-generate --init zoo/smollm2-eagle --train-minutes 90 --lr 3e-4
                                                                    # the shipped head trained further
    python -m specdec_ref.recipes.eagle_head --no-generate --init zoo/smollm2-eagle --feature-layers 2 15 \
        --name smollm2-eagle3 --out out/zoo                         # a multi-layer head (EAGLE-3), widened from it
    python -m specdec_ref.recipes.eagle_head --evaluate zoo/smollm2-eagle   # held-out agreement of saved heads
    python -m specdec_ref.recipes.eagle_head --export-prompts prompts.json  # then, on a machine with a GPU:
    python -m specdec_ref.recipes.eagle_head --budget gpu --device cuda --prompts prompts.json --init zoo/smollm2-eagle --lr 3e-4

EAGLE (Li et al. 2024, arXiv:2401.15077) drafts from the target's last hidden state
instead of from tokens alone: one decoder layer takes (feature at t, embedding of token
t+1), predicts the feature at t+1, and the target's own LM head turns that into a draft
token. The head does not have to learn the language; it learns one more layer's worth
of the target. The architecture lives in ``specdec_ref.eagle``; this recipe builds it: stages 1
and 2 (prompts, continuations, features, batches) in ``eagle_data``, 3 and 4 and the command
line here.

Stages (each resumes where it stopped):
  1. continuations  SmolLM2's greedy, then sampled (T = 0.8), continuations of the
                    training prompts of ``zoo.prompts.prompts`` (prose, chat, code) and of
                    prompts only the head trains on (``eagle_data.training_prompts``), as token
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
                    ``--feature-layers`` trains a multi-layer head (EAGLE-3): it also reads
                    those layers' features (each another 1.2 KB a token in the cache), fused
                    with the top one; ``--init`` widens a one-layer head into one that starts
                    where it was (:func:`specdec_ref.eagle.widen_head`).
  4. save           bfloat16 weights (the head only: embedding and LM head are SmolLM2's),
                    the draft vocabulary, a vLLM-loadable copy, checksums in manifest.json.

Budgets are wall-clock minutes (``full``, ``gpu``) or counts (``tiny``, for the test). On a CPU
the recipe reads every stored file; the features of all of them (7.3M tokens) take about 80
minutes on a 2-core AVX-512 CPU with native bfloat16, seconds on a GPU.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from specdec_ref.eagle import EagleHead
from specdec_ref.recipes.eagle_data import (BUDGETS, DATA_DIR, Batch, Budget, Features, collate, grow_data,
                                            heldout_features, load_continuations, load_target, prompt_sets,
                                            shuffled_batches, stored_features)


def autocast(device: torch.device | str) -> torch.autocast:
    """bfloat16 autocast for training: the CPU's where it is native (``train.training_autocast``),
    always on a GPU."""
    from specdec_ref.recipes.train import training_autocast

    if torch.device(device).type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return training_autocast()


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
    sequence's ``scored_from`` are trained on but not counted in the stats. A multi-layer
    head's step 1 reads its fused features; its predictions are scored against the top ones."""
    ids, feats, labels = batch.ids, batch.features.float(), batch.labels
    t, device = ids.shape[1] - 1, ids.device
    emb = embed(ids[:, 1:]).float()
    positions = torch.arange(t, device=device)
    pred1, (k1, v1) = head(emb, head.fuse_features(feats[:, :t]), positions)
    feats = feats[..., -head.config.hidden_size:]
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


def save(head: EagleHead, vocab: torch.LongTensor, target_config, out: Path, record: dict,
         name: str = "smollm2-eagle") -> None:
    """The head in ``out/name``, its checksums and record merged into ``out/manifest.json``."""
    from specdec_ref.eagle import save_head
    from specdec_ref.zoo import add_to_manifest

    folder = out / name
    save_head(head, folder, vocab, target_config, record)
    add_to_manifest(out, folder, name.replace("-", "_"), record)


def build(out: Path, work: Path, budget_name: str = "full", data: Path = DATA_DIR, seed: int = 0,
          generate: bool = True, init: Path | None = None, train_minutes: float | None = None,
          lr: float | None = None, device: str = "cpu", prompts: Path | None = None,
          sampled_minutes: float | None = None, instruct_minutes: float | None = None,
          feature_layers: tuple[int, ...] = (), files: list[str] | None = None, name: str = "smollm2-eagle") -> dict:
    """Every stage; returns the record written to the manifest. ``generate=False`` trains on
    the continuations already stored in ``data``. ``init``: a saved head to go on training
    (with its draft vocabulary) instead of a fresh one; ``train_minutes`` and ``lr`` (the
    peak learning rate) override the budget's, as do ``sampled_minutes`` and ``instruct_minutes``
    (stage 1's time). ``device``: where SmolLM2 and the head run
    ("cuda" for the ``gpu`` budget); ``prompts``: a ``--export-prompts`` file. On a CPU the
    features are cached in ``work/features`` (a GPU recomputes them in seconds); the training
    checkpoint is kept in ``work``. ``feature_layers``: train a multi-layer head reading those
    layers too (EAGLE-3); with ``init``, the saved one-layer head widened (:func:`widen_head`).
    ``files``: glob patterns of the data files to train on (default all). ``name``: the zoo
    folder written."""
    from specdec_ref.eagle import CONFIG_NAME, EagleConfig, init_head, load_head, widen_head
    from specdec_ref.recipes.train import native_bf16

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
    stored = load_continuations(data, files)
    t0 = time.time()
    on_cpu = torch.device(device).type == "cpu"
    if init is not None:
        head, vocab = load_head(init)
        if feature_layers and feature_layers != head.config.feature_layers:
            head = widen_head(head, feature_layers)
        feature_layers = head.config.feature_layers
    train_data = stored_features(target, data, work / "features" if on_cpu else None,
                                 prefill_tokens=budget.prefill_tokens, feature_layers=feature_layers, files=files)
    tiny = budget_name == "tiny"
    heldout = heldout_features(target, tokenizer, per_kind=2 if tiny else 8, new_tokens=8 if tiny else 64,
                               prompts=heldout_texts, feature_layers=feature_layers)
    feature_seconds = time.time() - t0
    frozen_float(target)
    if init is None:
        head = init_head(replace(EagleConfig.for_target(target.config), feature_layers=feature_layers), seed)
        vocab = frequent_tokens(train_data, budget.draft_vocab, target.config.vocab_size)
    head.to(device)
    to_draft, lm_weight = draft_lm_head(target, vocab)
    labels = torch.cat([d.labels for d in train_data])
    fit = train_head(head, target, train_data, heldout, to_draft, lm_weight, budget,
                     work / f"{name}.ckpt", seed)
    record = {
        "budget": budget_name, "seed": seed, "parameters": head.num_parameters, "generated_this_run": generate,
        "data": {"sequences": len(stored), "tokens": int(labels.numel()),
                 "continuation_tokens": int(sum(len(ids) - n for ids, n in stored)),
                 "files": files or len(list(data.glob("*.npz"))), "generate_seconds": round(generate_seconds),
                 "feature_seconds": round(feature_seconds)},
        "draft_vocab": {"size": int(vocab.numel()),
                        "coverage": round((to_draft[labels] >= 0).float().mean().item(), 4)},
        "loss": {"smooth_l1_features": 1.0, "cross_entropy": budget.ce_weight, "steps_unrolled": 2},
        "feature_layers": list(feature_layers),
        "train": fit | {"precision": "bf16 autocast" if not on_cpu or native_bf16() else "float32",
                        "peak_lr": budget.lr, "device": device_name(device)},
    }
    if init is not None:
        before = json.loads((init / CONFIG_NAME).read_text())["specdec_eagle"]["record"]
        trained = {key: value for key, value in before.get("train", {}).items()
                   if key in ("steps", "tokens", "minutes", "precision")}
        record["init"] = {"from": str(init), "train": trained, "init": before.get("init")}
    save(head.cpu(), vocab, target.config, out, record, name)
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
    loaded = [(folder, *load_head(folder)) for folder in heads]
    layers = tuple(sorted({i for _, head, _ in loaded for i in head.config.feature_layers}))
    heldout = heldout_features(target, tokenizer, per_kind, new_tokens, feature_layers=layers)
    frozen_float(target)
    embed = target.get_input_embeddings()
    d = target.config.hidden_size
    out = {}
    for folder, head, vocab in loaded:
        to_draft, lm_weight = draft_lm_head(target, vocab)
        # each head reads its own layers of the features computed for all of them, and the top one
        columns = [c for i in head.config.feature_layers for c in range(layers.index(i) * d, (layers.index(i) + 1) * d)]
        columns += list(range(len(layers) * d, (len(layers) + 1) * d))
        out[str(folder)] = {kind: agreement(head, embed, lm_weight, to_draft,
                                            [replace(f, features=f.features[:, columns]) for f in seqs], best_of)
                            for kind, seqs in heldout.items()}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("zoo"), help="zoo folder to write the head into")
    parser.add_argument("--name", default="smollm2-eagle", help="the head's folder in --out (its zoo name)")
    parser.add_argument("--feature-layers", type=int, nargs="+", default=[], metavar="I",
                        help="a multi-layer head (EAGLE-3): SmolLM2's hidden_states indices it reads besides the top "
                             "feature, e.g. 2 15; with --init, the saved one-layer head widened")
    parser.add_argument("--files", nargs="+", metavar="GLOB",
                        help="train on the data files matching these patterns only (default: all)")
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
                           args.sampled_minutes, args.instruct_minutes, tuple(args.feature_layers), args.files,
                           args.name), indent=2))


if __name__ == "__main__":
    main()
