"""EAGLE drafting: a head that reads the target's features, in the one speculative loop.

The head is trained here for a few seconds on a tiny random target's own greedy outputs. A
random target's function cannot be learned from so little, so the head is accepted on the
sequences it was trained on (prompts are their prefixes) and rejected beyond them: every
acceptance length, and so every rollback, runs.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from factories import build, prompt
from specdec_ref import Sampler, speculative_generate
from specdec_ref.costs import Costs
from specdec_ref.eagle import (DraftHead, DraftTree, EagleConfig, EagleDrafter, eagle_inputs, init_head, load_head,
                               save_head, widen_head)
from specdec_ref.kernels.weights_first import WeightsFirstLinear, is_weights_first, weights_first
from specdec_ref.recipes import eagle_data, eagle_head
from specdec_ref.vllm import command
from test_sampling_exactness import PROMPT, VOCAB, chi_square_pvalue, exact_joint, sample_counts

EOS = 2


def greedy_reference(target, ids, max_new_tokens, eos=None):
    return target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                           do_sample=False, pad_token_id=0, eos_token_id=eos if eos is not None else [])


def trained_head(target, ckpt: Path, sequences: list[torch.Tensor], seed: int = 0, steps: int = 300, head=None):
    """A head fitted on ``sequences`` (the target's own greedy continuations): a fresh one, or
    ``head`` trained on (with the lower layers it reads)."""
    layers = () if head is None else head.config.feature_layers
    data = eagle_data.target_features(target, sequences, feature_layers=layers)
    budget = eagle_data.Budget(gen_batch=1, new_tokens=1, greedy_batches=0, greedy_minutes=0, sampled_batches=0,
                               sampled_minutes=0, code_prompts=0, extra_code_prompts=0,
                               draft_vocab=target.config.vocab_size, steps=steps, train_minutes=0, batch_tokens=256,
                               lr=1e-2, eval_every_tokens=10**9)
    head = init_head(EagleConfig.for_target(target.config), seed) if head is None else head
    eagle_head.frozen_float(target)
    to_draft, lm_weight = eagle_head.draft_lm_head(target, None)
    record = eagle_head.train_head(head, target, data, {"train": data[:4]}, to_draft, lm_weight, budget, ckpt)
    return head, record


@pytest.fixture(scope="module")
def target_and_head(tmp_path_factory):
    target = build("llama", 64, 2, seed=7)
    sequences = [greedy_reference(target, prompt(6, seed=100 + i), 40)[0] for i in range(24)]
    head, record = trained_head(target, tmp_path_factory.mktemp("eagle") / "ckpt", sequences)
    return target, head, record, sequences


class Recording(EagleDrafter):
    """Records every feature handed over, and checks after each verification that the
    incrementally kept head cache equals one rebuilt from scratch on the same sequence."""

    def start(self, prompt, max_new_tokens):
        super().start(prompt, max_new_tokens)
        self.received: list[torch.Tensor] = []
        self.iterations_checked = 0

    def update(self, tokens, num_accepted, features=None):
        super().update(tokens, num_accepted, features)
        if features is not None:
            self.received.append(features.clone())

    def propose(self, tokens, max_tokens, sampler):
        proposal = super().propose(tokens, max_tokens, sampler)
        if self.cached and max_tokens and sampler.greedy:
            fresh = EagleDrafter(self.head, self.target, self.draft_vocab, first_candidates=self.first_candidates,
                                 tree=self.tree)
            fresh.start(tokens, 0)
            fresh.update(tokens, 0, torch.cat(self.received))
            again = fresh.propose(tokens, max_tokens, sampler)
            assert torch.equal(again.tokens, proposal.tokens), "incremental drafts differ from a fresh drafter's"
            # A stale entry (from a predicted feature) differs by O(1); float32 sums in another
            # order, by about 1e-5 of the values.
            assert fresh.keys.shape == self.keys.shape, "the head cache was not rolled back"
            assert torch.allclose(fresh.keys, self.keys, rtol=1e-4, atol=1e-4), "the head cache was not rolled back"
            self.iterations_checked += 1
        return proposal


def test_training_learns_the_target(target_and_head):
    record = target_and_head[2]
    first, last = record["curve"][0]["train"], record["curve"][-1]["train"]
    assert last[0] > max(0.5, first[0] + 0.3), record["curve"]  # depth-1 agreement
    assert last[1] > first[1]  # depth 2, drafted from its own predicted feature


def test_held_out_agreement_counts_only_the_scored_positions(target_and_head):
    """The learning curve scores a held-out continuation from ``scored_from`` on (its prompt
    is trained on, never scored)."""
    target, head, _, sequences = target_and_head
    data = eagle_data.target_features(target, sequences[:3])
    scored = eagle_data.target_features(target, sequences[:3], scored_from=[10, 10, 10])
    assert [d.scored_from for d in data] == [0] * 3 and [d.scored_from for d in scored] == [10] * 3
    to_draft, lm_weight = eagle_head.draft_lm_head(target, None)
    embed = target.get_input_embeddings()
    _, whole = eagle_head.head_losses(head, embed, lm_weight, to_draft, eagle_data.collate(data))
    _, part = eagle_head.head_losses(head, embed, lm_weight, to_draft, eagle_data.collate(scored))
    lengths = [d.ids.numel() for d in data]
    assert [n for _, n in whole] == [sum(n - 1 for n in lengths), sum(n - 2 for n in lengths)]
    assert [n for _, n in part] == [sum(n - 10 for n in lengths)] * 2
    assert all(right_part <= right for (right_part, _), (right, _) in zip(part, whole))
    # best_of=N: right where the target's token is among the head's best N (all of them: every position)
    # (an untrained head, which the trained one's near-perfect fit of these sequences would hide)
    fresh = init_head(EagleConfig.for_target(target.config), seed=1)
    right = [[r for r, _ in eagle_head.head_losses(fresh, embed, lm_weight, to_draft, eagle_data.collate(scored),
                                               best_of=n)[1]] for n in (1, 2, 16, target.config.vocab_size)]
    assert all(a <= b for fewer, more in zip(right, right[1:]) for a, b in zip(fewer, more)), right
    assert right[2][0] > right[0][0] and right[-1] == [n for _, n in part], right


@pytest.mark.parametrize("first_candidates", [1, 3])
@pytest.mark.parametrize("k", [1, 3, 6])
@pytest.mark.parametrize("prompt_len", [1, 2, 12])
def test_greedy_identity_feature_handoff_and_rollback(target_and_head, k, prompt_len, first_candidates):
    """Chains, and trees (the head's best 3 first tokens): the features handed over are those
    of the accepted branch, moved up in the target's cache to follow the sequence."""
    target, head, _, sequences = target_and_head
    ids = sequences[prompt_len][None, :prompt_len]
    expected = greedy_reference(target, ids, 40)
    drafter = Recording(head, target, first_candidates=first_candidates)
    out = speculative_generate(target, drafter, ids, max_new_tokens=40, num_draft_tokens=k, eos_token_id=[])
    assert torch.equal(out.sequences, expected), f"k={k}, prompt of {prompt_len}"
    # The features handed over are the target's own, one per position its cache holds, in order.
    received = torch.cat(drafter.received)
    full = target(out.sequences[:, :-1], output_hidden_states=True).hidden_states[-1][0]
    assert received.shape == full.shape
    assert torch.allclose(received, full, atol=1e-4)
    stats = out.stats
    assert stats.target_forward_calls == stats.iterations + (prompt_len > 1)  # no extra target pass
    assert stats.draft_forward_calls == stats.drafted_tokens - (first_candidates - 1) * sum(stats.accepted_histogram)
    assert drafter.iterations_checked >= stats.iterations - 2
    if k > 1 and prompt_len >= 6:  # accepted along its training sequence (a 6-token prompt's), rejected past its end
        assert stats.tokens_per_target_pass > 1.5
        assert stats.rejections > 0


def test_first_candidates_are_the_heads_next_best_and_only_when_greedy(target_and_head):
    """With first_candidates=3 a greedy proposal is the chain, then the head's second and third
    choices for the first position (children of the last token, within the draft vocabulary);
    a sampled proposal stays a chain (its q is exact for one token per position)."""
    target, head, _, sequences = target_and_head
    ids = sequences[4][:10]
    vocab = torch.arange(0, target.config.vocab_size, 2)
    tree, chain = EagleDrafter(head, target, vocab, first_candidates=3), EagleDrafter(head, target, vocab)
    features = target(ids[None, :-1], output_hidden_states=True).hidden_states[-1][0]
    for drafter in (tree, chain):
        drafter.start(ids, 8)
        drafter.update(ids, 0, features)
    proposal, plain = tree.propose(ids, 4, Sampler()), chain.propose(ids, 4, Sampler())
    assert proposal.parents.tolist() == [-1, 0, 1, 2, -1, -1]
    assert torch.equal(proposal.tokens[:4], plain.tokens) and proposal.forward_calls == 4
    predicted, _ = head(tree.embed(ids[1:])[None], features[None], torch.arange(9))
    assert proposal.tokens[[0, 4, 5]].tolist() == vocab[tree.lm_head(predicted[0, -1]).topk(3).indices].tolist()
    tree.start(ids, 8)
    tree.update(ids, 0, features)
    sampled = tree.propose(ids, 4, Sampler(do_sample=True, generator=torch.Generator().manual_seed(0)))
    assert sampled.parents is None and sampled.tokens.numel() == 4 and sampled.probs.shape[0] == 4
    with pytest.raises(ValueError, match="first_candidates must be an integer >= 1"):
        EagleDrafter(head, target, first_candidates=0)


@pytest.mark.parametrize("k", [1, 3, 6])
@pytest.mark.parametrize("prompt_len", [1, 2, 12])
def test_dynamic_tree_greedy_identity_feature_handoff_and_rollback(target_and_head, k, prompt_len):
    """EAGLE-2's dynamic tree in the loop: the target's own greedy text, the features of the
    accepted branch handed over, the head's cache rolled back to its real entries."""
    target, head, _, sequences = target_and_head
    ids = sequences[prompt_len][None, :prompt_len]
    drafter = Recording(head, target, tree=DraftTree(top_k=3, max_nodes=10))
    out = speculative_generate(target, drafter, ids, max_new_tokens=40, num_draft_tokens=k, eos_token_id=[])
    assert torch.equal(out.sequences, greedy_reference(target, ids, 40)), f"k={k}, prompt of {prompt_len}"
    full = target(out.sequences[:, :-1], output_hidden_states=True).hidden_states[-1][0]
    assert torch.allclose(torch.cat(drafter.received), full, atol=1e-4)
    stats = out.stats
    assert stats.target_forward_calls == stats.iterations + (prompt_len > 1)
    assert stats.draft_forward_calls <= k * stats.iterations  # one head call per depth
    assert drafter.iterations_checked >= stats.iterations - 2
    if prompt_len > 1:
        assert stats.drafted_tokens > stats.draft_forward_calls  # wider than a chain
    if k > 1 and prompt_len >= 6:
        assert stats.tokens_per_target_pass > 1.5 and stats.rejections > 0


@torch.inference_mode()
def branch_log_probs(head, target, vocab, ids, features, branch: list[int]) -> list[torch.Tensor]:
    """The head's log-probabilities over the draft vocabulary after each prefix of ``branch``,
    drafted as a chain from scratch (one position at a time, causal): what the tree's masked,
    batched expansion must reproduce for every node."""
    chain = EagleDrafter(head, target, vocab)
    chain.start(ids, 8)
    predicted = chain.run_head(ids[1:], features[None], torch.arange(ids.numel() - 1))[-1:]
    out = []
    for position, token in enumerate([None, *branch]):
        if token is not None:  # the branch's tokens sit after the sequence's last real position
            predicted = chain.run_head(torch.tensor([token]), predicted[None], torch.tensor([ids.numel() - 2 + position]))
        out.append(torch.log_softmax(chain.lm_head(predicted[-1]).float(), -1))
    return out


def test_dynamic_tree_nodes_are_the_heads_best_branches(target_and_head):
    """Each node is among the head's top_k after its own branch (recomputed as a chain from
    scratch, so the tree's masks and positions are checked); the nodes kept are the most probable
    branches; a top_k of 1 is the chain; a draft cost above any branch's probability stops at depth 1."""
    target, head, _, sequences = target_and_head
    ids = sequences[4][:10]
    vocab = torch.arange(0, target.config.vocab_size, 2)
    features = target(ids[None, :-1], output_hidden_states=True).hidden_states[-1][0]

    def propose(k: int, tree: DraftTree | None):
        drafter = EagleDrafter(head, target, vocab, tree=tree)
        drafter.start(ids, 8)
        drafter.update(ids, 0, features)
        return drafter.propose(ids, k, Sampler())

    chain = propose(4, None)
    one = propose(4, DraftTree(top_k=1, max_nodes=4))
    assert torch.equal(one.tokens, chain.tokens) and one.parents.tolist() == [-1, 0, 1, 2] and one.forward_calls == 4
    wide = propose(4, DraftTree(top_k=3, max_nodes=12))
    tokens, parents = wide.tokens.tolist(), wide.parents.tolist()
    assert len(tokens) == 12 and wide.forward_calls == 4
    assert all(parent < node for node, parent in enumerate(parents))  # parents first
    scores = []
    for node in range(len(tokens)):
        branch = [node]
        while parents[branch[0]] >= 0:
            branch.insert(0, parents[branch[0]])
        assert len(branch) <= 4
        log_probs = branch_log_probs(head, target, vocab, ids, features, [tokens[n] for n in branch[:-1]])
        best = vocab[log_probs[-1].topk(3).indices].tolist()
        assert tokens[node] in best, f"node {node} is not among the head's best 3 after its branch"
        scores.append(sum(float(lp[int((vocab == tokens[n]).nonzero())]) for lp, n in zip(log_probs, branch)))
    siblings = {}
    for node, parent in enumerate(parents):
        siblings.setdefault(parent, []).append(tokens[node])
    assert all(len(set(group)) == len(group) for group in siblings.values())
    depth_one = [tokens[n] for n in range(len(tokens)) if parents[n] == -1]
    assert set(depth_one) <= set(vocab[branch_log_probs(head, target, vocab, ids, features, [])[0].topk(3).indices].tolist())
    # Kept: no dropped depth-1 candidate is more probable than the least probable node kept.
    first = branch_log_probs(head, target, vocab, ids, features, [])[0]
    dropped = [float(first[i]) for i in first.topk(3).indices if int(vocab[i]) not in depth_one]
    assert all(score <= min(scores) + 1e-5 for score in dropped)
    shallow = propose(4, DraftTree(top_k=3, max_nodes=12, draft_cost=2.0))
    assert shallow.parents.tolist() == [-1, -1, -1] and shallow.forward_calls == 1


def test_the_number_of_nodes_follows_the_measured_costs():
    """n maximises (1 + the n best branch probabilities) / (depth * c + v(n)); v between the
    measured counts is interpolated."""
    scores = [0.9, 0.5, 0.2, 0.1, 0.05, 0.05]
    assert DraftTree(max_nodes=5).nodes_to_verify(scores, 3) == 5  # no costs: as many as allowed
    flat = DraftTree(max_nodes=8, verify_costs={1: 1.0, 8: 1.0})
    assert flat.nodes_to_verify(scores, 3) == 6  # a free node always pays
    steep = DraftTree(max_nodes=8, verify_costs={1: 1.0, 2: 2.0, 4: 4.0, 8: 8.0})
    assert steep.nodes_to_verify(scores, 1) == 1
    mild = DraftTree(max_nodes=8, draft_cost=0.2, verify_costs={1: 1.05, 2: 1.1, 4: 1.3, 8: 2.0})
    # by hand: 2.6 / (0.6 + 1.2) = 1.444 beats 2.4 / 1.7 = 1.412 and 2.7 / 1.9 = 1.421
    assert mild.nodes_to_verify(scores, 3) == 3
    assert mild.verify_cost(3) == pytest.approx(1.2) and mild.verify_cost(0) == 1.0
    assert mild.verify_cost(16) == pytest.approx(4.0)  # past the last measurement: in proportion
    costs = Costs(64, 0.01, 0.15, (0.1, 0.2), {2: 1.1, 4: 1.2, 16: 1.9}, {})
    tree = DraftTree.from_costs(costs, top_k=5)
    assert (tree.top_k, tree.max_nodes, tree.draft_cost, tree.verify_cost(4)) == (5, 16, 0.15, 1.2)
    # measured on a busy machine: v(2) < v(1) and v(8) < v(6) are noise; a pass is never cheaper than a step
    noisy = Costs(64, 0.01, 0.1, (0.1, 0.1), {1: 0.95, 2: 0.9, 4: 1.1, 6: 1.5, 8: 0.95, 15: 2.0}, {})
    assert DraftTree.from_costs(noisy).verify_costs == {1: 1.0, 2: 1.0, 4: 1.1, 6: 1.5, 8: 1.5, 15: 2.0}
    with pytest.raises(ValueError, match="top_k must be an integer >= 1"):
        DraftTree(top_k=0)
    with pytest.raises(ValueError, match="verify_costs map node counts >= 1 to costs > 0"):
        DraftTree(verify_costs={0: 1.0})


def test_a_tree_excludes_first_candidates_and_min_confidence(target_and_head):
    target, head, _, _ = target_and_head
    with pytest.raises(ValueError, match="give tree, or first_candidates and min_confidence, not both"):
        EagleDrafter(head, target, first_candidates=2, tree=DraftTree())


def test_every_acceptance_length_occurs(target_and_head):
    target, head, _, sequences = target_and_head
    hist = torch.zeros(5, dtype=torch.long)
    for seq in sequences[:6]:
        out = speculative_generate(target, EagleDrafter(head, target), seq[None, :10], max_new_tokens=48,
                                   num_draft_tokens=4, eos_token_id=[])
        hist += torch.tensor(out.stats.accepted_histogram)
    assert (hist > 0).all(), hist


def test_eos_stops_exactly(target_and_head):
    target, head, _, sequences = target_and_head
    ids = sequences[3][None, :7]
    free = greedy_reference(target, ids, 40)[0, ids.shape[1]:]
    eos = int(free[len(free) // 2])  # a token the target emits mid-way
    expected = greedy_reference(target, ids, 40, eos=eos)
    out = speculative_generate(target, EagleDrafter(head, target), ids, max_new_tokens=40, num_draft_tokens=4,
                               eos_token_id=eos)
    assert torch.equal(out.sequences, expected)
    assert out.sequences[0, -1] == eos


def test_draft_vocabulary_restricts_drafts_and_keeps_identity(target_and_head):
    target, head, _, sequences = target_and_head
    ids = sequences[5][None, :8]
    vocab = torch.arange(0, target.config.vocab_size, 2)  # even ids only
    drafts = []

    class Spy(EagleDrafter):
        def propose(self, tokens, max_tokens, sampler):
            proposal = super().propose(tokens, max_tokens, sampler)
            drafts.append(proposal.tokens)
            return proposal

    out = speculative_generate(target, Spy(head, target, vocab), ids, max_new_tokens=32, num_draft_tokens=3,
                               eos_token_id=[])
    assert torch.equal(out.sequences, greedy_reference(target, ids, 32))
    assert all((d % 2 == 0).all() for d in drafts) and sum(d.numel() for d in drafts) > 0


@pytest.mark.parametrize("tree", [None, DraftTree(top_k=3, max_nodes=6)], ids=["chain", "dynamic tree"])
def test_sampling_is_exact_with_the_head(tree):
    """The first two new tokens follow the target's warped distribution (chi-square), with a
    draft vocabulary so q is zero on some tokens the target may emit; as a chain (q the head's),
    and as a tree (each node's children judged in turn: the multi-candidate rule), drafting two
    deep within the first iteration."""
    target = build("llama", 32, 1, seed=10, vocab=VOCAB)
    head = init_head(EagleConfig.for_target(target.config), seed=3)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.3 * torch.randn_like(p))
    sampler = Sampler(do_sample=True, temperature=0.9, top_k=6)
    drafter = EagleDrafter(head, target, torch.tensor([0, 1, 3, 4, 6]), tree=tree)
    new_tokens = 2 if tree is None else 3
    counts = sample_counts(lambda g: speculative_generate(target, drafter, PROMPT, max_new_tokens=new_tokens,
                                                          num_draft_tokens=2, do_sample=True, temperature=0.9,
                                                          top_k=6, generator=g, eos_token_id=[]))
    assert chi_square_pvalue(counts, exact_joint(target, sampler)) > 1e-3


def test_stored_features_are_kept_per_data_file_and_computed_again_when_it_changes(tmp_path, target_and_head):
    """The recipe's prefill over the stored continuations is cached one data file at a time:
    a rerun reads it back without a target pass and gets the same values; a changed file,
    and only that file, is computed again."""
    target, _, _, sequences = target_and_head
    data, cache = tmp_path / "data", tmp_path / "cache"
    data.mkdir()

    def store(name: str, seqs: list[torch.Tensor]) -> None:
        np.savez(data / name, ids=torch.cat(seqs).numpy().astype(np.uint16),
                 lengths=np.array([len(s) for s in seqs], dtype=np.int32),
                 prompt_lens=np.full(len(seqs), 6, dtype=np.int32))

    store("greedy-00000.npz", sequences[:3])
    store("sampled-00000.npz", sequences[3:5])
    passes = []
    hook = target.model.register_forward_hook(lambda *_: passes.append(1))
    try:
        uncached = eagle_data.stored_features(target, data)
        eagle_data.stored_features(target, data, cache)
        computed = len(passes)
        again = eagle_data.stored_features(target, data, cache)
        assert len(passes) == computed, "cached features were computed again"
        store("sampled-00000.npz", sequences[5:7])
        changed = eagle_data.stored_features(target, data, cache)
        assert len(passes) == computed + 1, "a changed data file, and only it, is computed again (one chunk)"
    finally:
        hook.remove()
    assert sorted(p.name for p in cache.iterdir()) == ["greedy-00000.float32.pt", "sampled-00000.float32.pt"]
    for a, b in zip(uncached, again, strict=True):
        assert torch.equal(a.ids, b.ids) and torch.equal(a.features, b.features) and torch.equal(a.labels, b.labels)
    fresh = eagle_data.target_features(target, sequences[5:7])
    assert [torch.equal(a.ids, b.ids) and torch.equal(a.features, b.features) for a, b in zip(changed[3:], fresh)] \
        == [True, True]


def test_save_and_load_round_trip(tmp_path, target_and_head):
    target, head = target_and_head[:2]
    vocab = torch.arange(0, 200)
    save_head(head, tmp_path, vocab, target.config, {"note": "test"})
    loaded, loaded_vocab = load_head(tmp_path)
    assert torch.equal(loaded_vocab, vocab)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["EagleLlamaForCausalLM"] and config["num_hidden_layers"] == 1
    names = set(loaded.state_dict())
    assert "fc.weight" in names and "layers.0.self_attn.q_proj.weight" in names
    for name, value in head.state_dict().items():  # stored in bfloat16
        assert torch.equal(loaded.state_dict()[name], value.to(torch.bfloat16).float())


def test_a_drafter_without_features_is_refused(target_and_head):
    target, head = target_and_head[:2]
    drafter = EagleDrafter(head, target)
    ids = prompt(6)[0]
    drafter.start(ids, 8)
    with pytest.raises(RuntimeError, match="target features for 0 positions of 6"):
        drafter.propose(ids, 3, Sampler())


@pytest.mark.parametrize("draft_vocab", [False, True])
def test_a_weights_first_target_puts_the_head_on_the_same_form(target_and_head, draft_vocab):
    target, head, _, sequences = target_and_head
    vocab = torch.arange(0, target.config.vocab_size, 2) if draft_vocab else None
    computed = weights_first(target)
    drafter = EagleDrafter(head, computed, vocab)
    assert is_weights_first(drafter.head) and isinstance(drafter.lm_head, WeightsFirstLinear)
    assert not is_weights_first(head), "the head given is left as it was"
    if vocab is None:
        assert drafter.lm_head.weight is target.lm_head.weight, "the target's own LM head, not a copy"
    ids = sequences[6][None, :6]
    out = speculative_generate(computed, drafter, ids, max_new_tokens=40, num_draft_tokens=3, eos_token_id=[])
    assert torch.equal(out.sequences, greedy_reference(target, ids, 40))
    if not draft_vocab:  # accepted along its training sequence, as on the stock layers
        assert out.stats.tokens_per_target_pass > 1.5


def test_eagle_inputs_put_the_next_tokens_embedding_before_each_feature(target_and_head):
    target = target_and_head[0]
    embed = target.get_input_embeddings()
    features, ids = torch.randn(4, 64), torch.tensor([7, 8, 9, 10, 11])
    rows = eagle_inputs(features, ids, embed)
    assert rows.shape == (4, 128)
    assert torch.equal(rows[:, :64], embed(ids[1:])) and torch.equal(rows[:, 64:], features)
    with pytest.raises(ValueError, match="need one token more than features"):
        eagle_inputs(features, ids[:4], embed)


@pytest.mark.parametrize("draft_vocab", [False, True])
def test_draft_head_steps_draft_the_chain_the_drafter_proposes(target_and_head, draft_vocab):
    """One step on the context's rows, then one row per draft, each reading the head's own
    predicted feature: the EagleDrafter's chain (it runs the context and the first draft in one
    call); truncate drops the drafts' entries, and top_tokens are the drafter's first candidates."""
    target, head, _, sequences = target_and_head
    vocab = torch.arange(0, target.config.vocab_size, 2) if draft_vocab else None
    ids = sequences[2][:12]
    features = target(ids[None, :-1], output_hidden_states=True).hidden_states[-1][0]
    reference = EagleDrafter(head, target, vocab, first_candidates=3)
    reference.start(ids, 8)
    reference.update(ids, 0, features)
    proposal = reference.propose(ids, 4, Sampler())

    drafting = DraftHead(head, target, vocab)
    predicted = drafting.step(eagle_inputs(features, ids, drafting.embed))
    assert predicted.shape == (11, 64) and drafting.length == 11
    assert torch.allclose(drafting.keys, reference.keys[:, :, :11], atol=1e-5)
    chain, feature = [drafting.greedy_token(predicted[-1])], predicted[-1:]
    firsts = drafting.top_tokens(predicted[-1], 3)
    for _ in range(3):
        feature = drafting.step(torch.cat([drafting.embed(torch.tensor(chain[-1:])), feature], dim=-1))
        chain.append(drafting.greedy_token(feature))
    assert chain == proposal.tokens[:4].tolist() and firsts == proposal.tokens[[0, 4, 5]].tolist()
    assert firsts[0] == chain[0] and (not draft_vocab or all(t % 2 == 0 for t in chain + firsts))
    assert drafting.length == 14
    drafting.truncate(11)
    assert drafting.length == 11 and torch.equal(drafting.keys, drafting.keys[:, :, :11])
    with pytest.raises(ValueError, match="step reads input rows of shape"):
        drafting.step(features)


# --- a multi-layer head (EAGLE-3): the tiny target's layer-1 input fused with its top feature ----------


@pytest.fixture(scope="module")
def multi_layer_head(target_and_head, tmp_path_factory):
    """The trained head widened to read layer 1's input too, then trained on: its fuse reads that layer."""
    target, head, _, sequences = target_and_head
    wide = widen_head(copy.deepcopy(head), (1,))
    trained, record = trained_head(target, tmp_path_factory.mktemp("eagle3") / "ckpt", sequences, steps=60, head=wide)
    return trained, record


def test_a_widened_head_starts_as_the_head_it_widens(target_and_head):
    """Before training, the fuse passes the top feature through: the same drafts, pass for pass."""
    target, head, _, sequences = target_and_head
    wide = widen_head(head, (1,))
    assert wide.num_parameters == head.num_parameters + 2 * head.config.hidden_size ** 2
    ids = sequences[6][None, :6]
    runs = [speculative_generate(target, EagleDrafter(h, target), ids, 40, 3, eos_token_id=[]) for h in (head, wide)]
    assert torch.equal(runs[0].sequences, runs[1].sequences)
    assert runs[0].stats.accepted_histogram == runs[1].stats.accepted_histogram
    with pytest.raises(ValueError, match="already reads layers"):
        widen_head(wide, (1,))


def test_fused_features_normalise_each_lower_layer_and_check_their_width(multi_layer_head):
    head, _ = multi_layer_head
    d = head.config.hidden_size
    assert head.fuse.weight[:, :d].abs().max() > 0, "training left the lower layer unread"
    features = torch.randn(5, 2 * d)
    scaled = torch.cat([features[:, :d] * 300, features[:, d:]], -1)  # the residual stream's scale varies
    torch.testing.assert_close(head.fuse_features(scaled), head.fuse_features(features), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match=f"reads {2 * d} values a position"):
        head.fuse_features(features[:, :d])


@pytest.mark.parametrize("tree", [None, DraftTree(top_k=3, max_nodes=6)], ids=["chain", "dynamic tree"])
@pytest.mark.parametrize("prompt_len", [1, 12])
def test_a_multi_layer_head_gets_the_lower_layer_and_keeps_the_output(target_and_head, multi_layer_head, tree,
                                                                       prompt_len):
    """The loop hands a multi-layer head each position's layer-1 input beside its top feature, for the
    accepted branch only; the output is the target's greedy output."""
    target, _, _, sequences = target_and_head
    head, record = multi_layer_head
    ids = sequences[prompt_len][None, :prompt_len]
    drafter = Recording(head, target, tree=tree)
    out = speculative_generate(target, drafter, ids, max_new_tokens=40, num_draft_tokens=3, eos_token_id=[])
    assert torch.equal(out.sequences, greedy_reference(target, ids, 40))
    states = target(out.sequences[:, :-1], output_hidden_states=True).hidden_states
    received = torch.cat(drafter.received)
    torch.testing.assert_close(received, torch.cat([states[1][0], states[-1][0]], -1), rtol=1e-4, atol=1e-4)
    if prompt_len == 12:  # accepted along its training sequence
        assert out.stats.tokens_per_target_pass > 1.5, record["curve"][-1]


def test_a_multi_layer_head_saves_its_layers_and_vllm_is_not_given_it(tmp_path, target_and_head, multi_layer_head):
    target = target_and_head[0]
    head, _ = multi_layer_head
    save_head(head, tmp_path, None, target.config)
    loaded, _ = load_head(tmp_path)
    assert loaded.config.feature_layers == (1,) and torch.equal(loaded.fuse.weight, head.fuse.weight.bfloat16().float())
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["SpecdecMultiLayerEagleHead"]
    with pytest.raises(ValueError, match="multi-layer EAGLE head .* layers \\[1\\]"):
        command.check_draft("eagle", str(tmp_path), "zoo:target")
