"""The ``vllm serve`` command line for each speculative method.

vLLM takes every speculation setting in one JSON option, ``--speculative-config``.
The course's source text shows a ``--draft-model`` flag: vLLM never had one, and
the older ``--speculative-model`` / ``--num-speculative-tokens`` flags are gone.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
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


def speculative_config(
    method: str,
    *,
    draft: str | None = None,
    num_speculative_tokens: int = 5,
    prompt_lookup_min: int | None = None,
    prompt_lookup_max: int | None = None,
) -> dict[str, Any]:
    """The ``--speculative-config`` dictionary for ``method``, validated.

    ``draft`` is passed as given (resolve ``zoo:`` names first).  For ``ngram``,
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
        ValueError: invalid settings (see :func:`speculative_config`), or
            ``extra_args`` repeating an option this function writes or using
            a flag vLLM no longer has.
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
            draft=None if draft is None else resolve_model(draft),
            num_speculative_tokens=num_speculative_tokens,
            prompt_lookup_min=prompt_lookup_min,
            prompt_lookup_max=prompt_lookup_max,
        )

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
