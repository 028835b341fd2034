"""specdec_ref: the reference implementation of the speculative decoding course.

The lessons import this package; it is the very code they teach.
"""
from .baseline import autoregressive_generate
from .drafters import Drafter, ModelDrafter, Proposal
from .sampling import Sampler
from .speculative import accept_greedy, accept_sampled, speculative_generate, speculative_step
from .stats import GenerationOutput, GenerationStats

__all__ = [
    "Drafter",
    "GenerationOutput",
    "GenerationStats",
    "ModelDrafter",
    "Proposal",
    "Sampler",
    "accept_greedy",
    "accept_sampled",
    "autoregressive_generate",
    "speculative_generate",
    "speculative_step",
]
