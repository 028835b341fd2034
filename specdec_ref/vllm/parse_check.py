"""Ask vLLM itself how it reads a speculative config or a ``vllm serve`` command line.

vLLM checks ``--speculative-config`` in two steps: its command-line parser only decodes the
JSON, and :class:`vllm.config.SpeculativeConfig` (a pydantic dataclass: unknown keys, a
method it does not know or k < 1 are errors) resolves it when the engine is configured, e.g.
an n-gram config without bounds gets 5 and 5, a bound given alone is copied to the other.
:func:`vllm_readings` runs both in the course's vLLM environment, in one subprocess, without
starting a server or loading weights (a draft's ``config.json`` is read, so drafts must be
local folders here), and returns what vLLM made of each input.

Where vLLM is not installed, :func:`course_config_reading` and :func:`course_argv_reading`
give the same readings by the rules of vLLM 0.32 that matter for speculation (the fields
below, the removed flags), so that a check gives the same verdict with or without vLLM.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..paths import cache_root, sha256_file
from .command import REMOVED_FLAGS
from .server import course_vllm_venv

#: The parts of a speculative config a reading reports.
CONFIG_FIELDS = ("method", "model", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max")
#: The parts of a ``vllm serve`` command line a reading reports.
ARGV_FIELDS = ("model_tag", "host", "port", "speculative_config", "spec_method", "spec_model", "spec_tokens")

# Runs in vLLM's environment: a JSON request on stdin, the readings after a marker on stdout
# (vLLM logs to stdout too).
_SCRIPT = r"""
import contextlib, io, json, sys
request = json.load(sys.stdin)

def short(error):
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text[:240]}"

configs, argvs = [], []
if request["configs"]:  # each import costs seconds: only what is asked
    from vllm.config import ModelConfig, ParallelConfig, SpeculativeConfig
    target = ModelConfig(model=request["target_model"], dtype="float32")
    parallel = ParallelConfig()
for config in request["configs"]:
    try:
        if not isinstance(config, dict):
            raise TypeError("the speculative config is not a JSON object")
        spec = SpeculativeConfig(**config, target_model_config=target, target_parallel_config=parallel)
        configs.append({"ok": True, "read": {f: getattr(spec, f) for f in request["config_fields"]}})
    except Exception as error:
        configs.append({"ok": False, "error": short(error)})
if request["argvs"]:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
for argv in request["argvs"]:
    messages = io.StringIO()
    try:
        with contextlib.redirect_stderr(messages):
            namespace = parser.parse_args(argv)
        argvs.append({"ok": True, "read": {f: getattr(namespace, f, None) for f in request["argv_fields"]}})
    except SystemExit:
        lines = messages.getvalue().strip().splitlines()
        argvs.append({"ok": False, "error": lines[-1] if lines else "vLLM's parser refused it"})
    except Exception as error:
        argvs.append({"ok": False, "error": short(error)})
print("SPECDEC-READINGS " + json.dumps({"configs": configs, "argvs": argvs}), flush=True)
"""
_MARKER = "SPECDEC-READINGS "


class VLLMUnavailable(RuntimeError):
    """vLLM's environment is missing, or did not answer (the message says which)."""


def course_vllm_python() -> Path:
    """The interpreter of the course's vLLM environment (:func:`~specdec_ref.vllm.server.course_vllm_venv`)."""
    return course_vllm_venv() / "bin" / "python"


def vllm_readings(
    configs: Sequence[Any],
    argvs: Sequence[Sequence[str]],
    *,
    target_model: str | os.PathLike[str],
    python: str | os.PathLike[str] | None = None,
    timeout: float = 120.0,
    cache: bool = True,
) -> dict[str, list[dict[str, Any]]]:
    """vLLM's reading of each speculative config and each ``vllm serve`` argument list.

    Args:
        configs: speculative configs (dicts as ``--speculative-config`` carries them).
        argvs: command lines after ``vllm serve`` (``argv[2:]`` of ``["vllm", "serve", ...]``).
        target_model: a local model folder, the target the configs are built for.
        python: vLLM's interpreter; :func:`course_vllm_python` when None.
        timeout: seconds before giving up on the subprocess.
        cache: keep each input's reading in the course cache (``vllm_readings/`` under
            :func:`~specdec_ref.paths.cache_root`), keyed by the input, the target's and any local
            draft's ``config.json`` and the installed vLLM, and read it back instead of asking vLLM
            again: a class's notebooks hand in the same configs many times, and each vLLM start
            costs seconds. Only inputs not read before start vLLM.

    Returns:
        ``{"configs": [...], "argvs": [...]}``, one entry per input: ``{"ok": True, "read":
        {field: value}}`` (fields :data:`CONFIG_FIELDS` / :data:`ARGV_FIELDS`) or ``{"ok":
        False, "error": "..."}`` with vLLM's reason.

    Raises:
        VLLMUnavailable: no such interpreter, or the subprocess failed or timed out.
    """
    python = Path(python) if python is not None else course_vllm_python()
    if not python.exists():
        raise VLLMUnavailable(f"vLLM's CPU build is not installed ({python} does not exist)")
    inputs = [("configs", config) for config in configs] + [("argvs", list(argv)) for argv in argvs]
    stamp = _installation_stamp(python, target_model)
    keys = [_reading_key(kind, item, stamp) for kind, item in inputs]
    folder = cache_root() / "vllm_readings"
    known = {key: json.loads((folder / f"{key}.json").read_text()) for key in keys
             if cache and (folder / f"{key}.json").exists()}
    missing = [(kind, item, key) for (kind, item), key in zip(inputs, keys) if key not in known]
    if missing:
        asked = _ask_vllm([item for kind, item, _ in missing if kind == "configs"],
                          [item for kind, item, _ in missing if kind == "argvs"], target_model, python, timeout)
        answers = {"configs": iter(asked["configs"]), "argvs": iter(asked["argvs"])}
        for kind, _, key in missing:
            known[key] = next(answers[kind])
            if cache:
                folder.mkdir(parents=True, exist_ok=True)
                temporary = folder / f"{key}.{os.getpid()}.tmp"
                temporary.write_text(json.dumps(known[key]))
                temporary.replace(folder / f"{key}.json")  # whole or absent, for a reader beside
    readings: dict[str, list[dict[str, Any]]] = {"configs": [], "argvs": []}
    for (kind, _), key in zip(inputs, keys):
        readings[kind].append(known[key])
    return readings


def _installation_stamp(python: Path, target_model: str | os.PathLike[str]) -> str:
    """What a reading depends on besides its input: the vLLM installed beside ``python`` (its
    package's modification time) and the target's ``config.json``."""
    packages = sorted(python.parent.parent.glob("lib/python*/site-packages/vllm/__init__.py"))
    installed = str(packages[0].stat().st_mtime_ns) if packages else str(python.resolve())
    return installed + ":" + _config_digest(target_model)


def _config_digest(folder: Any) -> str:
    """The sha256 of a local model folder's ``config.json``, "" for anything else."""
    try:
        config = Path(folder) / "config.json"
        return sha256_file(config) if config.is_file() else ""
    except (TypeError, ValueError, OSError):
        return ""


def _reading_key(kind: str, item: Any, stamp: str) -> str:
    drafts = [_config_digest(item.get("model"))] if isinstance(item, dict) else []
    text = json.dumps([kind, item, stamp, drafts], sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _ask_vllm(configs: list[Any], argvs: list[list[str]], target_model: str | os.PathLike[str], python: Path,
              timeout: float) -> dict[str, list[dict[str, Any]]]:
    """Run the reading script in vLLM's environment (one subprocess for all inputs)."""
    request = {"configs": configs, "argvs": argvs, "target_model": str(target_model),
               "config_fields": CONFIG_FIELDS, "argv_fields": ARGV_FIELDS}
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "ERROR", "TOKENIZERS_PARALLELISM": "false"}
    try:
        done = subprocess.run([str(python), "-c", _SCRIPT], input=json.dumps(request), stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise VLLMUnavailable(f"vLLM did not answer within {timeout:g} s") from None
    lines = [line for line in done.stdout.splitlines() if line.startswith(_MARKER)]
    if done.returncode != 0 or not lines:
        raise VLLMUnavailable(f"vLLM's parser failed to run (exit code {done.returncode})")
    return json.loads(lines[-1][len(_MARKER):])


# --- the same readings without vLLM (the rules of vLLM 0.32 for these fields) ------------------

#: Methods vLLM 0.32 accepts in a speculative config (``SpeculativeMethod``), the MTP variants aside.
VLLM_METHODS = ("ngram", "medusa", "mlp_speculator", "draft_model", "suffix", "custom_class", "eagle", "eagle3",
                "extract_hidden_states", "mtp", "ngram_gpu", "dflash", "dspark")
# Keys of SpeculativeConfig that a config for these methods may carry without changing the fields read.
_OTHER_KEYS = {"enforce_eager", "draft_tensor_parallel_size", "quantization", "max_model_len", "revision",
               "code_revision", "disable_padded_drafter_batch", "parallel_drafting", "draft_sample_method",
               "rejection_sample_method"}


def course_config_reading(config: Any) -> dict[str, Any]:
    """What vLLM 0.32's ``SpeculativeConfig`` reads from ``config``, in the fields :data:`CONFIG_FIELDS`.

    Raises:
        ValueError: where vLLM raises (unknown key, unknown method, k missing or < 1, a bound
            < 1 or min > max, a model-based method without a model).
    """
    if not isinstance(config, dict):
        raise ValueError("the speculative config is not a JSON object")
    unknown = sorted(set(config) - set(CONFIG_FIELDS) - _OTHER_KEYS)
    if unknown:
        raise ValueError(f"unexpected keyword argument(s) {unknown}")
    method, model = config.get("method"), config.get("model")
    k = config.get("num_speculative_tokens")
    low, high = config.get("prompt_lookup_min"), config.get("prompt_lookup_max")
    if method is None:
        method = "ngram" if model == "ngram" else "draft_model"
    if method not in VLLM_METHODS:
        raise ValueError(f"method {method!r} is not one vLLM knows")
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"num_speculative_tokens must be an integer > 0, got {k!r}")
    for bound in (low, high):
        if bound is not None and (not isinstance(bound, int) or bound < 1):
            raise ValueError(f"prompt lookup bounds must be integers >= 1, got {bound!r}")
    if method == "ngram":
        model = "ngram" if model is None else model
        if low is None and high is None:
            low = high = 5
        low, high = (high if low is None else low), (low if high is None else high)
        if low > high:
            raise ValueError(f"prompt_lookup_min={low} must be <= prompt_lookup_max={high}")
    else:
        if model is None:
            raise ValueError("num_speculative_tokens was provided but without speculative model")
        low = high = 0
    return {"method": method, "model": model, "num_speculative_tokens": k,
            "prompt_lookup_min": low, "prompt_lookup_max": high}


_ARGV_FLAGS = {"--host": "host", "--port": "port", "--speculative-config": "speculative_config",
               "-sc": "speculative_config", "--spec-method": "spec_method", "--spec-model": "spec_model",
               "--spec-tokens": "spec_tokens"}


def course_argv_reading(argv: Any) -> dict[str, Any]:
    """What vLLM 0.32's ``vllm serve`` parser reads from ``argv`` (the arguments after
    ``vllm serve``), in the fields :data:`ARGV_FIELDS`. Other flags are skipped, with the
    next argument when it is not a flag itself.

    Raises:
        ValueError: where vLLM's parser stops: an argument that is not a string, a removed
            flag, a flag without its value, a port that is not an integer, a
            ``--speculative-config`` that is not JSON, a second positional argument.
    """
    if not isinstance(argv, (list, tuple)) or not all(isinstance(arg, str) for arg in argv):
        raise ValueError("every argument of a command line is a string")
    read: dict[str, Any] = dict.fromkeys(ARGV_FIELDS)
    args, i = list(argv), 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("-"):
            if read["model_tag"] is not None:
                raise ValueError(f"unrecognized arguments: {arg}")
            read["model_tag"] = arg
            i += 1
            continue
        flag, has_value, value = arg.partition("=")
        flag = "--" + flag[2:].replace("_", "-") if flag.startswith("--") else flag
        if flag.split(".")[0] in REMOVED_FLAGS:
            raise ValueError(f"unrecognized arguments: {arg}")
        takes_value = not has_value and i + 1 < len(args) and not args[i + 1].startswith("-")
        if not has_value:
            value = args[i + 1] if takes_value else None
        i += 2 if takes_value else 1
        field = _ARGV_FLAGS.get(flag)
        if field is None:
            continue
        if value is None:
            raise ValueError(f"argument {flag}: expected one argument")
        if field == "port":
            try:
                value = int(value)
            except ValueError:
                raise ValueError(f"argument --port: invalid int value: {value!r}") from None
        elif field == "speculative_config":
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                raise ValueError(f"argument --speculative-config: invalid loads value: {value!r}") from None
        elif field == "spec_tokens":
            value = int(value)
        read[field] = value
    if read["port"] is None:
        read["port"] = 8000
    return read
