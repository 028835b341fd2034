"""llama.cpp's side of ``benchmarks/llamacpp_vs_fast.py``: run in ``.venv-llamacpp``, driven over a pipe.

    .venv-llamacpp/bin/python benchmarks/llamacpp_worker.py   # JSON requests on stdin, replies on stdout

One JSON object per line each way, one reply per request, in order:

- ``{"op": "ping"}`` -> ``{"ok": true, "python": ...}`` (llama_cpp not imported yet: a check of the pipe)
- ``{"op": "load", "model_path": P, "n_threads": 2, "n_ctx": 1024, "lookup_tokens": 4,
  "lookup_ngram": 2}`` -> ``{"ok": true, "llama_cpp_version": ..., "system_info": ...,
  "model_size_bytes": ..., "settings": {...}, "load_seconds": ...}``: two contexts on the same
  mapped weights, "plain" and "lookup" (``LlamaPromptLookupDecoding``, the binding's draft mode)
- ``{"op": "tokenize", "text": T}`` -> ``{"ok": true, "ids": [...]}`` (llama.cpp's own tokenizer,
  special tokens parsed, no BOS added: the GGUF's ``add_bos_token`` is false)
- ``{"op": "generate", "method": "plain" | "lookup", "prompt_ids": [...], "max_new_tokens": N}``
  -> ``{"ok": true, "ids": [...N new ids], "seconds": s}``: greedy (temperature 0), EOS not a stop,
  the KV cache cleared first so every request pays its whole prefill; ``seconds`` spans the
  prefill and all N tokens, timed here (the pipe's own milliseconds are not in it)
- ``{"op": "quit"}`` -> ``{"ok": true}``, then the worker exits

A request that fails gets ``{"ok": false, "error": "..."}`` and the worker goes on. The
replies go to the process's original stdout; everything else written to file descriptor 1
(llama.cpp's C code prints there) is sent to stderr, so it cannot break the protocol.
This file uses only the standard library and ``llama_cpp``, which is imported at ``load``.
"""
from __future__ import annotations

import json
import os
import platform
import sys
import time

METHODS = ("plain", "lookup")


class Engine:
    """The two llama.cpp contexts and what ``load`` reported about them."""

    def __init__(self, model_path: str, n_threads: int, n_ctx: int, lookup_tokens: int, lookup_ngram: int) -> None:
        import llama_cpp
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        start = time.perf_counter()
        common = dict(n_threads=n_threads, n_threads_batch=n_threads, n_ctx=n_ctx, n_gpu_layers=0, verbose=False)
        draft = LlamaPromptLookupDecoding(max_ngram_size=lookup_ngram, num_pred_tokens=lookup_tokens)
        self.llamas = {"plain": llama_cpp.Llama(model_path=model_path, **common),
                       "lookup": llama_cpp.Llama(model_path=model_path, draft_model=draft, **common)}
        plain = self.llamas["plain"]
        self.info = {
            "llama_cpp_version": llama_cpp.__version__,
            "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
            "model_size_bytes": int(llama_cpp.llama_model_size(plain.model)),
            "model_n_params": int(llama_cpp.llama_model_n_params(plain.model)),
            "settings": {"n_threads": n_threads, "n_ctx": n_ctx, "n_batch": plain.n_batch,
                         "flash_attn": bool(getattr(plain.context_params, "flash_attn", False))
                         if hasattr(plain.context_params, "flash_attn") else None,
                         "lookup": {"num_pred_tokens": lookup_tokens, "max_ngram_size": lookup_ngram}},
            "load_seconds": time.perf_counter() - start,
        }

    def tokenize(self, text: str) -> list[int]:
        return list(self.llamas["plain"].tokenize(text.encode(), add_bos=False, special=True))

    def generate(self, method: str, prompt_ids: list[int], max_new_tokens: int) -> tuple[list[int], float]:
        if method not in self.llamas:
            raise ValueError(f"unknown method {method!r}; known: {', '.join(METHODS)}")
        llama = self.llamas[method]
        out: list[int] = []
        start = time.perf_counter()
        llama.reset()  # no prefix reuse from the previous request: every request pays its prefill
        for token in llama.generate(prompt_ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0,
                                    reset=True):
            out.append(int(token))
            if len(out) == max_new_tokens:
                break
        return out, time.perf_counter() - start


def check_generate(request: dict) -> tuple[str, list[int], int]:
    """The method, prompt ids and token count of a ``generate`` request; ``ValueError`` when malformed."""
    method, ids, n = request.get("method"), request.get("prompt_ids"), request.get("max_new_tokens")
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and i >= 0 for i in ids):
        raise ValueError("prompt_ids must be a non-empty list of token ids (integers >= 0)")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {n!r}")
    return method, ids, n


def handle(request: dict, state: dict) -> dict:
    """The reply to one request; ``state["engine"]`` holds the loaded engine."""
    op = request.get("op")
    if op == "ping":
        return {"ok": True, "python": platform.python_version(), "pid": os.getpid()}
    if op == "quit":
        return {"ok": True}
    if op == "load":
        state["engine"] = Engine(request["model_path"], int(request.get("n_threads", 2)),
                                 int(request.get("n_ctx", 1024)), int(request.get("lookup_tokens", 4)),
                                 int(request.get("lookup_ngram", 2)))
        return {"ok": True, **state["engine"].info}
    engine = state.get("engine")
    if op in ("tokenize", "generate") and engine is None:
        raise RuntimeError(f"{op} before load: send a load request first")
    if op == "tokenize":
        return {"ok": True, "ids": engine.tokenize(str(request["text"]))}
    if op == "generate":
        ids, seconds = engine.generate(*check_generate(request))
        return {"ok": True, "ids": ids, "seconds": seconds}
    raise ValueError(f"unknown op {op!r}; known: ping, load, tokenize, generate, quit")


def main() -> None:
    replies = os.fdopen(os.dup(1), "w", buffering=1)  # the protocol's channel
    os.dup2(2, 1)  # anything else printed on fd 1 (llama.cpp's C code, print) goes to stderr
    sys.stdout = sys.stderr
    state: dict = {}
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            if not isinstance(request, dict):
                raise ValueError("a request is a JSON object")
            reply = handle(request, state)
        except Exception as error:  # noqa: BLE001 - every failure goes back to the driver, which decides
            request, reply = {}, {"ok": False, "error": f"{type(error).__name__}: {error}"}
        replies.write(json.dumps(reply) + "\n")
        if request.get("op") == "quit":
            break


if __name__ == "__main__":
    main()
