"""trace_generate observes speculative_generate: same tokens, and per-iteration records that
match the loop's invariants (target cache = all but the last token, rollback to the kept prefix)."""
from __future__ import annotations

import pytest
import torch

from factories import build, noisy_copy, prompt
from specdec_ref import PromptLookupDrafter, speculative_generate
from specdec_ref.trace import trace_generate

PROMPT_LEN = 9


@pytest.fixture(scope="module")
def pair():
    target = build("llama", 64, 2, seed=0)
    return target, noisy_copy(target, 0.05, seed=1)


def check_target_caches(iterations, prompt_len: int) -> None:
    length = prompt_len
    for it in iterations:
        before, verified, after = it.target_cache
        assert before == length - 1  # the cache holds all but the last token on entry
        assert verified == before + len(it.drafts) + 1  # the verify pass read the last token and every draft
        assert after == before + it.accepted + 1  # rolled back to the kept prefix
        length += len(it.emitted)


@pytest.mark.parametrize("do_sample", [False, True], ids=["greedy", "sampled"])
def test_trace_matches_speculative_generate(pair, do_sample):
    target, draft = pair
    ids = prompt(PROMPT_LEN)
    kwargs = dict(max_new_tokens=40, num_draft_tokens=4, do_sample=do_sample, eos_token_id=[])
    expected = speculative_generate(target, draft, ids, generator=torch.Generator().manual_seed(3), **kwargs)
    out, iterations = trace_generate(target, draft, ids, generator=torch.Generator().manual_seed(3), **kwargs)
    assert torch.equal(out.sequences, expected.sequences)
    assert len(iterations) == out.stats.iterations
    assert [t for it in iterations for t in it.emitted] == out.sequences[0, PROMPT_LEN:].tolist()
    assert sum(it.accepted for it in iterations) == out.stats.accepted_tokens
    assert {it.bonus for it in iterations} == {True, False}  # both endings occur with this pair
    check_target_caches(iterations, PROMPT_LEN)


def test_draft_cache_rollback(pair):
    target, draft = pair
    out, iterations = trace_generate(target, draft, prompt(PROMPT_LEN), max_new_tokens=40, num_draft_tokens=4,
                                     eos_token_id=[])
    length = PROMPT_LEN
    for it in iterations:
        before, drafted, after = it.draft_cache
        # The draft reads what it has not seen yet, then feeds all drafts but the last.
        assert drafted == length + len(it.drafts) - 1
        # Kept: everything up to the target's new token, which the draft has not read yet.
        assert after == min(drafted, length + it.accepted)
        length += len(it.emitted)
    assert iterations[0].draft_cache[0] == 0  # a fresh cache per generation


def test_rejected_and_bonus_views(pair):
    target, draft = pair
    _, iterations = trace_generate(target, draft, prompt(PROMPT_LEN), max_new_tokens=40, num_draft_tokens=4,
                                   eos_token_id=[])
    for it in iterations:
        assert it.bonus == (bool(it.drafts) and it.rejected == [])
        if it.rejected:  # greedy: the correction differs from the rejected draft
            assert it.target_token != it.rejected[0]


def test_an_iteration_that_drafted_nothing_is_a_plain_step_not_a_bonus():
    """With one token left (or nothing to copy) the loop drafts nothing: its token is the
    target's plain step, neither a bonus (no draft was kept) nor a correction."""
    from specdec_ref.trace import Iteration, iterations_html

    plain = Iteration(drafts=[], accepted=0, target_token=7, target_cache=(5, 6, 6), draft_cache=None)
    assert not plain.bonus and plain.target_kind == "plain" and plain.verdicts == [] and plain.emitted == [7]
    kept = Iteration(drafts=[3, 4], accepted=2, target_token=9, target_cache=(5, 8, 8), draft_cache=None)
    assert kept.bonus and kept.target_kind == "bonus"
    table = iterations_html([plain, kept], decode=str)
    assert table.count('title="target\'s token, nothing drafted"') == 1
    assert table.count('title="target\'s bonus token"') == 1


def test_drafter_without_cache(pair):
    target, _ = pair
    ids = torch.tensor([[5, 6, 7, 8, 5, 6, 7, 8, 5, 6]])
    out, iterations = trace_generate(target, PromptLookupDrafter(), ids, max_new_tokens=12, num_draft_tokens=3,
                                     eos_token_id=[])
    assert all(it.draft_cache is None for it in iterations)
    check_target_caches(iterations, ids.shape[1])
    assert torch.equal(out.sequences, speculative_generate(target, PromptLookupDrafter(), ids, max_new_tokens=12,
                                                           num_draft_tokens=3, eos_token_id=[]).sequences)


def test_one_token_prompt_has_no_prefill(pair):
    target, draft = pair
    _, iterations = trace_generate(target, draft, prompt(1), max_new_tokens=10, num_draft_tokens=3, eos_token_id=[])
    assert iterations[0].target_cache[0] == 0
    check_target_caches(iterations, 1)


def test_hooks_removed_even_on_error(pair):
    target, draft = pair
    with pytest.raises(ValueError, match="max_new_tokens"):
        trace_generate(target, draft, prompt(PROMPT_LEN), max_new_tokens=-1)
    assert not target._forward_hooks and not target._forward_pre_hooks
    trace_generate(target, draft, prompt(PROMPT_LEN), max_new_tokens=5)
    assert not target._forward_hooks and not target._forward_pre_hooks


def test_iterations_carry_phase_times_and_verdicts_that_a_timeline_draws(pair):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from specdec_ref.trace import plot_timeline

    target, draft = pair
    _, iterations = trace_generate(target, draft, prompt(PROMPT_LEN), max_new_tokens=30, num_draft_tokens=4)
    assert all(it.draft_seconds > 0 and it.verify_seconds > 0 for it in iterations if it.drafts)
    for it in iterations:
        assert it.verdicts.count("accepted") == it.accepted and it.verdicts.count("rejected") == (len(it.rejected) > 0)
        assert len(it.verdicts) == len(it.drafts)
    fig, ax = plt.subplots()
    plot_timeline(iterations, ax, decode=str, max_iterations=5)
    shown = iterations[:5]
    # one box per drafted token on the draft row, one verify box per iteration on the target row
    assert len(ax.patches) == sum(len(it.drafts) for it in shown) + len(shown)
    total_ms = 1e3 * sum(it.draft_seconds + it.verify_seconds for it in shown)
    right = max(p.get_x() + p.get_width() for p in ax.patches)
    assert abs(right - total_ms) < 1e-6 * max(1.0, total_ms)
    plt.close(fig)


def test_the_html_views_show_every_token_once_with_its_verdict(pair):
    from specdec_ref.trace import iterations_html, written_html

    target, draft = pair
    _, iterations = trace_generate(target, draft, prompt(PROMPT_LEN), max_new_tokens=20, num_draft_tokens=4)
    table = iterations_html(iterations, decode=lambda t: f"<{t}>")
    assert table.count("<tr>") == len(iterations) + 1  # a header, then one row per iteration
    assert table.count('title="draft kept"') == sum(it.accepted for it in iterations)
    assert table.count('title="target\'s bonus token"') == sum(it.bonus for it in iterations)
    assert "&lt;" in table  # token text is escaped, not read as HTML
    text = written_html("the prompt", iterations, decode=str)
    assert text.count("<span title=") == sum(len(it.emitted) for it in iterations)
