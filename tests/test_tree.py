"""Trees of drafts: one target pass verifies several branches, the longest agreeing one is kept."""
from __future__ import annotations

import random

import pytest
import torch

from factories import build, prompt
from specdec_ref import Proposal, Sampler, speculative_generate
from specdec_ref.kv_cache import new_cache, rollback
from specdec_ref.speculative import (accept_greedy_tree, accept_sampled_tree, accept_tree, tree_attention_mask,
                                      tree_depths, tree_verification_inputs)
from test_sampling_exactness import chi_square_pvalue

# A tree of 7 drafts: two branches from the last token (0 and 3), 0 -> 1 -> 2, 0 -> 6, 3 -> 4, 3 -> 5.
PARENTS = [-1, 0, 1, -1, 3, 3, 0]


def branch(parents: list[int], node: int) -> list[int]:
    """The nodes from the root's child down to ``node``."""
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def test_depths_mask_and_positions_by_hand():
    assert tree_depths(PARENTS) == [1, 2, 3, 1, 2, 2, 2]
    inputs = tree_verification_inputs(PARENTS, cached=3, dtype=torch.float32, device=torch.device("cpu"))
    readable = inputs["attention_mask"][0, 0] == 0
    assert readable.shape == (8, 3 + 8)
    assert readable[:, :4].all()  # everyone reads the cache and the last token
    for node in range(len(PARENTS)):
        expected = {0, *(n + 1 for n in branch(PARENTS, node))}
        assert set(readable[node + 1, 3:].nonzero().flatten().tolist()) == expected, node
    assert inputs["position_ids"].tolist() == [[3, 4, 5, 6, 4, 5, 5, 5]]


@pytest.mark.parametrize("family", ["llama", "gpt2", "qwen2"])
def test_a_tree_pass_gives_each_node_what_its_branch_alone_gives(family):
    """Rotary (llama, qwen2 with grouped heads) and learned (gpt2) positions: the tree pass's
    logits at every node equal a plain pass over its branch on the same cache."""
    model = build(family, 64, 2, seed=3)
    ids = prompt(9, seed=4)
    drafts = torch.randint(0, model.config.vocab_size, (len(PARENTS),), generator=torch.Generator().manual_seed(5))
    cache = new_cache(model)
    model(ids[:, :-1], past_key_values=cache, use_cache=True)
    tree = tree_verification_inputs(PARENTS, 8, model.dtype, ids.device)
    logits = model(torch.cat([ids[0, -1:], drafts])[None], past_key_values=cache, use_cache=True, **tree).logits[0]
    for node in range(len(PARENTS)):
        rollback(cache, 8)
        alone = model(torch.cat([ids[0, -1:], drafts[branch(PARENTS, node)]])[None], past_key_values=cache,
                      use_cache=True).logits[0, -1]
        assert torch.allclose(logits[node + 1], alone, atol=1e-4), (family, node)


def test_accept_greedy_tree_follows_the_target_by_hand():
    vocab = 10

    def logits_for(argmaxes: list[int]) -> torch.Tensor:
        return torch.nn.functional.one_hot(torch.tensor(argmaxes), vocab).float()

    drafts = torch.tensor([5, 6, 7, 8, 9, 1, 2])  # the tokens of PARENTS' nodes
    # the target after the last token says 8 (node 3), after node 3 says 1 (node 5), after node 5 says 4
    path, token = accept_greedy_tree(logits_for([8, 0, 0, 0, 1, 0, 4, 0]), drafts, PARENTS)
    assert (path, token) == ([3, 5], 4)
    path, token = accept_greedy_tree(logits_for([5, 6, 7, 3, 0, 0, 0, 0]), drafts, PARENTS)
    assert (path, token) == ([0, 1, 2], 3)  # the whole deepest branch, then the bonus token
    path, token = accept_greedy_tree(logits_for([4, 6, 7, 3, 0, 0, 0, 0]), drafts, PARENTS)
    assert (path, token) == ([], 4)  # no child of the last token agrees


class ScriptedTree:
    """A tree drafter that knows the target's greedy continuation: each iteration drafts a
    random tree (up to 6 nodes), each node the right token with probability 1/2 where its
    branch is right so far, a wrong one otherwise (siblings distinct). So the agreeing
    branch is sometimes the first, sometimes a later one, sometimes none."""

    def __init__(self, continuation: torch.LongTensor, vocab: int, seed: int) -> None:
        self.continuation, self.vocab, self.rng = continuation, vocab, random.Random(seed)
        self.accepted_later_branch = 0

    def start(self, prompt, max_new_tokens):
        self.proposals = []

    def propose(self, tokens, max_tokens, sampler):
        if max_tokens == 0:
            return Proposal(tokens.new_empty(0))
        parents, values, right, depths = [], [], [], []
        for node in range(self.rng.randint(1, 6)):
            parent = self.rng.choice([-1] + [n for n in range(node) if depths[n] < max_tokens])
            depth = 1 if parent < 0 else depths[parent] + 1
            truth = int(self.continuation[tokens.numel() + depth - 1])
            taken = {values[n] for n in range(node) if parents[n] == parent}
            is_right = (parent < 0 or right[parent]) and truth not in taken and self.rng.random() < 0.5
            wrong = [t for t in range(self.vocab) if t != truth and t not in taken]
            value = truth if is_right else self.rng.choice(wrong)
            parents.append(parent)
            values.append(value)
            right.append(is_right)
            depths.append(depth)
        self.proposals.append((parents, values))
        return Proposal(torch.tensor(values), parents=torch.tensor(parents))

    def update(self, tokens, num_accepted):
        parents, values = self.proposals[-1]
        first_children = [n for n, p in enumerate(parents) if p < 0]
        if num_accepted and int(tokens[-num_accepted - 1]) != values[first_children[0]]:
            self.accepted_later_branch += 1


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("prompt_len", [1, 9])
def test_random_trees_keep_greedy_identity(family_pair, k, prompt_len):
    family, target, _, _ = family_pair
    ids = prompt(prompt_len, seed=prompt_len)
    expected = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=40, do_sample=False,
                               pad_token_id=0, eos_token_id=[])
    drafter = ScriptedTree(expected[0], target.config.vocab_size, seed=k)
    out = speculative_generate(target, drafter, ids, max_new_tokens=40, num_draft_tokens=k, eos_token_id=[])
    assert torch.equal(out.sequences, expected), (family, k, prompt_len)
    stats = out.stats
    assert stats.target_forward_calls == stats.iterations + (prompt_len > 1)
    assert stats.drafted_tokens == sum(len(p) for p, _ in drafter.proposals)
    assert stats.tokens_per_target_pass > 1.2 and drafter.accepted_later_branch > 0


def test_eos_inside_an_accepted_branch_stops_there(family_pair):
    _, target, _, _ = family_pair
    ids = prompt(5, seed=11)
    free = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=30, do_sample=False,
                           pad_token_id=0, eos_token_id=[])
    eos = int(free[0, ids.shape[1] + 12])
    expected = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=30, do_sample=False,
                               pad_token_id=0, eos_token_id=eos)
    out = speculative_generate(target, ScriptedTree(free[0], target.config.vocab_size, seed=0), ids,
                               max_new_tokens=30, num_draft_tokens=3, eos_token_id=eos)
    assert torch.equal(out.sequences, expected) and out.sequences[0, -1] == eos


class OneTree:
    def __init__(self, parents: list[int]) -> None:
        self.parents = parents

    def start(self, prompt, max_new_tokens):
        pass

    def propose(self, tokens, max_tokens, sampler):
        return Proposal(torch.arange(len(self.parents)) + 3, parents=torch.tensor(self.parents))

    def update(self, tokens, num_accepted):
        pass


def test_a_tree_deeper_than_asked_is_refused(family_pair):
    _, target, _, _ = family_pair
    ids = prompt(4, seed=0)
    with pytest.raises(ValueError, match="drafted 3 tokens ahead; it was asked for at most 2"):
        speculative_generate(target, OneTree([-1, 0, 1, -1]), ids, max_new_tokens=8, num_draft_tokens=2)


def test_tree_attention_mask_by_hand():
    """Row/column 0 is the last verified token (the context): every node reads it; node i
    reads itself and its ancestors only."""
    mask = tree_attention_mask(PARENTS)
    assert mask.dtype == torch.bool and mask.shape == (8, 8)
    assert mask[:, 0].all() and mask[0].tolist() == [True] + [False] * 7
    for node in range(len(PARENTS)):
        assert set(mask[node + 1].nonzero().flatten().tolist()) == {0, *(n + 1 for n in branch(PARENTS, node))}
    assert torch.equal(tree_attention_mask([-1, 0, 1]), torch.ones(4, 4, dtype=torch.bool).tril())  # a chain is causal


def test_accept_tree_by_hand():
    tokens = [5, 6, 7, 8, 9, 1, 2]  # the tokens of PARENTS' nodes
    assert accept_tree(torch.tensor([8, 0, 0, 0, 1, 0, 4, 0]), tokens, PARENTS) == [3, 5]  # the second root's branch
    assert accept_tree(torch.tensor([5, 2, 7, 3, 0, 0, 0, 0]), tokens, PARENTS) == [0, 6]  # node 0's second child
    assert accept_tree(torch.tensor([4, 6, 7, 3, 0, 0, 0, 0]), tokens, PARENTS) == []


def test_the_loop_looks_the_mask_and_the_verdict_up_when_called(family_pair, monkeypatch):
    """A notebook swaps in its own tree_attention_mask and accept_tree through the module."""
    from specdec_ref import speculative

    _, target, _, _ = family_pair
    ids = prompt(5, seed=2)
    expected = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                               pad_token_id=0, eos_token_id=[])
    calls = {"mask": 0, "accept": 0}

    def counted(name, function):
        def wrapper(*args):
            calls[name] += 1
            return function(*args)
        return wrapper

    monkeypatch.setattr(speculative, "tree_attention_mask", counted("mask", tree_attention_mask))
    monkeypatch.setattr(speculative, "accept_tree", counted("accept", accept_tree))
    drafter = ScriptedTree(expected[0], target.config.vocab_size, seed=1)
    out = speculative_generate(target, drafter, ids, max_new_tokens=12, num_draft_tokens=2, eos_token_id=[])
    assert torch.equal(out.sequences, expected)
    assert calls["mask"] == calls["accept"] == len(drafter.proposals) > 0  # once per tree verified


def test_sampling_down_a_tree_yields_the_targets_distribution():
    """The multi-candidate rule: whichever children a node has, and in whatever order, the token
    that follows it (an accepted child's, or the target's own) is distributed as p; an accepted
    child's own children are then judged against its row of p."""
    p = torch.tensor([[0.30, 0.05, 0.25, 0.15, 0.25, 0.00],
                      [0.10, 0.10, 0.10, 0.10, 0.10, 0.50],
                      [0.00, 0.00, 0.00, 0.00, 0.00, 1.00],
                      [0.20, 0.20, 0.20, 0.20, 0.20, 0.00]])
    drafts, parents = torch.tensor([2, 5, 4]), [-1, -1, 0]  # two children of the last token; node 0 has one
    sampler = Sampler(do_sample=True, generator=torch.Generator().manual_seed(0))
    first, after_node_0 = torch.zeros(6), torch.zeros(6)
    for _ in range(6000):
        path, token = accept_sampled_tree(p, drafts, parents, sampler)
        emitted = [int(drafts[n]) for n in path] + [token]
        first[emitted[0]] += 1
        if path[:1] == [0]:
            after_node_0[emitted[1]] += 1
    assert first[5] == 0  # a token p gives 0 is never emitted, though it was drafted
    assert chi_square_pvalue(first, p[0]) > 1e-3
    assert chi_square_pvalue(after_node_0, p[1]) > 1e-3
