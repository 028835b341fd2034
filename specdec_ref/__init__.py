"""specdec_ref: the reference implementation of the speculative decoding course.

The lessons import this package; it is the very code they teach.
"""
from .baseline import autoregressive_generate
from .drafters import Drafter, ModelDrafter, Proposal
from .eagle import DraftTree, EagleDrafter
from .ngram import PromptLookupDrafter
from .sampling import Sampler
from .speculative import accept_greedy, accept_sampled, speculative_generate, speculative_step
from .stats import GenerationOutput, GenerationStats
from .tokenizer_compat import TokenizerReport, compare_tokenizers
from .uag import CrossTokenizerDrafter

__all__ = [
    "CrossTokenizerDrafter",
    "DraftTree",
    "Drafter",
    "EagleDrafter",
    "GenerationOutput",
    "GenerationStats",
    "ModelDrafter",
    "PromptLookupDrafter",
    "Proposal",
    "Sampler",
    "TokenizerReport",
    "accept_greedy",
    "accept_sampled",
    "autoregressive_generate",
    "compare_tokenizers",
    "speculative_generate",
    "speculative_step",
]
