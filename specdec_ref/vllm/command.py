"""The ``vllm serve`` command line for each speculative method.

vLLM takes every speculation setting in one JSON option, ``--speculative-config``.
The course's source text shows a ``--draft-model`` flag: vLLM never had one, and
the older ``--speculative-model`` / ``--num-speculative-tokens`` flags are gone.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: Speculative methods :func:`serve_command` knows, with whether each needs a
#: draft checkpoint (``True``), may take one (``None``) or takes none (``False``).
SPECULATIVE_METHODS: dict[str, bool | None] = {
    "draft_model": True,  # a small model with the target's tokenizer
    "eagle": True,  # an EAGLE head trained on the target's hidden states
    "eagle3": True,
    "mtp": None,  # the target's own multi-token-prediction layers; some families ship them separately
    "ngram": False,  # prompt lookup: drafts come from the context itself
}

# Options serve_command writes itself; repeating them in extra_args would leave
# two values on the command line and vLLM silently keeps the last one.
_MANAGED_FLAGS = {
    "--model", "--host", "--port", "--tensor-parallel-size", "-tp", "--max-model-len",
    "--dtype", "--api-key", "--speculative-config", "-sc", "--tokenizer",
    # vLLM 0.32's shorthands for keys of --speculative-config: giving a key
    # both ways is an error there.
    "--spec-method", "--spec-model", "--spec-tokens",
}
# Flags from older vLLM releases and from the course's source text that no
# longer exist: name the replacement instead of letting vLLM reject them.
REMOVED_FLAGS = {
    "--draft-model": "vLLM has no --draft-model flag",
    "--speculative-model": "--speculative-model was removed from vLLM",
    "--num-speculative-tokens": "--num-speculative-tokens was removed from vLLM",
    "--ngram-prompt-lookup-max": "--ngram-prompt-lookup-max was removed from vLLM",
    "--ngram-prompt-lookup-min": "--ngram-prompt-lookup-min was removed from vLLM",
}


def resolve_model(name: str) -> str:
    """Turn a model name into what vLLM should load.

    ``zoo:<name>`` names go through :func:`specdec_ref.zoo.resolve` (imported
    only then: it loads torch and transformers); every other name, a Hub id or
    a local path, is returned unchanged.
    """
    if not name.startswith("zoo:"):
        return name
    from specdec_ref import zoo

    return str(zoo.resolve(name))


def _zoo_tokenizer(name: str) -> str | None:
    """The tokenizer folder of a zoo model whose tokenizer lives apart from its
    weights (the chat variants), else None."""
    if not name.startswith("zoo:"):
        return None
    from specdec_ref import zoo

    tokenizer = str(zoo.resolve_tokenizer(name))
    return None if tokenizer == str(zoo.resolve(name)) else tokenizer


def _local_config(name: str) -> dict | None:
    """The ``config.json`` of a zoo model or a local folder as a dict; None for a Hub id that
    is not on disk, or a folder without one."""
    try:
        return json.loads((Path(resolve_model(name)) / "config.json").read_text())
    except (OSError, ValueError):
        return None


def _is_eagle_head(folder: str, config: dict | None) -> bool | None:
    """True for an EAGLE head, False for a full causal LM, None where it cannot be told from the
    files (a Hub id not on disk, or a one-layer model, the shape of other projects' EAGLE heads)."""
    if config is None:
        return None
    architectures = " ".join(config.get("architectures") or []).lower()
    if "specdec_eagle" in config or "eagle" in architectures or (Path(folder) / "draft_vocab.json").is_file():
        return True
    layers = config.get("num_hidden_layers")
    if isinstance(layers, int) and layers > 1 and architectures.endswith("forcausallm") and "speculator" not in architectures:
        return False
    return None


def _shape(config: dict) -> str:
    return f"hidden size {config['hidden_size']} and {config['vocab_size']} tokens"


def check_draft(method: str, draft: str, target: str) -> None:
    """Raise ``ValueError``, in one sentence, when ``draft`` is the wrong kind of checkpoint for
    ``method`` or an EAGLE head trained for another model than ``target``: a causal LM given to
    ``eagle``/``eagle3``, an EAGLE head given to ``draft_model``, the course's multi-layer head
    (its layout is not vLLM's ``eagle3``), a head whose target's shapes
    (``hidden_size``, ``vocab_size`` in its ``config.json``) are not ``target``'s. Zoo names and
    local folders are checked from their files; Hub ids that are not on disk are not checked."""
    if method not in ("draft_model", "eagle", "eagle3"):
        return
    if draft.startswith("zoo:"):
        from specdec_ref import zoo

        if draft[len("zoo:"):] not in zoo.NAMES:
            resolve_model(draft)  # raises, listing the zoo's names
        config = None  # read only when needed: resolving zoo:smollm2 may convert it first
        head = zoo.is_eagle_head(draft)
        heads = ", ".join("zoo:" + name for name in zoo.EAGLE_HEADS)
    else:
        config = _local_config(draft)
        head = _is_eagle_head(draft, config)
        heads = None
    if method == "draft_model" and head:
        raise ValueError(f"{draft} is an EAGLE head, not a draft model: serve it with method='eagle', which "
                         "feeds it the target's features")
    if method == "draft_model":
        return
    if head is False:
        raise ValueError(f"{draft} is a causal LM, not an EAGLE head: method={method!r} takes a head trained on "
                         "the target's features" + (f" (the zoo has {heads})" if heads else "")
                         + ", and a full draft model goes with method='draft_model'")
    if head:
        head_config = config if config is not None else _local_config(draft)
        layers = ((head_config or {}).get("specdec_eagle") or {}).get("feature_layers")
        if layers:
            raise ValueError(f"{draft} is the course's multi-layer EAGLE head (it reads the target's layers {layers} "
                             "besides the last), a layout neither of vLLM's eagle methods loads: serve a one-layer "
                             "head such as zoo:smollm2-eagle with method='eagle'")
        target_config = _local_config(target)
        keys = ("hidden_size", "vocab_size")
        if head_config is None or target_config is None or not all(
                isinstance(c.get(key), int) for c in (head_config, target_config) for key in keys):
            return
        if any(head_config[key] != target_config[key] for key in keys):
            raise ValueError(f"{draft} is an EAGLE head for a target with {_shape(head_config)}, and {target} "
                             f"has {_shape(target_config)}: a head drafts only for the model it was trained on")


def speculative_config(
    method: str,
    *,
    draft: str | None = None,
    num_speculative_tokens: int = 5,
    prompt_lookup_min: int | None = None,
    prompt_lookup_max: int | None = None,
) -> dict[str, Any]:
    """The ``--speculative-config`` dictionary for ``method``, validated.

    ``draft`` is passed as given, ``zoo:`` names included, and only its presence is
    checked: :func:`serve_command` resolves ``zoo:`` names to their folders and checks the
    draft against the method and the target (:func:`check_draft`).  For ``ngram``,
    vLLM uses 5 for a missing bound when both are missing and copies the other
    bound when one is; we pass only what the caller set.

    Raises:
        ValueError: unknown method, missing or unexpected draft, k < 1, or bad
            n-gram bounds.
    """
    if method not in SPECULATIVE_METHODS:
        known = ", ".join(SPECULATIVE_METHODS)
        raise ValueError(f"unknown speculative method {method!r}; expected one of: {known}")
    if isinstance(num_speculative_tokens, bool) or not isinstance(num_speculative_tokens, int):
        raise ValueError(f"num_speculative_tokens must be an int, got {num_speculative_tokens!r}")
    if num_speculative_tokens < 1:
        raise ValueError(f"num_speculative_tokens must be >= 1, got {num_speculative_tokens}")

    needs_draft = SPECULATIVE_METHODS[method]
    if needs_draft and not draft:
        raise ValueError(f"method {method!r} needs a draft checkpoint: pass draft=...")
    if needs_draft is False and draft is not None:
        raise ValueError(f"method {method!r} drafts from the context and takes no draft model")

    lookup = {"prompt_lookup_min": prompt_lookup_min, "prompt_lookup_max": prompt_lookup_max}
    if method != "ngram":
        given = [key for key, value in lookup.items() if value is not None]
        if given:
            raise ValueError(f"{', '.join(given)} only apply to method 'ngram', not {method!r}")
    for key, value in lookup.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{key} must be an int >= 1, got {value!r}")
    if prompt_lookup_min is not None and prompt_lookup_max is not None and prompt_lookup_min > prompt_lookup_max:
        raise ValueError(
            f"prompt_lookup_min ({prompt_lookup_min}) must be <= prompt_lookup_max ({prompt_lookup_max})"
        )

    config: dict[str, Any] = {"method": method}
    if draft is not None:
        config["model"] = draft
    config["num_speculative_tokens"] = num_speculative_tokens
    config.update({key: value for key, value in lookup.items() if value is not None})
    return config


def serve_command(
    target: str,
    *,
    method: str | None = "draft_model",
    draft: str | None = None,
    num_speculative_tokens: int = 5,
    host: str = "127.0.0.1",
    port: int = 8000,
    tensor_parallel_size: int = 1,
    max_model_len: int | None = None,
    dtype: str | None = None,
    api_key: str | None = None,
    prompt_lookup_min: int | None = None,
    prompt_lookup_max: int | None = None,
    extra_args: Sequence[str] = (),
    launcher: Sequence[str] | None = None,
) -> list[str]:
    """The argument list that starts a vLLM OpenAI-compatible server.

    Args:
        target: the model to serve: Hub id, local directory or ``zoo:`` name
            (a zoo chat variant also gets ``--tokenizer``, its tokenizer folder).
        method: ``"draft_model"``, ``"ngram"``, ``"eagle"``, ``"eagle3"``,
            ``"mtp"``, or ``None`` for a server without speculation (the baseline).
        draft: the draft checkpoint (required for draft_model/eagle/eagle3,
            optional for mtp, not allowed for ngram).
        num_speculative_tokens: k, tokens drafted per step (>= 1).
        host: interface to bind. vLLM itself binds every interface by default;
            we default to loopback and always write the flag.
        port: TCP port.
        tensor_parallel_size: GPUs per model replica; written when not 1.
        max_model_len: context length cap (saves KV-cache memory).
        dtype: e.g. ``"float32"`` or ``"bfloat16"``; vLLM's ``auto`` when None.
        api_key: require ``Authorization: Bearer <api_key>`` on ``/v1`` routes.
            It appears in the process list; prefer the ``VLLM_API_KEY``
            environment variable on shared machines.
        prompt_lookup_min, prompt_lookup_max: n-gram lengths for ``ngram``.
        extra_args: further vLLM options, appended verbatim.
        launcher: the program that starts the server, e.g.
            ``[".venv-vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server"]``;
            the model is then passed as ``--model``.  ``None`` gives ``vllm serve``.

    Returns:
        The argument list, ready for :class:`subprocess.Popen` or ``shlex.join``.

    Raises:
        ValueError: invalid settings (see :func:`speculative_config`), a draft
            of the wrong kind for ``method`` or an EAGLE head for another target
            (see :func:`check_draft`), or ``extra_args`` repeating an option this
            function writes or using a flag vLLM no longer has.
    """
    if not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"port must be in 1..65535, got {port!r}")
    if not isinstance(tensor_parallel_size, int) or tensor_parallel_size < 1:
        raise ValueError(f"tensor_parallel_size must be an int >= 1, got {tensor_parallel_size!r}")
    if max_model_len is not None and (not isinstance(max_model_len, int) or max_model_len < 1):
        raise ValueError(f"max_model_len must be an int >= 1, got {max_model_len!r}")
    _check_extra_args(extra_args)

    if method is None:
        if draft is not None or prompt_lookup_min is not None or prompt_lookup_max is not None:
            raise ValueError("draft and prompt_lookup_* need a speculative method; method is None")
        spec = None
    else:
        spec = speculative_config(
            method,
            draft=draft,
            num_speculative_tokens=num_speculative_tokens,
            prompt_lookup_min=prompt_lookup_min,
            prompt_lookup_max=prompt_lookup_max,
        )
        if draft is not None:
            check_draft(method, draft, target)
            spec["model"] = resolve_model(draft)

    model = resolve_model(target)
    tokenizer = _zoo_tokenizer(target)
    if launcher is None:
        command = ["vllm", "serve", model]
    else:
        command = [*launcher, "--model", model]
    if tokenizer is not None:
        command += ["--tokenizer", tokenizer]
    command += ["--host", host, "--port", str(port)]
    if tensor_parallel_size != 1:
        command += ["--tensor-parallel-size", str(tensor_parallel_size)]
    if max_model_len is not None:
        command += ["--max-model-len", str(max_model_len)]
    if dtype is not None:
        command += ["--dtype", dtype]
    if api_key is not None:
        command += ["--api-key", api_key]
    if spec is not None:
        command += ["--speculative-config", json.dumps(spec)]
    command += list(extra_args)
    return command


def _check_extra_args(extra_args: Sequence[str]) -> None:
    if isinstance(extra_args, str):
        raise ValueError("extra_args must be a sequence of arguments, not one string")
    for arg in extra_args:
        # vLLM accepts --flag_name as --flag-name, --flag=value, and one key of
        # a JSON option as --option.key.
        flag = arg.split("=", 1)[0].split(".", 1)[0].replace("_", "-")
        if flag in REMOVED_FLAGS:
            raise ValueError(
                f"{REMOVED_FLAGS[flag]}: pass method=..., draft=... and "
                "num_speculative_tokens=..., which become --speculative-config"
            )
        if flag in _MANAGED_FLAGS:
            raise ValueError(f"{arg!r} in extra_args: set it through serve_command's own parameter")
