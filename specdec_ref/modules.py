"""Module surgery shared by the kernels: finding linear layers, copying a model without copying
its weights, and building a module in the same form as a model another module drafts for."""
from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from itertools import chain

import torch

# A model put on other kernels carries, under this attribute, the function that puts any module
# (an EAGLE head, its LM head rows) on the same kernels: ``module -> module``.
FORM_ATTRIBUTE = "_specdec_same_form"
# A model may carry, under this attribute, a faster way to draft k greedy tokens with the same
# result: ``(cache, tokens, k, vocab_size) -> (drafts, forward calls)``, where ``tokens`` is the
# whole sequence (at least two tokens). A compiled model does (:mod:`specdec_ref.kernels.compiled`).
GREEDY_DRAFTS = "_specdec_greedy_drafts"
# A compiled model carries, under this attribute, the compiler it was compiled with, for a drafter
# to compile its own steps the same way: ``function -> compiled function``.
COMPILER = "_specdec_compiler"
# A fast model may carry, under this attribute, what gives an EAGLE drafter's greedy chain as one call
# (:mod:`specdec_ref.kernels.eagle_chain`): ``drafter -> chain, or None where it does not apply``, the
# chain called as ``EagleDrafter.greedy_chain`` is.
GREEDY_CHAIN = "_specdec_greedy_chain"


def linear_layers(model: torch.nn.Module) -> Iterator[tuple[torch.nn.Module, str, torch.nn.Module]]:
    """(parent, attribute name, layer) for every ``nn.Linear`` and GPT-2 ``Conv1D`` in ``model``."""
    from transformers.pytorch_utils import Conv1D

    for parent in model.modules():
        for name, child in parent.named_children():
            if isinstance(child, (torch.nn.Linear, Conv1D)):
                yield parent, name, child


def copy_sharing_weights(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of the module tree whose parameters and buffers are the original tensors."""
    memo = {id(t): t for t in chain(model.parameters(), model.buffers())}
    return copy.deepcopy(model, memo)


def mark_form(model: torch.nn.Module, same_form: Callable[[torch.nn.Module], torch.nn.Module]) -> None:
    """Record on ``model`` how to put another module on the kernels it runs on (see :func:`like`)."""
    setattr(model, FORM_ATTRIBUTE, same_form)


def like(module: torch.nn.Module, model: torch.nn.Module) -> torch.nn.Module:
    """``module`` in the form ``model`` runs in: on the same fast kernels, or weights-first, or as
    it is for a stock eager model. What a drafter does with the layers it adds to its target."""
    same_form = getattr(model, FORM_ATTRIBUTE, None)
    return module if same_form is None else same_form(module)
