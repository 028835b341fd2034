"""The course model zoo: the training recipe, the resolver/loader, and the shipped models."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from specdec_ref.zoo import EAGLE_HEADS, NAMES, RECIPE_NAMES, ZOO_DIR, load, load_tokenizer, resolve, resolve_tokenizer
from specdec_ref.zoo import corpus
from specdec_ref.zoo.corpus import (build_corpus, cached_corpus, corpus_cache_key, heldout_prompts, is_test_file,
                                    load_or_build_corpus)
from specdec_ref.recipes.evaluate import evaluate
from specdec_ref.recipes.train import native_bf16, topk_distill_loss, training_autocast
from specdec_ref.stats import loop_period

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_zoo(tmp_path_factory) -> Path:
    """The full recipe, run as a user would, on the tiny budget (a few steps, tiny sizes)."""
    out = tmp_path_factory.mktemp("zoo") / "zoo"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-m", "specdec_ref.recipes.train", "--out", str(out), "--budget", "tiny"],
                   cwd=REPO, env=env, check=True, timeout=300)
    return out


def test_evaluation_runs_every_drafter_on_the_tiny_zoo(tiny_zoo: Path) -> None:
    res = evaluate(tiny_zoo, n_prompts=2, k=3, new_tokens=12, min_confidence=0.5)
    for name in ("draft", "xtok", "draft_dynamic", "xtok_dynamic"):
        assert res[f"{name}_equals_target_greedy"] == "2/2"
        assert 0 <= res[f"{name}_acceptance"] <= res[f"{name}_acceptance_probability"] <= 1
    assert res["draft_drafted_per_iteration"] <= 3 and res["draft_dynamic_drafted_per_iteration"] <= 3
    assert len(res["samples"]) == 2 and res["min_confidence"] == 0.5


@pytest.mark.slow
def test_tiny_recipe_output_loads_with_transformers(tiny_zoo: Path) -> None:
    for name in ("target", "draft", "draft-xtok"):
        model = AutoModelForCausalLM.from_pretrained(tiny_zoo / name)
        tok = AutoTokenizer.from_pretrained(tiny_zoo / name)
        ids = tok("def f(x):\n    return x\n", return_tensors="pt").input_ids
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, do_sample=False)
        assert out.shape[1] == ids.shape[1] + 3 or tok.eos_token_id in out[0].tolist()
        assert model.config.eos_token_id == tok.eos_token_id == tok.convert_tokens_to_ids("<|endoftext|>")
        assert model.generation_config.pad_token_id == tok.pad_token_id
    info = json.loads((tiny_zoo / "manifest.json").read_text())
    assert info["target"]["steps"] == 4 and info["draft"]["steps"] == 3
    # the last stage: both drafts fine-tuned on the target's greedy continuations
    assert info["greedy"]["sequences"] > 0 and info["greedy"]["generated_tokens"] > 0
    assert info["draft-tune"]["steps"] == 3 and info["xtok-tune"]["steps"] == 3
    assert len(info["corpus"]["sha256"]) == 64
    assert "draft/model.safetensors" in info["files"]
    assert not any(f.startswith("_work") for f in info["files"])  # checkpoints are not shipped


@pytest.mark.slow
def test_tiny_recipe_output_loads_with_zoo_loader(tiny_zoo: Path) -> None:
    for name in RECIPE_NAMES:
        model, tok = load(f"zoo:{name}", zoo_dir=tiny_zoo)
        assert next(model.parameters()).dtype == torch.float32  # stored bf16, upcast
        assert not model.training
        assert tok.eos_token == "<|endoftext|>"
    model, _ = load("zoo:draft", dtype=torch.bfloat16, zoo_dir=tiny_zoo)
    assert next(model.parameters()).dtype == torch.bfloat16


@pytest.mark.slow
def test_checksum_mismatch_is_reported(tiny_zoo: Path, tmp_path: Path) -> None:
    zoo = tmp_path / "zoo"
    shutil.copytree(tiny_zoo, zoo)
    weights = zoo / "draft" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # flip bits in the last tensor byte: the file still parses
    weights.write_bytes(bytes(data))
    with pytest.raises(RuntimeError, match="checksum mismatch.*draft/model.safetensors"):
        load("zoo:draft", zoo_dir=zoo)
    load("zoo:target", zoo_dir=zoo)  # other entries are unaffected


def test_resolver(tmp_path: Path) -> None:
    assert resolve("zoo:target") == str(ZOO_DIR / "target")
    assert resolve("zoo:target-chat") == str(ZOO_DIR / "target")  # same weights ...
    assert resolve_tokenizer("zoo:target-chat") == str(ZOO_DIR / "chat" / "target-chat")  # ... own template
    assert resolve(str(tmp_path)) == str(tmp_path)
    assert resolve("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"  # Hub ids pass through unchanged
    with pytest.raises(ValueError, match="zoo:draft-xtok"):  # the message lists the valid names
        resolve("zoo:nope")
    with pytest.raises(FileNotFoundError, match="specdec_ref.recipes.train"):  # says how to rebuild
        resolve("zoo:target", zoo_dir=tmp_path)
    with pytest.raises(FileNotFoundError):
        load_tokenizer("zoo:draft-chat", zoo_dir=tmp_path)


def test_corpus_is_deterministic_and_split_by_file() -> None:
    # a build here against the course cache's copy (built by whichever process asked first)
    a, b = build_corpus(), cached_corpus()
    assert a.sha256 == b.sha256 and a == b
    assert not set(a.train) & set(a.heldout)
    assert not any(name.startswith("encodings/") for name in a.train)  # generated codec tables
    assert any(is_test_file(name) for name in a.train)  # the stdlib's own tests are training text
    assert "lib2to3/tests/data/py2_test_grammar.py" not in a.train  # Python 2: does not parse
    prompts = heldout_prompts(20, a)
    assert prompts == heldout_prompts(20, b)
    assert all(100 <= len(p) <= 400 and not p.endswith("\n") for p in prompts)
    library_text = "".join(text for name, text in a.heldout.items() if not is_test_file(name))
    assert all(p in library_text for p in prompts)  # held-out library code, not tests


def test_the_corpus_is_kept_on_disk_and_built_again_only_when_needed(tmp_path, monkeypatch) -> None:
    builds = []

    def small_build():  # the cache does not look inside the corpus: a 40-file build keeps this test short
        builds.append(1)
        return build_corpus(max_files=40)

    monkeypatch.setattr(corpus, "build_corpus", small_build)
    built = load_or_build_corpus(tmp_path / "cache")
    stored = list((tmp_path / "cache").iterdir())
    assert len(builds) == 1 and [p.name for p in stored] == [f"stdlib-{corpus_cache_key()}.json"]
    assert load_or_build_corpus(tmp_path / "cache") == built and len(builds) == 1  # read back, not built
    stored[0].write_text('{"train": {')  # a damaged file (e.g. a full disk) is built again and replaced
    assert load_or_build_corpus(tmp_path / "cache") == built and len(builds) == 2
    assert load_or_build_corpus(tmp_path / "cache") == built and len(builds) == 2
    (tmp_path / "a file").write_text("")  # a folder that cannot be made: built, nothing stored, no error
    assert load_or_build_corpus(tmp_path / "a file" / "cache") == built and len(builds) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a file", "cache"]  # and no partial file left
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [stored[0].name]


def test_the_corpus_cache_key_follows_the_files_the_corpus_reads(tmp_path) -> None:
    (tmp_path / "json").mkdir()
    (tmp_path / "site-packages").mkdir()
    (tmp_path / "json" / "decoder.py").write_text("x = 1\n")
    key = corpus_cache_key(tmp_path)
    (tmp_path / "site-packages" / "numpy.py").write_text("y = 2\n")  # not read by the corpus
    assert corpus_cache_key(tmp_path) == key
    (tmp_path / "json" / "decoder.py").write_text("x = 10\n")
    changed = corpus_cache_key(tmp_path)
    assert changed != key
    (tmp_path / "json" / "scanner.py").write_text("z = 3\n")
    assert corpus_cache_key(tmp_path) not in (key, changed)


def test_shipped_zoo_has_declared_properties() -> None:
    models = {name: load(f"zoo:{name}") for name in NAMES if name not in EAGLE_HEADS}
    params = {name: sum(p.numel() for p in m.parameters()) for name, (m, _) in models.items()}
    assert 20e6 <= params["target"] <= 60e6
    assert params["draft"] <= params["target"] / 15
    assert params["draft-xtok"] <= params["target"] / 15
    for model, _ in models.values():
        cfg = model.config
        assert cfg.model_type == "llama"
        assert cfg.hidden_size // cfg.num_attention_heads >= 32  # vLLM CPU attention needs it

    tok_t, tok_d, tok_x = (models[n][1] for n in ("target", "draft", "draft-xtok"))
    assert tok_t.get_vocab() == tok_d.get_vocab()
    assert models["target"][0].config.vocab_size == models["draft"][0].config.vocab_size
    assert len(tok_x) != len(tok_t)
    assert tok_x.tokenize("    return x\n") != tok_t.tokenize("    return x\n")

    # Chat variants: the same weights, tokenizers that differ only in chat_template
    chat_t, chat_d = models["target-chat"][1], models["draft-chat"][1]
    for chat in (chat_t, chat_d):
        assert chat.backend_tokenizer.to_str() == tok_t.backend_tokenizer.to_str()
        assert chat.special_tokens_map == tok_t.special_tokens_map
    assert tok_t.chat_template is None
    assert chat_t.chat_template and chat_d.chat_template and chat_t.chat_template != chat_d.chat_template
    msgs = [{"role": "user", "content": "hi"}]
    assert chat_t.apply_chat_template(msgs, tokenize=False) != chat_d.apply_chat_template(msgs, tokenize=False)
    assert resolve("zoo:draft-chat") == resolve("zoo:draft")
    for (a, _), (b, _) in ((models["target"], models["target-chat"]), (models["draft"], models["draft-chat"])):
        assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))

    sizes = {f.relative_to(ZOO_DIR).parts[0]: f.stat().st_size for f in ZOO_DIR.rglob("*.safetensors")}
    real_drafts = ("smollm2-draft", "smollm2-eagle")
    assert sum(size for name, size in sizes.items() if name not in real_drafts) <= 60e6  # the course models
    assert sizes["smollm2-draft"] <= 60e6  # the real pair's draft: at most 60 MB more
    assert sizes["smollm2-eagle"] <= 20e6  # its EAGLE head, bfloat16


def test_loop_period_is_measured_on_text():
    assert loop_period("x = 1\n" * 40) == 6
    assert loop_period("def f():\n" + "    if x:\n        x = x\n" * 12) == 24  # a two-line loop
    assert loop_period("ab" * 40) is None  # too short to judge
    fresh = "".join(f"value_{i} = compute({i}, {i * i})\n" for i in range(20))
    assert loop_period(fresh) is None


def test_topk_distillation_is_cross_entropy_to_the_teachers_distribution():
    from factories import build

    teacher, other = build("llama", 32, 1, seed=0, vocab=16), build("llama", 32, 1, seed=1, vocab=16)
    ids, prompt_len = torch.tensor([1, 5, 7, 3, 9, 4]), 3
    with torch.no_grad():
        logp = teacher(ids[None]).logits[0].log_softmax(-1)[prompt_len - 1:-1]  # predicts ids[3:]
    top = logp.topk(16)  # the whole vocabulary: nothing is cut off
    record = {"ids": ids, "prompt_len": prompt_len, "top_ids": top.indices.short(), "top_logp": top.values.half()}
    entropy = -(logp.exp() * logp).sum(-1).mean()
    with torch.no_grad():
        assert topk_distill_loss(teacher, pad=0)([record]).item() == pytest.approx(entropy.item(), abs=1e-2)
        # Gibbs: any other student pays the KL divergence on top of the entropy
        assert topk_distill_loss(other, pad=0)([record]).item() > entropy.item() + 0.05


def test_training_uses_bf16_only_where_the_cpu_has_it() -> None:
    """Emulated bf16 matmuls are several times slower than float32, so a timed budget
    trains in bf16 only on CPUs with AVX512-BF16 or AMX, as the kernel reports them."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        flags = set(cpuinfo.read_text().split())
        assert native_bf16() == bool(flags & {"avx512_bf16", "amx_bf16"})
    layer = torch.nn.Linear(8, 8)
    with training_autocast():
        out = layer(torch.randn(2, 8))
    assert out.dtype == (torch.bfloat16 if native_bf16() else torch.float32)
