"""Speculative decoding: draft k tokens, verify them in ONE target pass, keep the agreeing prefix.

Greedy mode is token-identical to the target's own greedy decoding. Sampling mode is
exact speculative sampling (Leviathan et al. 2023, arXiv:2211.17192; Chen et al. 2023,
arXiv:2302.01318): a drafted token x is accepted with probability min(1, p(x)/q(x)) and
a rejection is replaced by a sample from the residual max(0, p - q), normalised, so
every emitted token is distributed exactly as the target would have sampled it.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from .drafters import Drafter, DrafterBase, ModelDrafter, Proposal, as_drafter_base, drafter_features
from .eagle import EagleConfig
from .inputs import check_request, clock, eos_ids
from .kv_cache import keep_positions, new_cache, rollback
from .sampling import Sampler
from .stats import GenerationOutput, GenerationStats
from .tokenizer_compat import compare_tokenizers
from .uag import CrossTokenizerDrafter


def as_drafter(draft: object, target: torch.nn.Module, target_tokenizer=None, draft_tokenizer=None,
               min_confidence: float | None = None) -> DrafterBase:
    """The drafter for ``draft``, checked against ``target``: a drafter passes through (one with only
    start/propose/update gets :class:`DrafterBase`'s defaults); a model drafts natively when it
    shares the target's vocabulary and through text (UAG) when the tokenizers say it does not.
    ``min_confidence`` (draft models only) ends a draft after a token the draft is unsure of."""
    if isinstance(draft, Drafter):
        if min_confidence is not None:
            raise ValueError("min_draft_confidence applies to draft models; set it on the Drafter you pass instead")
        drafter = as_drafter_base(draft)
        drafter.check_target(target)
        return drafter
    if isinstance(getattr(draft, "config", None), EagleConfig):
        raise TypeError("draft is an EAGLE head, which drafts from the target's features: pass "
                        "EagleDrafter(head, target, draft_vocab) as the draft")
    if not isinstance(draft, torch.nn.Module) or not isinstance(getattr(draft.config if hasattr(draft, "config") else None,
                                                                        "vocab_size", None), int):
        raise TypeError(
            f"draft must be a transformers causal LM or a Drafter (start/propose/update), got {type(draft).__name__}"
        )
    if (target_tokenizer is None) != (draft_tokenizer is None):
        raise ValueError("pass both target_tokenizer= and draft_tokenizer= (or neither)")
    if target_tokenizer is not None:
        if not compare_tokenizers(target_tokenizer, draft_tokenizer).native_ok:
            return CrossTokenizerDrafter(draft, draft_tokenizer, target_tokenizer, min_confidence=min_confidence)
        # Same tokenizer: embedding matrices may still be padded to different sizes.
        return ModelDrafter(draft, vocab_size=target.config.vocab_size, min_confidence=min_confidence)
    draft_vocab, target_vocab = draft.config.vocab_size, target.config.vocab_size
    if draft_vocab != target_vocab:
        raise ValueError(
            f"the draft and target vocabularies differ ({draft_vocab} vs {target_vocab} tokens), so draft "
            "token ids may mean different text to the target and cannot be verified directly. Pass "
            "target_tokenizer= and draft_tokenizer=: the same tokenizer with padded embeddings takes the "
            "native path, different tokenizers the cross-tokenizer (UAG) path."
        )
    return ModelDrafter(draft, min_confidence=min_confidence)


def accept_greedy(logits: torch.Tensor, drafts: torch.LongTensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy verdict: accept drafts while they equal the target's argmax.

    ``logits``: [n+1, V] target logits after each prefix; ``drafts``: [n].
    Returns (number accepted, the target's token after them), both 0-d tensors.
    """
    target_tokens = logits.argmax(dim=-1)
    num_accepted = (target_tokens[:-1] == drafts).int().cumprod(dim=0).sum()
    return num_accepted, target_tokens[num_accepted]


def accept_sampled(
    p: torch.Tensor, drafts: torch.LongTensor, q: torch.Tensor | None, sampler: Sampler
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact rejection sampling of the drafts against the target.

    ``p``: [n+1, V] target probabilities (warped); ``q``: [n, V] draft probabilities the
    drafts were sampled from, or ``None`` for a deterministic proposal (one-hot q).
    """
    n, vocab = drafts.numel(), p.shape[-1]
    if q is None:
        q = torch.nn.functional.one_hot(drafts, vocab).to(p.dtype)
    rows = torch.arange(n, device=p.device)
    uniform = torch.rand(n, generator=sampler.generator, device=p.device)
    # u < p/q written without the division (q(x) > 0 for a token that was sampled from q).
    accepted = uniform * q[rows, drafts] < p[rows, drafts]
    num_accepted = accepted.int().cumprod(dim=0).sum()
    # After a rejection at i, sample max(0, p_i - q_i); after n acceptances q is "all zero",
    # so the same formula gives the bonus token from p_n.
    q_padded = torch.cat([q, q.new_zeros(1, vocab)])
    residual = (p[num_accepted] - q_padded[num_accepted]).clamp_min(0)
    # p == q exactly makes a rejection impossible; guard the all-zero row rounding could leave.
    residual = torch.where(residual.sum() > 0, residual, p[num_accepted])
    return num_accepted, sampler.sample(residual)


def tree_depths(parents: list[int]) -> list[int]:
    """Each node's depth in a tree of drafts (1 for a child of the sequence's last token)."""
    depths: list[int] = []
    for parent in parents:
        depths.append(1 if parent < 0 else depths[parent] + 1)
    return depths


def tree_attention_mask(parents: list[int]) -> torch.Tensor:
    """Which of [last token, node 0..n-1] each of them reads in a tree's verification pass:
    [n + 1, n + 1] booleans, row i + 1 node i's (True where it reads), row and column 0 the
    last verified token, which stands for the context (every node reads it, and the cache
    before it). Node i reads itself and its ancestors, never a sibling or a cousin.
    ``parents[i]``: node i's parent, -1 for a child of the last token, parents before children."""
    n = len(parents)
    reads = torch.eye(n + 1, dtype=torch.bool)
    reads[:, 0] = True
    for i, parent in enumerate(parents):
        if parent >= 0:
            reads[i + 1] |= reads[parent + 1]
    return reads


def tree_verification_inputs(parents: list[int], cached: int, dtype: torch.dtype,
                             device: torch.device) -> dict[str, torch.Tensor]:
    """The ``attention_mask`` and ``position_ids`` of one target pass over [last token, tree]
    on a cache of ``cached`` positions: every node reads the cache, the last token, its
    ancestors and itself (:func:`tree_attention_mask`, looked up when called, so it can be
    swapped for another), at the position its depth gives (siblings share one)."""
    n = len(parents)
    reads = tree_attention_mask(parents).to(device)
    allowed = torch.cat([reads.new_ones(n + 1, cached), reads], dim=1)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, torch.finfo(dtype).min)
    positions = reads.sum(dim=1) - 1 + cached  # a node's depth is the number of its ancestors
    return {"attention_mask": mask[None, None], "position_ids": positions[None]}


def accept_tree(target_choices: torch.Tensor, tokens: list[int], parents: list[int]) -> list[int]:
    """The longest branch of a tree of drafts the target agrees with: from the last token,
    step to the child whose token is the target's choice after the node it continues, while
    there is one. ``target_choices``: [n + 1] the target's greedy tokens after [last token,
    node 0..n-1]; ``tokens[i]``, ``parents[i]``: node i's token and parent (-1: a child of the
    last token; siblings distinct). Returns the accepted nodes' indices, root to tip."""
    choices = target_choices.tolist()
    children: dict[int, dict[int, int]] = {}
    for node, (parent, token) in enumerate(zip(parents, tokens)):
        children.setdefault(parent, {})[token] = node
    path, node = [], -1
    while (child := children.get(node, {}).get(choices[node + 1])) is not None:
        path.append(child)
        node = child
    return path


def accept_greedy_tree(logits: torch.Tensor, drafts: torch.LongTensor, parents: list[int]) -> tuple[list[int], int]:
    """Greedy verdict on a tree (:func:`accept_tree`, looked up when called, so it can be
    swapped for another). ``logits``: [n + 1, V] (row 0 the last token's, row i + 1 node
    i's). Returns the accepted nodes, root to tip, and the target's token after them."""
    target_tokens = logits.argmax(dim=-1)
    path = accept_tree(target_tokens, drafts.tolist(), parents)
    return path, int(target_tokens[path[-1] + 1 if path else 0])


def accept_sampled_tree(p: torch.Tensor, drafts: torch.LongTensor, parents: list[int],
                        sampler: Sampler) -> tuple[list[int], int]:
    """Exact rejection sampling down a tree of deterministic drafts (SpecInfer's multi-candidate
    rule with one-hot q). At each node, starting at the last token, its children are judged in
    turn: a child's token x is accepted with probability p(x) / (mass of p left), and a rejected
    token is taken out of p, so the next sibling is judged against the rest. An accepted child
    becomes the node; when none is, the target's token is sampled from what is left of p (all of
    p after a leaf). Each step is rejection sampling with q = one-hot(x), so the token it yields
    follows p exactly. ``p``: [n + 1, V] warped target probabilities (row 0 the last token's, row
    i + 1 node i's). Returns the accepted nodes, root to tip, and the target's token after them."""
    children: dict[int, list[int]] = {}
    for node, parent in enumerate(parents):
        children.setdefault(parent, []).append(node)
    tokens = drafts.tolist()
    path, node = [], -1
    while True:
        left = p[node + 1].clone()
        for child in children.get(node, []):
            uniform = torch.rand((), generator=sampler.generator, device=p.device)
            if uniform * left.sum() < left[tokens[child]]:
                path.append(child)
                node = child
                break
            left[tokens[child]] = 0.0
        else:  # no child accepted (or a leaf): the target's own token from what is left
            left = torch.where(left.sum() > 0, left, p[node + 1])  # rounding can empty it
            return path, int(sampler.sample(left / left.sum()))


@dataclass
class Verdict:
    """What one verification pass decided: the drafts kept (in order), the target's own token
    after them, whether a draft was rejected, and (for a drafter that reads them) the target's
    features at the last token and the kept drafts."""

    accepted: torch.LongTensor
    next_token: torch.Tensor
    rejected: bool
    features: torch.Tensor | None


def verify_chain(target: torch.nn.Module, cache, tokens: torch.LongTensor, length: int, proposal: Proposal,
                 sampler: Sampler, features: tuple[int, ...] | None) -> Verdict:
    """One target pass over [last token, d1..dn] gives the target's distribution after every
    prefix (n + 1 positions; asked for by number, so a pass with no drafts has a decode step's
    shape); keep the longest agreeing prefix, then the target's own token (the correction at
    the first disagreement, or the bonus token if all n agree). ``features``: the lower layers a
    feature-reading drafter wants besides the last (:func:`drafter_features`); ``None``: none."""
    drafts = proposal.tokens.to(tokens.device)
    n = drafts.numel()
    tokens[length : length + n] = drafts
    out = target(tokens[None, length - 1 : length + n], past_key_values=cache, use_cache=True,
                 logits_to_keep=n + 1, output_hidden_states=features is not None)
    logits = out.logits[0]
    if sampler.greedy:
        num_accepted, next_token = accept_greedy(logits, drafts)
    else:
        q = None if proposal.probs is None else proposal.probs.to(logits.device)
        num_accepted, next_token = accept_sampled(sampler.probs(logits), drafts, q, sampler)
    num_accepted = int(num_accepted)
    return Verdict(drafts[:num_accepted], next_token, num_accepted < n,
                   None if features is None else drafter_features(out.hidden_states, slice(0, num_accepted + 1),
                                                                  features))


def verify_tree(target: torch.nn.Module, cache, tokens: torch.LongTensor, length: int, proposal: Proposal,
                sampler: Sampler, features: tuple[int, ...] | None) -> Verdict:
    """One target pass over [last token, the tree's nodes] under a mask that lets each node read
    only its own branch; keep the branch the target accepts (greedy: the longest it agrees with;
    sampling: :func:`accept_sampled_tree`), its cache entries moved up to follow the last token.
    A tree's drafts are deterministic (``proposal.probs`` is not read)."""
    drafts, parents = proposal.tokens.to(tokens.device), proposal.parents.tolist()
    out = target(torch.cat([tokens[length - 1 : length], drafts])[None], past_key_values=cache, use_cache=True,
                 logits_to_keep=drafts.numel() + 1, output_hidden_states=features is not None,
                 **tree_verification_inputs(parents, length - 1, target.dtype, tokens.device))
    if sampler.greedy:
        path, next_token = accept_greedy_tree(out.logits[0], drafts, parents)
    else:
        path, next_token = accept_sampled_tree(sampler.probs(out.logits[0]), drafts, parents, sampler)
    keep_positions(cache, length, [length + node for node in path])
    rejected = (path[-1] if path else -1) in parents  # the branch stopped where it had children
    return Verdict(drafts[path], torch.tensor(next_token), rejected,
                   None if features is None else drafter_features(out.hidden_states, [0, *(node + 1 for node in path)],
                                                                  features))


def check_proposal(proposal: Proposal, max_drafts: int, drafter: DrafterBase) -> None:
    """Raise if ``proposal`` drafts further ahead than the loop asked."""
    parents = proposal.parents
    depth = max(tree_depths(parents.tolist())) if parents is not None and parents.numel() else proposal.tokens.numel()
    if depth > max_drafts:
        drafted = f"returned {proposal.tokens.numel()} tokens" if parents is None else f"drafted {depth} tokens ahead"
        raise ValueError(f"{drafter.name}.propose {drafted}; it was asked for at most {max_drafts}")


def speculative_step(
    target: torch.nn.Module,
    cache,
    drafter: DrafterBase,
    tokens: torch.LongTensor,
    length: int,
    max_drafts: int,
    sampler: Sampler,
    stats: GenerationStats,
    now: Callable[[], float],
) -> int:
    """One draft / verify / accept iteration on ``tokens[:length]``; returns the new length.

    On entry the target cache holds ``tokens[:length - 1]``; on exit it holds all but the
    last token again. Tokens past the returned length are scratch space.
    """
    # 1. Draft: the drafter proposes up to max_drafts tokens (a chain, or a tree of them).
    t0 = now()
    proposal = drafter.propose(tokens[:length], max_drafts, sampler)
    check_proposal(proposal, max_drafts, drafter)
    t1 = now()

    # 2. Verify: one target pass reads every draft; a drafter that reads the target's
    #    features gets them from this same pass.
    is_tree = proposal.parents is not None and proposal.tokens.numel() > 0
    verify = verify_tree if is_tree else verify_chain
    verdict = verify(target, cache, tokens, length, proposal, sampler,
                     drafter.target_feature_layers if drafter.reads_target_features else None)
    t2 = now()

    # 3. Accept: the kept drafts, then the target's own token.
    num_accepted = verdict.accepted.numel()
    tokens[length : length + num_accepted] = verdict.accepted
    tokens[length + num_accepted] = verdict.next_token
    new_length = length + num_accepted + 1

    # 4. Roll back: the target cache read every draft; keep only the accepted ones.
    rollback(cache, new_length - 1)
    drafter.update(tokens[:new_length], num_accepted, verdict.features)

    stats.record_iteration(proposal, num_accepted, verdict.rejected, t1 - t0, t2 - t1)
    return new_length


@torch.inference_mode()
def speculative_generate(
    target: torch.nn.Module,
    draft: torch.nn.Module | Drafter,
    input_ids: torch.LongTensor,
    max_new_tokens: int = 64,
    num_draft_tokens: int = 5,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_token_id: int | Iterable[int] | None = None,
    generator: torch.Generator | None = None,
    streamer=None,
    target_tokenizer=None,
    draft_tokenizer=None,
    min_draft_confidence: float | None = None,
) -> GenerationOutput:
    """Generate with speculative decoding for one prompt.

    Args:
        target: the causal LM whose output is produced.
        draft: a same-tokenizer causal LM, or any :class:`~specdec_ref.drafters.Drafter`.
        input_ids: the prompt, shape [1, prompt_len].
        max_new_tokens: never more new tokens than this.
        num_draft_tokens: k, the most tokens drafted per iteration (>= 1).
        do_sample, temperature, top_k, top_p, generator: the decoding rule (see :class:`Sampler`).
        eos_token_id: stop after this token (or any of these); ``None`` takes the target's
            generation config, ``[]`` never stops early.
        streamer: a ``transformers`` streamer; tokens are pushed as they are accepted.
        target_tokenizer, draft_tokenizer: give both when the draft model may not share the
            target's tokenizer; if :func:`compare_tokenizers` finds the vocabularies differ,
            drafting goes through text (Universal Assisted Generation).
        min_draft_confidence: dynamic draft length: a draft model stops drafting after a
            token it gave less than this probability (``transformers``' assisted generation
            does this by default with 0.4). ``None`` always drafts ``num_draft_tokens``.

    Returns:
        :class:`GenerationOutput` with ``sequences`` [1, prompt_len + new] and ``stats``.
    """
    if not isinstance(num_draft_tokens, int) or num_draft_tokens < 1:
        raise ValueError(f"num_draft_tokens (k) must be an integer >= 1 (got {num_draft_tokens!r})")
    sampler = Sampler(do_sample, temperature, top_k, top_p, generator)
    prompt = check_request(target, input_ids, max_new_tokens, role="target")
    drafter = as_drafter(draft, target, target_tokenizer, draft_tokenizer, min_draft_confidence)
    drafter.start(prompt, max_new_tokens)
    eos = eos_ids(target, eos_token_id)
    now = clock(target.device)
    stats = GenerationStats(num_draft_tokens=num_draft_tokens, accepted_histogram=[0] * (num_draft_tokens + 1))
    start = now()

    end = prompt.numel() + max_new_tokens
    tokens = torch.empty(end, dtype=torch.long, device=target.device)
    tokens[: prompt.numel()] = prompt
    length = prompt.numel()
    if streamer is not None:
        streamer.put(prompt[None].cpu())

    cache = new_cache(target)
    if length > 1 and max_new_tokens > 0:
        # Prefill all but the last prompt token: the first verification pass reads that one.
        t0 = now()
        prefill = target(prompt[None, :-1], past_key_values=cache, use_cache=True, logits_to_keep=1,
                         output_hidden_states=drafter.reads_target_features)
        if drafter.reads_target_features:  # the prompt's features, but the last token's
            features = drafter_features(prefill.hidden_states, slice(None), drafter.target_feature_layers)
            drafter.update(prompt, 0, features)
        stats.prefill_seconds = now() - t0
        stats.target_forward_calls += 1

    while length < end:
        # Never draft past the budget: the last slot is the target's own token.
        new_length = speculative_step(
            target, cache, drafter, tokens, length, min(num_draft_tokens, end - length - 1), sampler, stats, now
        )
        hits = torch.isin(tokens[length:new_length], eos).nonzero()
        if hits.numel():
            new_length = length + int(hits[0]) + 1
        if streamer is not None:
            streamer.put(tokens[length:new_length].cpu())
        length = new_length
        if hits.numel():
            break

    stats.new_tokens = length - prompt.numel()
    stats.total_seconds = now() - start
    if streamer is not None:
        streamer.end()
    return GenerationOutput(sequences=tokens[None, :length].clone(), stats=stats)
