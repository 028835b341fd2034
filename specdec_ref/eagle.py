"""EAGLE-style drafting: a one-layer head that drafts from the target's own features.

A separate small draft model has to learn the language to guess the target's next token.
EAGLE (Li et al. 2024, arXiv:2401.15077) gives the draft the target's last hidden state
instead: the feature f_t after the final norm, from which the target's LM head reads its
next-token distribution. One decoder layer takes concat(embedding(x_{t+1}), f_t) through a
2d -> d linear layer and predicts f_{t+1}; the target's LM head turns that into a draft
token; drafting continues on the head's own predicted features. The target computes the
features anyway in its verification pass, so they cost no extra forward: a drafter that
sets ``reads_target_features = True`` receives them in ``update``.

The head reuses the target's embedding and LM head and adds one layer (about 4M parameters
for SmolLM2-135M). A draft vocabulary (the N most frequent target tokens, as EAGLE-3 and
FR-Spec do) shrinks the LM head the draft reads at every step: SmolLM2's is a 49,152 x 576
matrix, a fifth of the whole model. The weight names and the layout (embedding first in the
concatenation, no input norm in the layer, no final norm) are those of vLLM's ``eagle``
method for Llama (``EagleLlamaForCausalLM``).
"""
from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from .drafters import DrafterBase, Proposal, check_min_confidence, drafter_features
from .inputs import check_context
from .modules import COMPILER, GREEDY_CHAIN, like
from .roofline import streamed_weight_bytes
from .sampling import Sampler

if TYPE_CHECKING:
    from .costs import Costs


@dataclass(frozen=True)
class EagleConfig:
    """Shapes of the head; :meth:`for_target` copies the target's."""

    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    #: Lower layers the head fuses with the top feature (EAGLE-3): indices into the target's
    #: ``hidden_states`` (0 the embeddings, i the input of layer i). Empty: the top feature only.
    feature_layers: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "feature_layers", tuple(int(i) for i in self.feature_layers))

    @classmethod
    def for_target(cls, config) -> "EagleConfig":
        rope = getattr(config, "rope_parameters", None) or {}
        return cls(config.hidden_size, config.num_attention_heads, config.num_key_value_heads,
                   config.intermediate_size, rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)),
                   config.rms_norm_eps)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(size)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary position embedding (Llama's half-split convention); x: [B, H, T, D], positions: [T]."""
    half = x.shape[-1] // 2
    freqs = theta ** (-torch.arange(half, dtype=torch.float32, device=x.device) / half)
    angles = positions.float()[:, None] * freqs[None]
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Attention(nn.Module):
    """Grouped-query attention; returns the output and this call's (keys, values) for a cache."""

    def __init__(self, c: EagleConfig) -> None:
        super().__init__()
        self.c = c
        d, kv = c.hidden_size, c.num_key_value_heads * c.head_dim
        self.q_proj, self.k_proj = nn.Linear(d, d, bias=False), nn.Linear(d, kv, bias=False)
        self.v_proj, self.o_proj = nn.Linear(d, kv, bias=False), nn.Linear(d, d, bias=False)

    def project(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        c, (b, t, _) = self.c, x.shape
        q = self.q_proj(x).view(b, t, c.num_attention_heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        return rotate(q, positions, c.rope_theta), rotate(k, positions, c.rope_theta), v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``mask``: [T_q, T_k] booleans, True where a query may read a key."""
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        b, _, t, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.c.hidden_size))


class MLP(nn.Module):
    def __init__(self, c: EagleConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    """A Llama decoder layer without its input norm (the fc output goes straight in)."""

    def __init__(self, c: EagleConfig) -> None:
        super().__init__()
        self.self_attn, self.mlp = Attention(c), MLP(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, x: torch.Tensor, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        """The layer's output for inputs ``x`` whose queries ``q`` read ``keys``/``values`` under ``mask``."""
        h = x + self.self_attn.attend(q, keys, values, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class EagleHead(nn.Module):
    """fc(concat(embedding of x_{t+1}, f_t)) -> one decoder layer -> predicted f_{t+1}.

    The embedding and LM head are the target's and live outside the head, so the saved
    head is only ``fc`` and ``layers.0``, and ``fuse`` for a multi-layer head.

    A multi-layer head (EAGLE-3, Li et al. 2025, arXiv:2503.01840; ``config.feature_layers``)
    reads more of the target than its last layer: :meth:`fuse_features` maps the features of a
    low and a middle layer, each RMS-normalised (the residual stream's scale varies a
    hundredfold between layers), and the top feature through ``fuse`` to the f_t the head
    reads. Drafts after the first read the head's own predicted features, as before.
    """

    def __init__(self, config: EagleConfig) -> None:
        super().__init__()
        self.config = config
        d = config.hidden_size
        self.fc = nn.Linear(2 * d, d, bias=False)
        self.layers = nn.ModuleList([Layer(config)])
        if config.feature_layers:
            self.fuse = nn.Linear((len(config.feature_layers) + 1) * d, d, bias=False)

    @property
    def feature_size(self) -> int:
        """Values per position the head reads from the target: the feature layers' and the top one's."""
        return (len(self.config.feature_layers) + 1) * self.config.hidden_size

    def fuse_features(self, features: torch.Tensor) -> torch.Tensor:
        """The f_t the head reads, [..., d], from the target's features [..., :attr:`feature_size`]
        (the feature layers' in order, then the top one's); a one-layer head's pass through."""
        if features.shape[-1] != self.feature_size:
            raise ValueError(f"this head reads {self.feature_size} values a position from the target (layers "
                             f"{list(self.config.feature_layers)} and the top one), got {features.shape[-1]}")
        if not self.config.feature_layers:
            return features
        d = self.config.hidden_size
        lower = features[..., :-d].unflatten(-1, (-1, d))
        lower = F.rms_norm(lower, (d,), eps=self.config.rms_norm_eps).flatten(-2)
        return self.fuse(torch.cat([lower, features[..., -d:]], -1))

    def forward(self, embeds: torch.Tensor, features: torch.Tensor, positions: torch.Tensor,
                past: tuple[torch.Tensor, torch.Tensor] | None = None, mask: torch.Tensor | None = None,
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Predicted next features [B, T, d] for inputs at ``positions`` (after ``past``'s), and
        this call's keys and values for the caller's cache; ``mask`` as in :meth:`predict`."""
        return self.predict(torch.cat([embeds, features], dim=-1), positions, past, mask)

    def predict(self, inputs: torch.Tensor, positions: torch.Tensor,
                past: tuple[torch.Tensor, torch.Tensor] | None = None, mask: torch.Tensor | None = None,
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """:meth:`forward` on inputs already concatenated: [B, T, 2d], each row
        [embedding of x_{t+1}; f_t] (:func:`eagle_inputs`). ``mask``: [T, cached + T] booleans,
        which keys each input reads (default causal; a draft tree passes each node's branch)."""
        x = self.fc(inputs)
        layer = self.layers[0]
        q, k, v = layer.self_attn.project(x, positions)
        keys = k if past is None else torch.cat([past[0], k], dim=2)
        values = v if past is None else torch.cat([past[1], v], dim=2)
        if mask is None:
            mask = causal_mask(q.shape[2], keys.shape[2], q.device)
        return layer(x, q, keys, values, mask), (k, v)

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def causal_mask(num_queries: int, num_keys: int, device=None) -> torch.Tensor:
    """Queries are the last ``num_queries`` of ``num_keys`` positions; each reads itself and earlier."""
    q = torch.arange(num_keys - num_queries, num_keys, device=device)
    return torch.arange(num_keys, device=device)[None, :] <= q[:, None]


def eagle_inputs(features: torch.Tensor, token_ids: torch.Tensor, embed: nn.Embedding) -> torch.Tensor:
    """The head's input rows for target features at positions 0..m-1: row t is
    [embedding of token t + 1; feature t], [m, 2d] (embedding first, as :meth:`EagleHead.forward`
    and vLLM lay it out). ``features``: [m, d]; ``token_ids``: [m + 1] the tokens at positions
    0..m (the last one the token the target chose after the last feature)."""
    if token_ids.numel() != features.shape[0] + 1:
        raise ValueError(f"need one token more than features (the token after each), got "
                         f"{token_ids.numel()} tokens for {features.shape[0]} features")
    return torch.cat([embed(token_ids[1:].to(embed.weight.device)).to(features.dtype), features], dim=-1)


def lm_head_rows(target: nn.Module, draft_vocab: torch.LongTensor | None) -> tuple[nn.Linear, torch.LongTensor | None]:
    """The LM head a draft head reads: the target's own (no copy), or its ``draft_vocab`` rows;
    and ``draft_vocab`` on the LM head's device."""
    lm_weight = target.get_output_embeddings().weight
    draft_vocab = None if draft_vocab is None else draft_vocab.to(lm_weight.device)
    rows = lm_weight if draft_vocab is None else lm_weight[draft_vocab].detach()
    lm_head = nn.Linear(*rows.shape[::-1], bias=False, device="meta")  # the target's rows, not a copy of all
    lm_head.weight = rows if draft_vocab is None else nn.Parameter(rows, requires_grad=False)
    return lm_head, draft_vocab


class DraftHead:
    """An :class:`EagleHead` ready to draft one step at a time: its target's embedding
    (``embed``), the target's LM head rows for the draft vocabulary (mapped back to target
    ids), and its own KV cache of ``length`` positions.

    ``step`` runs the head on input rows (:func:`eagle_inputs`) at the next positions and keeps
    their keys and values; ``truncate`` forgets positions from a given one on (the entries a
    rejected draft left). ``greedy_token`` and ``top_tokens`` read a predicted feature.
    """

    def __init__(self, head: EagleHead, target: nn.Module, draft_vocab: torch.LongTensor | None = None) -> None:
        self.head = head
        self.embed = target.get_input_embeddings()
        self.lm_head, self.draft_vocab = lm_head_rows(target, draft_vocab)
        self.keys: torch.Tensor | None = None  # [1, kv heads, length, head dim]
        self.values: torch.Tensor | None = None

    @property
    def length(self) -> int:
        """Positions in the head's cache."""
        return 0 if self.keys is None else self.keys.shape[2]

    @torch.inference_mode()
    def step(self, inputs: torch.Tensor) -> torch.Tensor:
        """Run the head on ``inputs`` [m, 2d] at the next m positions, after the cached ones;
        append their keys and values; return the predicted features [m, d]."""
        d = self.head.config.hidden_size
        if inputs.dim() != 2 or inputs.shape[1] != 2 * d:
            raise ValueError(f"step reads input rows of shape [m, {2 * d}] (embedding, feature), got {list(inputs.shape)}")
        positions = torch.arange(self.length, self.length + inputs.shape[0], device=inputs.device)
        past = None if self.keys is None else (self.keys, self.values)
        predicted, (k, v) = self.head.predict(inputs[None], positions, past)
        self.keys = k if past is None else torch.cat([self.keys, k], dim=2)
        self.values = v if past is None else torch.cat([self.values, v], dim=2)
        return predicted[0]

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` positions of the cache."""
        if self.keys is not None:
            self.keys, self.values = self.keys[:, :, :length], self.values[:, :, :length]

    @torch.inference_mode()
    def logits(self, feature: torch.Tensor) -> torch.Tensor:
        """The head's logits over the draft vocabulary for one predicted ``feature`` ([d] or [1, d])."""
        d = self.head.config.hidden_size
        if feature.numel() != d:
            raise ValueError(f"one feature of {d} values, got shape {list(feature.shape)}")
        return self.lm_head(feature.reshape(d).to(self.lm_head.weight.dtype))

    def to_target(self, indices: torch.Tensor) -> torch.Tensor:
        """Target ids of rows of the head's LM head."""
        return indices if self.draft_vocab is None else self.draft_vocab[indices]

    def greedy_token(self, feature: torch.Tensor) -> int:
        """The target id of the head's best token for a predicted ``feature`` ([d] or [1, d])."""
        return int(self.to_target(self.logits(feature).argmax()))

    def top_tokens(self, feature: torch.Tensor, n: int) -> list[int]:
        """The target ids of the head's ``n`` best tokens for a predicted ``feature``, best first."""
        logits = self.logits(feature)
        return self.to_target(logits.topk(min(n, logits.numel())).indices).tolist()


@dataclass(frozen=True)
class DraftTree:
    """How an :class:`EagleDrafter` grows a dynamic draft tree (EAGLE-2, Li et al. 2024,
    arXiv:2406.16858) instead of a chain.

    Each depth, the ``top_k`` most probable nodes of the depth before are expanded in one head
    call, each into its ``top_k`` best tokens; a node's score is the product of the head's
    probabilities along its branch, the head's estimate that the target accepts the whole
    branch. Then the nodes are reranked by score and the best are verified in one target pass.
    Since a branch's score never exceeds its parent's, the best nodes always include their
    ancestors.

    How many nodes, from the costs measured on the path (``draft_cost`` c and ``verify_costs``
    v(n), in one-token target passes, from :func:`specdec_ref.costs.measure_costs`; see
    :meth:`from_costs`): the n that maximises this iteration's expected tokens per unit of time,
    (1 + the n best scores summed) / (depth * c + v(n)), up to ``max_nodes``. Without
    measured costs, ``max_nodes``. How deep: up to the loop's k, and no deeper once the
    frontier's scores sum to less than c (the most tokens a deeper level could add is worth
    less than the head step it costs).
    """

    top_k: int = 4
    max_nodes: int = 8
    draft_cost: float = 0.0
    verify_costs: Mapping[int, float] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.top_k, int) or self.top_k < 1:
            raise ValueError(f"top_k must be an integer >= 1, got {self.top_k!r}")
        if not isinstance(self.max_nodes, int) or self.max_nodes < 1:
            raise ValueError(f"max_nodes must be an integer >= 1, got {self.max_nodes!r}")
        if self.draft_cost < 0 or any(n < 1 or v <= 0 for n, v in (self.verify_costs or {}).items()):
            raise ValueError("draft_cost must be >= 0, and verify_costs map node counts >= 1 to costs > 0")

    @classmethod
    def from_costs(cls, costs: Costs, top_k: int = 4) -> DraftTree:
        """The tree for a path whose c and v(n) were measured (a :class:`specdec_ref.costs.Costs`):
        at most as many nodes as v was measured for. A pass over more rows reads the same weights
        and does more work, so it never costs less: each v(n) is raised to the largest measured
        for fewer nodes (and to a step's cost, 1), so that noise on a busy machine cannot make a
        wider tree look cheaper than a narrower one."""
        envelope, highest = {}, 1.0
        for n in sorted(costs.verify_costs):
            highest = envelope[n] = max(highest, costs.verify_costs[n])
        return cls(top_k, max(envelope), costs.cost_ratio, envelope)

    def verify_cost(self, n: int) -> float:
        """v(n), linear between the measured node counts (v(0) = 1: a plain step)."""
        known = {0: 1.0, **(self.verify_costs or {})}
        if n in known:
            return known[n]
        below, above = max(m for m in known if m < n), min((m for m in known if m > n), default=None)
        if above is None:
            return known[below] * n / below  # past the last measurement: cost grows with the rows
        share = (n - below) / (above - below)
        return known[below] + share * (known[above] - known[below])

    def nodes_to_verify(self, scores: list[float], depth: int) -> int:
        """How many of the best nodes (``scores``: branch probabilities, best first) to verify
        after drafting ``depth`` levels."""
        limit = min(self.max_nodes, len(scores))
        if not self.verify_costs:
            return limit
        drafting = depth * self.draft_cost
        rates = [(1 + sum(scores[:n])) / (drafting + self.verify_cost(n)) for n in range(1, limit + 1)]
        return 1 + max(range(limit), key=rates.__getitem__)


#: Node counts whose verification cost :func:`measured_tree` measures: up to 15 drafts, the most a
#: pass of the fast path's kernels serves (16 rows with the last token).
TREE_SIZES = (1, 2, 4, 6, 8, 10, 12, 15)


def measured_tree(target: nn.Module, head: EagleHead, draft_vocab: torch.LongTensor | None = None,
                  top_k: int = 4, context: int = 128) -> DraftTree:
    """The :class:`DraftTree` for ``head`` drafting for ``target`` as it runs now (eager, fast or
    weights-first): c and v(n) for n in :data:`TREE_SIZES` measured on a ``context``-token cache
    (seconds: a few rounds of paired passes, :func:`specdec_ref.costs.measure_costs`)."""
    from .costs import measure_costs  # costs drafts through the drafters: imported when needed

    limit = getattr(target.config, "max_position_embeddings", None)
    sizes = [n for n in TREE_SIZES if limit is None or context + n + 1 <= limit]
    costs = measure_costs(target, EagleDrafter(head, target, draft_vocab), context, sizes, rounds=5)
    return DraftTree.from_costs(costs, top_k)


def drafts_chain_in_one_call(target: nn.Module) -> bool:
    """Whether an EAGLE head drafting for ``target`` runs its greedy chain as one call (a fast
    target's C++ chain, a compiled target's compiled one) rather than step by step from Python."""
    return getattr(target, COMPILER, None) is not None or getattr(target, GREEDY_CHAIN, None) is not None


class EagleDrafter(DrafterBase):
    """Drafts with an :class:`EagleHead` on the target's features (see the module docstring).

    ``draft_vocab``: the target ids the head may propose (sorted or not), or ``None`` for
    the whole vocabulary. The head's LM head is the target's, cut to those rows.
    ``min_confidence`` ends a draft after a token the head gives less than that probability.
    ``first_candidates``: when greedy, propose the head's best ``first_candidates`` tokens for
    the first position, not only its best: the chain goes on from the best, the others are
    leaves of a small tree the target verifies in the same pass (EAGLE-2 and Medusa verify
    larger trees). Worth it where one more verified token costs less than the acceptance it
    adds: on held-out continuations ``zoo:smollm2-eagle``'s best two tokens hold SmolLM2's next
    one 0.70 / 0.81 / 0.63 of the time (prose / code / chat), its best 0.54 / 0.71 / 0.50.

    ``tree``: grow a dynamic tree of drafts (:class:`DraftTree`, EAGLE-2) instead of a chain,
    greedy or sampling (the verifier judges each node's children in turn, exactly).

    On a fast target the greedy chain's k head steps run as one call, which drafts what the
    per-step loop drafts without its Python between steps: one C++ call
    (:mod:`specdec_ref.kernels.eagle_chain`), or on a compiled target (``fast.prepare(...,
    compile=True)``) one compiled call (:meth:`greedy_chain`, compiled as the target was).

    The head keeps its own cache: entry i was computed from (x_{i+1}, f_i). Entries from
    the target's features are kept; those from predicted features (the drafts) are rolled
    back after each verification and recomputed from the target's real features.
    """

    reads_target_features = True

    def __init__(self, head: EagleHead, target: nn.Module, draft_vocab: torch.LongTensor | None = None,
                 min_confidence: float | None = None, first_candidates: int = 1,
                 tree: DraftTree | None = None) -> None:
        if not isinstance(head, EagleHead):
            raise TypeError(f"EagleDrafter drafts with an EagleHead (zoo.load_eagle gives one), got {type(head).__name__}")
        check_min_confidence(min_confidence)
        check_head_fits(head, draft_vocab, target)
        if not isinstance(first_candidates, int) or first_candidates < 1:
            raise ValueError(f"first_candidates must be an integer >= 1, got {first_candidates!r}")
        if tree is not None and (first_candidates > 1 or min_confidence is not None):
            raise ValueError("a DraftTree chooses the draft's shape itself: give tree, or first_candidates and "
                             "min_confidence, not both")
        self.target = target
        self.embed = target.get_input_embeddings()
        self.lm_head, self.draft_vocab = lm_head_rows(target, draft_vocab)
        # The head and its LM head rows on the target's kernels (fast, weights-first or eager).
        self.head, self.lm_head = like(head, target), like(self.lm_head, target)
        self.vocab_size = target.get_output_embeddings().weight.shape[0]
        self.min_confidence = min_confidence
        self.first_candidates = first_candidates
        self.tree = tree
        self.target_feature_layers = head.config.feature_layers
        # On a compiled target the greedy chain is compiled too (one graph for its k head steps); a
        # fast target may give it as one C++ call.
        compiler, one_call = getattr(target, COMPILER, None), getattr(target, GREEDY_CHAIN, None)
        self.one_call_chain = (compiler(self.greedy_chain) if compiler is not None else
                               one_call(self) if one_call is not None else None)
        self.start(torch.zeros(1, dtype=torch.long), 0)

    def check_target(self, target: nn.Module) -> None:
        check_head_fits(self.head, self.draft_vocab, target)
        if target.get_output_embeddings().weight.shape[0] != self.vocab_size:
            raise ValueError(f"this EagleDrafter was built for a target with {self.vocab_size} tokens, and this "
                             f"target has {target.get_output_embeddings().weight.shape[0]}: build one for it")

    @property
    def num_parameters(self) -> int:
        return self.head.num_parameters

    @property
    def cache_length(self) -> int:
        return 0 if self.keys is None else self.keys.shape[2]

    def draft_step(self, target: nn.Module, tokens: torch.LongTensor):
        """One draft step after ``tokens``: the head reads the last real feature and drafts one
        token; rewound after each call, so calls repeat."""
        context = tokens.numel() - 1
        states = target(tokens[None, :context].to(target.device), output_hidden_states=True).hidden_states
        features = drafter_features(states, slice(None), self.target_feature_layers)
        self.start(tokens[:context], 1)
        self.update(tokens[:context], 0, features[:-1])
        greedy = Sampler()

        def step() -> None:
            self.rewind(context - 1)
            self.update(tokens, 0, features[-1:])
            self.propose(tokens, 1, greedy)
        return step

    def for_target(self, target: nn.Module) -> EagleDrafter:
        """The same head drafting for another version of its target (the fast one of
        :func:`specdec_ref.kernels.fast.prepare`); a tree sized from measured costs is sized again
        from that version's (:func:`measured_tree`)."""
        tree = self.tree
        if tree is not None and tree.verify_costs is not None and target is not self.target:
            # costs measured for one form of the target say nothing about another's: measure again
            tree = measured_tree(target, self.head, self.draft_vocab, tree.top_k)
        return EagleDrafter(self.head, target, self.draft_vocab, self.min_confidence, self.first_candidates, tree)

    def start(self, prompt: torch.LongTensor, max_new_tokens: int) -> None:
        if max_new_tokens:
            check_context(self.target, prompt.numel() + max_new_tokens, "target")
        self.keys = self.values = None     # the head's cache: [1, kv heads, cached, head dim]
        self.cached = 0                     # head entries computed from real features
        self.features: list[torch.Tensor] = []   # target features not yet read by the head

    def update(self, tokens: torch.LongTensor, num_accepted: int, features: torch.Tensor | None = None) -> None:
        """``features``: the target's last hidden states [m, d] for the positions its cache
        gained since the last call (the prefill's, or the accepted ones of a verification); a
        multi-layer head's, [m, (layers + 1) d], are fused here (:meth:`EagleHead.fuse_features`)."""
        if self.keys is not None:  # drop the draft entries: they came from predicted features
            self.keys, self.values = self.keys[:, :, : self.cached], self.values[:, :, : self.cached]
        if features is not None and features.numel():
            if self.target_feature_layers:
                with torch.inference_mode():
                    features = self.head.fuse_features(features.to(self.lm_head.weight.dtype))
            self.features.append(features)

    def propose(self, tokens: torch.LongTensor, max_tokens: int, sampler: Sampler) -> Proposal:
        dtype = self.lm_head.weight.dtype
        pending = torch.cat(self.features) if self.features else None
        known = self.cached + (0 if pending is None else pending.shape[0])
        if known != tokens.numel() - 1:
            raise RuntimeError(f"EagleDrafter has target features for {known} positions of {tokens.numel()}; "
                               "it needs one for every position but the last (pass features to update)")
        if pending is None or max_tokens == 0:  # a one-token prompt: no feature yet, nothing to draft from
            return Proposal(tokens.new_empty(0))
        self.features = []
        ids = tokens[self.cached + 1:].to(self.embed.weight.device)
        features = pending.to(dtype)[None]
        if self.tree is not None:
            return self.grow_tree(ids, features, max_tokens, tokens.device)
        if self.one_call_chain is not None and sampler.greedy and self.min_confidence is None and self.keys is not None:
            # The cache as a contiguous tensor, not the view a rollback leaves: one stride pattern, no recompiles.
            chain, siblings, self.keys, self.values = self.one_call_chain(
                ids, features, self.keys.contiguous(), self.values.contiguous(), self.cached, max_tokens,
                self.first_candidates)
            self.cached += ids.numel()
            return self.chain_proposal(chain, siblings, tokens.device)
        position = self.cached
        drafts, probs, siblings = [], [], []
        for step in range(max_tokens):
            predicted = self.run_head(ids, features, torch.arange(position, position + ids.numel(),
                                                                  device=features.device))
            if step == 0:
                self.cached += ids.numel()
            position += ids.numel()
            logits = self.lm_head(predicted[-1:])[0]
            token, q = self.choose(logits, sampler)
            if step == 0 and sampler.greedy and self.first_candidates > 1:
                siblings = self.to_target(logits.topk(min(self.first_candidates, logits.numel())).indices[1:])
            drafts.append(token)
            if q is not None:
                probs.append(q)
            if self.min_confidence is not None and step + 1 < max_tokens:
                # greedy: the draft is the argmax, so its probability is the largest one
                confidence = torch.softmax(logits.float(), -1).max() if q is None else q[token]
                if confidence < self.min_confidence:
                    break
            ids, features = token.view(1), predicted[None, -1:]
        return self.chain_proposal(torch.stack(drafts), siblings, tokens.device, torch.stack(probs) if probs else None)

    def greedy_chain(self, ids: torch.Tensor, features: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                     position: int, num_tokens: int, candidates: int):
        """:meth:`propose`'s greedy chain in one function (compiled on a compiled target): the head
        reads ``ids`` [m] and ``features`` [1, m, d] at ``position`` on, after its cache
        ``keys``/``values``, then drafts ``num_tokens`` tokens. Returns the drafts (target ids), the
        other best first tokens (``candidates`` - 1 of them, or ``None``), and the cache after."""
        drafts, siblings = [], None
        for step in range(num_tokens):
            positions = torch.arange(position, position + ids.shape[0], device=features.device)
            predicted, (k, v) = self.head(self.embed(ids)[None].to(features.dtype), features, positions, (keys, values))
            keys, values = torch.cat([keys, k], 2), torch.cat([values, v], 2)
            position += ids.shape[0]
            logits = self.lm_head(predicted[0, -1:])[0]
            if step == 0 and candidates > 1:
                siblings = self.to_target(logits.topk(min(candidates, logits.shape[0])).indices[1:])
            ids = self.to_target(logits.argmax().view(1))
            drafts.append(ids)
            features = predicted[:, -1:]
        return torch.cat(drafts), siblings, keys, values

    @staticmethod
    def chain_proposal(chain: torch.Tensor, siblings: torch.Tensor | None, device: torch.device,
                       probs: torch.Tensor | None = None) -> Proposal:
        """A chain of drafts, and after it the other first candidates: children of the last token."""
        if siblings is not None and len(siblings):
            parents = torch.cat([torch.arange(-1, len(chain) - 1), torch.full((len(siblings),), -1)])
            return Proposal(torch.cat([chain, siblings]).to(device), parents=parents, forward_calls=len(chain))
        return Proposal(chain.to(device), probs, forward_calls=len(chain))

    def run_head(self, ids: torch.Tensor, features: torch.Tensor, positions: torch.Tensor,
                 mask: torch.Tensor | None = None) -> torch.Tensor:
        """The head on ``ids`` [m] with the ``features`` [1, m, d] before them, keys and values
        appended to its cache; returns the predicted features [m, d]."""
        past = None if self.keys is None else (self.keys, self.values)
        predicted, (k, v) = self.head(self.embed(ids)[None].to(features.dtype), features, positions, past, mask)
        self.keys = k if past is None else torch.cat([self.keys, k], 2)
        self.values = v if past is None else torch.cat([self.values, v], 2)
        return predicted[0]

    def grow_tree(self, ids: torch.Tensor, features: torch.Tensor, max_depth: int, device: torch.device) -> Proposal:
        """EAGLE-2's dynamic tree (:class:`DraftTree`) after the head has read ``ids`` and the
        real ``features`` [1, m, d] before them: expand the best nodes of each depth in one head
        call, then keep the best nodes by branch probability."""
        tree, real = self.tree, self.cached
        predicted = self.run_head(ids, features, torch.arange(real, real + ids.numel(), device=features.device))
        self.cached = real = real + ids.numel()
        tokens: list[int] = []
        parents: list[int] = []
        scores: list[float] = []   # log of the branch probability
        depths: list[int] = []
        entry: dict[int, int] = {}  # expanded node -> its row in the head's cache
        frontier, frontier_features = [-1], predicted[-1:]  # -1: the last token
        depth = 0
        while True:
            depth += 1
            log_probs = torch.log_softmax(self.lm_head(frontier_features).float(), -1)
            best = log_probs.topk(min(tree.top_k, log_probs.shape[-1]), dim=-1)
            first_new = len(tokens)
            for row, node in enumerate(frontier):
                base = scores[node] if node >= 0 else 0.0
                tokens += self.to_target(best.indices[row]).tolist()
                scores += (base + best.values[row]).tolist()
                parents += [node] * best.indices.shape[1]
                depths += [depth] * best.indices.shape[1]
            new = sorted(range(first_new, len(tokens)), key=scores.__getitem__, reverse=True)[: tree.top_k]
            if depth == max_depth or sum(math.exp(scores[n]) for n in new) < tree.draft_cost:
                break
            # Expand the best new nodes at once: each reads the real entries, its ancestors' and itself.
            cached = self.keys.shape[2]
            mask = torch.zeros(len(new), cached + len(new), dtype=torch.bool, device=features.device)
            mask[:, :real] = True
            for row, node in enumerate(new):
                mask[row, cached + row] = True
                ancestor = parents[node]
                while ancestor >= 0:
                    mask[row, entry[ancestor]] = True
                    ancestor = parents[ancestor]
            inputs = frontier_features[[frontier.index(parents[n]) for n in new]]  # what predicted each
            positions = torch.full((len(new),), real + depth - 1, device=features.device)
            frontier_features = self.run_head(torch.tensor([tokens[n] for n in new], device=ids.device),
                                              inputs[None], positions, mask)
            entry.update({node: cached + row for row, node in enumerate(new)})
            frontier = new
        ranked = sorted(range(len(tokens)), key=lambda n: (-scores[n], depths[n]))  # ties: ancestors first
        chosen = ranked[: tree.nodes_to_verify([math.exp(scores[n]) for n in ranked], depth)]
        chosen.sort(key=lambda n: (depths[n], n))  # parents before children
        index = {node: i for i, node in enumerate(chosen)}
        return Proposal(torch.tensor([tokens[n] for n in chosen], device=device),
                        parents=torch.tensor([index[parents[n]] if parents[n] >= 0 else -1 for n in chosen]),
                        forward_calls=depth)

    def choose(self, logits: torch.Tensor, sampler: Sampler) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The draft token (a target id) and, when sampling, q over the full target vocabulary."""
        if sampler.greedy:
            return self.to_target(logits.argmax()), None
        if self.draft_vocab is not None:
            full = logits.new_full((self.vocab_size,), float("-inf"))
            logits = full.index_copy(0, self.draft_vocab, logits)
        q = sampler.probs(logits)
        return sampler.sample(q), q

    def to_target(self, indices: torch.Tensor) -> torch.Tensor:
        """Target ids of rows of the head's LM head."""
        return indices if self.draft_vocab is None else self.draft_vocab[indices]

    def rewind(self, positions: int) -> None:
        """Forget the head's entries from ``positions`` on; their features must be passed again."""
        self.cached = min(self.cached, positions)
        if self.keys is not None:
            self.keys, self.values = self.keys[:, :, :positions], self.values[:, :, :positions]

    @property
    def weight_bytes(self) -> float:
        """Bytes one draft step reads: the head, its LM head rows and one embedding row."""
        row = self.embed.weight[0]
        fuse = getattr(self.head, "fuse", None)  # a multi-layer head fuses the target's features once an iteration
        return (streamed_weight_bytes(self.head) - (0.0 if fuse is None else streamed_weight_bytes(fuse))
                + streamed_weight_bytes(self.lm_head) + float(row.numel() * row.element_size()))


def check_head_fits(head: EagleHead, draft_vocab: torch.LongTensor | None, target: nn.Module) -> None:
    """Raise ``ValueError``, in one sentence, unless ``head`` (and its draft vocabulary) can read
    ``target``'s features and propose its token ids: a head trained for another model cannot."""
    config = getattr(target, "config", None)
    hidden = getattr(config, "hidden_size", None)
    if hidden != head.config.hidden_size:
        raise ValueError(f"this EAGLE head reads features of size {head.config.hidden_size} and the target's are "
                         f"{hidden}: the head was trained for another target model")
    vocab = target.get_output_embeddings().weight.shape[0]
    if draft_vocab is not None and draft_vocab.numel() and int(draft_vocab.max()) >= vocab:
        raise ValueError(f"this EAGLE head's draft vocabulary has token id {int(draft_vocab.max())} and the target "
                         f"has {vocab} tokens: the head was trained for another target model")


# --- saving and loading -------------------------------------------------------------------

CONFIG_NAME, WEIGHTS_NAME, VOCAB_NAME = "config.json", "model.safetensors", "draft_vocab.json"


def save_head(head: EagleHead, folder: Path, draft_vocab: torch.LongTensor | None, target_config,
              record: dict | None = None) -> None:
    """bfloat16 weights in vLLM's EAGLE-Llama names, a ``config.json`` vLLM can read (the
    target's with one layer and the EAGLE architecture; a multi-layer head's, which vLLM does
    not load, names the course's own), and the draft vocabulary."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in head.state_dict().items()}
    save_file(state, folder / WEIGHTS_NAME, metadata={"format": "pt"})
    config = target_config.to_dict()
    for key in ("_name_or_path", "quantization_config", "transformers_version", "dtype", "torch_dtype"):
        config.pop(key, None)
    # vLLM's eagle method loads a one-layer head; a multi-layer one has the course's own layout.
    architecture = "SpecdecMultiLayerEagleHead" if head.config.feature_layers else "EagleLlamaForCausalLM"
    config.update(architectures=[architecture], num_hidden_layers=1,
                  specdec_eagle=asdict(head.config) | {"record": record or {}})
    (folder / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")
    vocab = None if draft_vocab is None else draft_vocab.tolist()
    (folder / VOCAB_NAME).write_text(json.dumps(vocab) + "\n")


def load_head(folder: str | Path, dtype: torch.dtype = torch.float32) -> tuple[EagleHead, torch.LongTensor | None]:
    """The head saved by :func:`save_head` and its draft vocabulary (``None``: all tokens)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    config = json.loads((folder / CONFIG_NAME).read_text())["specdec_eagle"]
    config.pop("record", None)
    head = EagleHead(EagleConfig(**config))
    head.load_state_dict(load_file(folder / WEIGHTS_NAME))
    vocab = json.loads((folder / VOCAB_NAME).read_text())
    return head.to(dtype).eval(), None if vocab is None else torch.tensor(vocab, dtype=torch.long)


def init_head(config: EagleConfig, seed: int = 0) -> EagleHead:
    """A fresh head: small random weights, the fc layer biased to pass the feature through
    (so an untrained head already predicts "the next feature is like this one")."""
    torch.manual_seed(seed)
    head = EagleHead(config)
    for name, p in head.named_parameters():
        if p.dim() == 2:
            nn.init.normal_(p, std=0.02 / math.sqrt(2) if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02)
    d = config.hidden_size
    with torch.no_grad():
        head.fc.weight[:, d:] += torch.eye(d)
    if config.feature_layers:
        _read_top_feature_only(head)
    return head


@torch.no_grad()
def _read_top_feature_only(head: EagleHead) -> None:
    """Set a multi-layer head's ``fuse`` to pass the top feature through and read nothing of the lower layers."""
    d = head.config.hidden_size
    head.fuse.weight.zero_()[:, -d:] = torch.eye(d)


def widen_head(head: EagleHead, feature_layers: tuple[int, ...]) -> EagleHead:
    """A multi-layer head that starts as ``head`` (a one-layer one): its weights, and a ``fuse``
    that passes the top feature through and reads nothing of the lower layers yet, so training
    it can only add what those layers hold."""
    if head.config.feature_layers:
        raise ValueError(f"this head already reads layers {list(head.config.feature_layers)}")
    if not feature_layers:
        raise ValueError("name the lower layers the widened head reads (feature_layers)")
    wide = EagleHead(replace(head.config, feature_layers=feature_layers)).to(head.fc.weight.dtype)
    wide.load_state_dict(head.state_dict(), strict=False)
    _read_top_feature_only(wide)
    return wide
