"""``torch.compile`` for the fast path: a model's forward compiled with dynamic shapes, a draft
model's k greedy steps as one graph (:data:`GREEDY_DRAFTS`), and the compiler itself for a
drafter's own steps (:data:`COMPILER`: an EAGLE head's greedy chain)."""
from __future__ import annotations

import os
import shutil
import types

import torch

from ..kv_cache import PreallocatedLayer, reserve, rollback
from ..modules import COMPILER, GREEDY_DRAFTS, copy_sharing_weights


def compile_available(model: torch.nn.Module | None = None) -> tuple[bool, str]:
    """Whether :func:`prepare` ``(model, compile=True)`` can compile here: ``(ok, reason)``.

    torch.compile's CPU backend (inductor) writes C++ and builds it with the system's compiler.
    """
    if model is not None:
        devices = {p.device.type for p in model.parameters()}
        if devices != {"cpu"}:
            return False, f"the model is on {', '.join(sorted(devices))}; this switch compiles for CPU only"
        dtypes = {p.dtype for p in model.parameters()}
        if dtypes != {torch.float32}:
            return False, "the model is not float32; the fast path keeps float32 arithmetic"
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if not compiler:
        return False, "no C++ compiler (g++, c++ or clang++) on PATH: torch.compile's CPU backend needs one"
    return True, f"torch.compile (inductor) can build with {compiler}"


# Compiled graphs are cached per code object: a model's pass kinds (prefill, one token, k + 1
# tokens, a tree's mask) and the greedy drafts' k need more entries than torch's default of 8,
# past which it silently runs the rest uncompiled.
RECOMPILE_LIMIT = 64


def _own_code(function):
    """``function`` (or a bound method) on a copy with a code object of its own.

    torch.compile keeps its graphs, and the guards that choose among them, per code object; every
    Llama's forward shares one. With a code object per compiled model, a call never checks another
    model's graphs, and the guards on the model's own modules can go (:func:`_compile`).
    """
    bound = getattr(function, "__self__", None)
    plain = getattr(function, "__func__", function)
    copy = types.FunctionType(plain.__code__.replace(), plain.__globals__, plain.__name__, plain.__defaults__,
                              plain.__closure__)
    copy.__dict__.update(plain.__dict__)
    copy.__kwdefaults__ = plain.__kwdefaults__
    return copy if bound is None else types.MethodType(copy, bound)


def _compile(function):
    """``torch.compile`` of a model's own copy of ``function`` (:func:`_own_code`), with dynamic shapes.

    Two kinds of checks made at every call go: the guards on its modules' attributes
    (``skip_guard_on_all_nn_modules_unsafe``), which nothing changes (the compiled copy is private
    to :func:`compile_model`, its layers fixed by :func:`~specdec_ref.kernels.fast.prepare`), and
    the generated code's asserts on the sizes and strides of its weights and of each operator's
    output, which the guards on the inputs (ids, caches, their shapes) already imply. Paired step
    by step on SmolLM2, the guards made a decode step 13% slower and the asserts 6%.
    """
    return torch.compile(_own_code(function), dynamic=True,
                         options={"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe,
                                  "size_asserts": False, "scalar_asserts": False, "alignment_asserts": False})


class _CompiledForward:
    """A model's forward compiled by torch.compile, fed inputs in one canonical form.

    Each compiled graph is guarded by its inputs' properties; three that the loops vary
    without meaning anything would recompile again and again: whether a tensor was made
    under inference mode, the strides of the ids (a one-token slice of the loop's token
    buffer keeps the buffer's row stride), and the strides of cache tensors that a rollback
    left as views of longer ones. Cloning the ids under inference mode to contiguous strides
    fixes the first two. The caches the loops make for a fast model
    (:class:`~specdec_ref.kv_cache.PreallocatedLayer`) keep their strides; a plain
    ``DynamicCache`` passed in has such tensors made contiguous (a copy only after a rollback).
    Preallocated caches grow before the call, never inside the graph.
    """

    def __init__(self, forward) -> None:
        self.compiled = _compile(forward)

    def __call__(self, input_ids: torch.Tensor | None = None, *args, **kwargs):
        cache = kwargs.get("past_key_values")
        with torch.inference_mode():
            if input_ids is not None:
                input_ids = input_ids.clone(memory_format=torch.contiguous_format)
                reserve(cache, input_ids.shape[-1])
            for layer in getattr(cache, "layers", ()):
                if isinstance(layer, PreallocatedLayer):
                    continue
                for name in ("keys", "values"):
                    tensor = getattr(layer, name, None)
                    if isinstance(tensor, torch.Tensor) and not tensor.is_contiguous():
                        setattr(layer, name, tensor.contiguous())
            return self.compiled(input_ids, *args, **kwargs)


class _CompiledGreedyDrafts:
    """A draft model's k greedy steps as one compiled graph (:data:`~specdec_ref.modules.GREEDY_DRAFTS`).

    Called one graph at a time, each draft step pays the compiled forward's entry (guards,
    wrappers, the output object) and an eager argmax. One graph for the k steps, the argmax
    inside, pays that once per draft. Its input always has two tokens (the cache is rolled back
    by one, or fed what precedes them), so one graph per k serves every iteration, after a
    full acceptance too; the first step recomputes one cache position, which costs next to
    nothing where the step is bound by weight bytes.
    """

    def __init__(self, forward, compiled_forward: _CompiledForward, logits_width: int) -> None:
        self.forward, self.compiled_forward, self.logits_width = forward, compiled_forward, logits_width
        self.compiled = _compile(self._steps)

    def _steps(self, input_ids: torch.LongTensor, cache, num_tokens: int, width: int) -> torch.Tensor:
        drafts = []
        for _ in range(num_tokens):
            logits = self.forward(input_ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[0, -1]
            # Cut to the target's width; padding with -inf (a wider target) never changes the argmax.
            input_ids = logits[:width].argmax().view(1, 1)
            drafts.append(input_ids)
        return torch.cat(drafts).view(-1)

    def __call__(self, cache, tokens: torch.LongTensor, num_tokens: int, vocab_size: int | None) -> tuple[torch.Tensor, int]:
        """Draft ``num_tokens`` greedy tokens after ``tokens`` (1-D, at least two); the cache
        ends one token short, as the loop expects. Returns the drafts and the forward calls made."""
        with torch.inference_mode():
            read, start = cache.get_seq_length(), tokens.numel() - 2
            calls = num_tokens
            if read > start:
                rollback(cache, start)
            elif read < start:  # the prompt at first: feed all but its last two tokens
                self.compiled_forward(tokens[None, read:start], past_key_values=cache, use_cache=True,
                                      logits_to_keep=1)
                calls += 1
            reserve(cache, num_tokens + 1)  # the two tokens fed, then each draft but the last
            # Always a width no wider than the logits: every target width then runs one graph
            # (None, or a width past the logits, would each compile one of their own).
            width = self.logits_width if vocab_size is None else min(vocab_size, self.logits_width)
            ids = tokens[None, start:].clone(memory_format=torch.contiguous_format)
            return self.compiled(ids, cache, num_tokens, width), calls


def compile_model(model: torch.nn.Module) -> torch.nn.Module:
    """A copy sharing ``model``'s weights whose forward is compiled by torch.compile.

    Dynamic shapes: one graph serves every cache length and every number of new tokens
    above one (the prefill, the k + 1 tokens of a verification), so a run compiles a few
    graphs once instead of one per length. Greedy drafting with the copy compiles one more
    graph per k (:class:`_CompiledGreedyDrafts`); the copy carries the compiler under
    :data:`~specdec_ref.modules.COMPILER`, which an EAGLE head's greedy chain uses. bf16-stored
    layers stay one opaque call each in the graph. Raises torch's recompile limit to
    :data:`RECOMPILE_LIMIT` (a process-wide setting).
    """
    import torch._dynamo

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    copy = copy_sharing_weights(model)
    forward = copy.forward
    copy.forward = _CompiledForward(forward)
    setattr(copy, GREEDY_DRAFTS, _CompiledGreedyDrafts(forward, copy.forward, copy.config.vocab_size))
    setattr(copy, COMPILER, _compile)
    copy._specdec_compiled = True
    return copy


def is_compiled(model: torch.nn.Module) -> bool:
    """Whether ``model`` came from :func:`prepare` ``(..., compile=True)``."""
    return getattr(model, "_specdec_compiled", False)
