"""Watch speculative decoding one iteration at a time, without changing it.

:func:`trace_generate` runs :func:`~specdec_ref.speculative_generate` itself and records,
for every call of :func:`~specdec_ref.speculative_step`, what was drafted, how much the
target kept, the target's own token, and the KV-cache length of both models before and
after each phase. It only observes: a wrapper around the drafter (which the loop calls
before drafting and after the rollback) and a forward hook on the target (which sees the
cache the loop verifies with). The tokens produced are exactly those of
``speculative_generate`` with the same arguments.
"""
from __future__ import annotations

import html
import time
from dataclasses import dataclass

import torch

from .drafters import Drafter, DrafterBase, Proposal
from .sampling import Sampler
from .speculative import as_drafter, speculative_generate
from .stats import GenerationOutput


@dataclass
class Iteration:
    """One draft / verify / accept iteration as the loop saw it.

    ``drafts``: the proposed token ids. ``accepted``: how many of them the target kept
    (a prefix). ``target_token``: the token the target adds itself, the correction of the
    first rejected draft, the bonus token when every draft was kept, or a plain step's token
    when nothing was drafted (the drafter had nothing to propose, or one token was left).
    ``target_cache``: the target's cache length (before verifying, after verifying, after
    the rollback). ``draft_cache``: the draft model's (before drafting, after drafting,
    after the update); ``None`` for drafters without a cache (prompt lookup).
    ``draft_seconds``: wall time of the drafting; ``verify_seconds``: from the end of
    drafting to the rollback (the verification pass, the acceptance rule, the rollback).
    One run's clock on a possibly busy machine: good for a picture, not for a benchmark.
    """

    drafts: list[int]
    accepted: int
    target_token: int
    target_cache: tuple[int, int, int]
    draft_cache: tuple[int, int, int] | None
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0

    @property
    def verdicts(self) -> list[str]:
        """Each draft's fate: "accepted", "rejected" (the first draft the target refused) or
        "unjudged" (drafts after it, thrown away without a verdict)."""
        refused = len(self.drafts) - self.accepted
        return ["accepted"] * self.accepted + ["rejected"] * min(refused, 1) + ["unjudged"] * max(refused - 1, 0)

    @property
    def rejected(self) -> list[int]:
        """The drafts after the accepted prefix: the first was rejected, the rest never judged."""
        return self.drafts[self.accepted:]

    @property
    def bonus(self) -> bool:
        """True when there were drafts and every one was kept: the target's token is a bonus."""
        return bool(self.drafts) and self.accepted == len(self.drafts)

    @property
    def target_kind(self) -> str:
        """What the target's token is: "bonus", "correction" or "plain" (nothing was drafted)."""
        return "bonus" if self.bonus else "correction" if self.drafts else "plain"

    @property
    def emitted(self) -> list[int]:
        """The tokens this iteration appended: the accepted drafts, then the target's token."""
        return self.drafts[: self.accepted] + [self.target_token]


def _cache_length(cache) -> int:
    return int(cache.get_seq_length()) if cache is not None else 0


class TracingDrafter(DrafterBase):
    """A drafter that passes every call through to ``inner`` (any :class:`~specdec_ref.drafters.DrafterBase`,
    features included) and records each iteration in ``iterations``.

    ``target_cache`` is a one-element list the target's forward hook fills with the cache
    object the loop verifies with (the loop creates it, so it is seen on first use).
    """

    def __init__(self, inner: DrafterBase) -> None:
        self.inner = inner
        self.reads_target_features = inner.reads_target_features
        self.target_feature_layers = inner.target_feature_layers
        self.iterations: list[Iteration] = []
        self.target_cache: list = [None]
        self.target_cache_after_forward = 0
        self._pending: tuple | None = None

    def _draft_cache_length(self) -> int | None:
        return self.inner.cache_length

    @property
    def name(self) -> str:
        return self.inner.name

    def for_target(self, target: torch.nn.Module) -> TracingDrafter:
        return TracingDrafter(self.inner.for_target(target))

    @property
    def weight_bytes(self) -> float:
        return self.inner.weight_bytes

    @property
    def num_parameters(self) -> int:
        return self.inner.num_parameters

    def check_target(self, target: torch.nn.Module) -> None:
        self.inner.check_target(target)

    def draft_step(self, target: torch.nn.Module, tokens: torch.LongTensor):
        return self.inner.draft_step(target, tokens)

    def start(self, prompt: torch.LongTensor, max_new_tokens: int) -> None:
        self._pending = None
        self.iterations.clear()
        self.target_cache[0] = None
        self.inner.start(prompt, max_new_tokens)

    def propose(self, tokens: torch.LongTensor, max_tokens: int, sampler: Sampler) -> Proposal:
        target_before = _cache_length(self.target_cache[0])
        draft_before = self._draft_cache_length()
        start = time.perf_counter()
        proposal = self.inner.propose(tokens, max_tokens, sampler)
        drafted = time.perf_counter()
        self._pending = (proposal.tokens.tolist(), target_before, draft_before, self._draft_cache_length(),
                         drafted - start, drafted)
        return proposal

    def update(self, tokens: torch.LongTensor, num_accepted: int, features: torch.Tensor | None = None) -> None:
        # The loop calls this right after rolling the target cache back (and after the prefill,
        # with the prompt's features, for a drafter that reads them: no iteration to record).
        if self._pending is None:
            self.inner.update(tokens, num_accepted, features)
            return
        rolled_back = time.perf_counter()
        drafts, target_before, draft_before, draft_drafted, draft_seconds, drafted = self._pending
        target_after = _cache_length(self.target_cache[0])
        self.inner.update(tokens, num_accepted, features)
        self._pending = None
        draft_cache = None if draft_before is None else (draft_before, draft_drafted, self._draft_cache_length())
        self.iterations.append(Iteration(
            drafts=drafts, accepted=num_accepted, target_token=int(tokens[-1]),
            target_cache=(target_before, self.target_cache_after_forward, target_after), draft_cache=draft_cache,
            draft_seconds=draft_seconds, verify_seconds=rolled_back - drafted,
        ))


def trace_generate(
    target: torch.nn.Module,
    draft: torch.nn.Module | Drafter,
    input_ids: torch.LongTensor,
    *,
    target_tokenizer=None,
    draft_tokenizer=None,
    min_draft_confidence: float | None = None,
    **generate_kwargs,
) -> tuple[GenerationOutput, list[Iteration]]:
    """Run :func:`~specdec_ref.speculative_generate` and return its output with one
    :class:`Iteration` per verification pass.

    Takes the same arguments as ``speculative_generate``. The iterations record what each
    step produced before the loop cuts at EOS, so the last one may hold tokens past an EOS
    the output does not include.
    """
    drafter = TracingDrafter(as_drafter(draft, target, target_tokenizer, draft_tokenizer, min_draft_confidence))

    def see_cache(module, args, kwargs):
        drafter.target_cache[0] = kwargs.get("past_key_values", drafter.target_cache[0])

    def after_forward(module, args, kwargs, output):
        drafter.target_cache_after_forward = _cache_length(drafter.target_cache[0])

    handles = [target.register_forward_pre_hook(see_cache, with_kwargs=True),
               target.register_forward_hook(after_forward, with_kwargs=True)]
    try:
        output = speculative_generate(target, drafter, input_ids, **generate_kwargs)
    finally:
        for handle in handles:
            handle.remove()
    return output, drafter.iterations


TIMELINE_COLOURS = {"accepted": "#7fcf7a", "rejected": "#e06666", "unjudged": "#cccccc",
                    "correction": "#f6a23c", "bonus": "#5b8fd9", "plain": "#8c6bb1", "verify": "#9aa9bf"}


def plot_timeline(iterations: list[Iteration], ax, decode=None, max_iterations: int = 10) -> None:
    """Draw the first ``max_iterations`` iterations of a trace on the matplotlib axes ``ax``
    as a timeline: the draft's steps (one box per drafted token, coloured by its verdict) on
    the upper row, each verification pass on the lower row, with the token the target added
    (correction, bonus, or a plain step's token) marked at its end. ``decode`` (token id -> text) labels the boxes.
    Times are one run's wall clock (see :class:`Iteration`)."""
    from matplotlib.patches import Patch

    now = 0.0
    for it in iterations[:max_iterations]:
        step = 1e3 * it.draft_seconds / max(1, len(it.drafts))
        for i, (token, verdict) in enumerate(zip(it.drafts, it.verdicts)):
            left = now + i * step
            ax.barh(1, step, left=left, color=TIMELINE_COLOURS[verdict], edgecolor="white")
            if decode is not None:
                ax.text(left + step / 2, 1, decode(token).replace("\n", "\u21b5"), ha="center", va="center",
                        rotation=90, fontsize=7, clip_on=True)
        now += 1e3 * it.draft_seconds
        verify = 1e3 * it.verify_seconds
        ax.barh(0, verify, left=now, color=TIMELINE_COLOURS["verify"], edgecolor="white")
        now += verify
        ax.plot([now], [0.45], marker="v", markersize=9, color=TIMELINE_COLOURS[it.target_kind])
        if decode is not None:
            ax.text(now, 0.62, decode(it.target_token).replace("\n", "\u21b5"), ha="center", fontsize=7,
                    color="black")
    ax.set_yticks([0, 1], ["target\n(verify pass)", "draft\n(one step per token)"])
    ax.set_ylim(-0.6, 1.6)
    ax.set_xlabel("wall-clock time since the first draft (ms)")
    labels = {"accepted": "draft accepted", "rejected": "draft rejected", "unjudged": "draft discarded unjudged",
              "verify": "target verification pass", "correction": "target's correction (marker)",
              "bonus": "target's bonus token (marker)", "plain": "plain step, nothing drafted (marker)"}
    ax.legend(handles=[Patch(color=TIMELINE_COLOURS[k], label=v) for k, v in labels.items()],
              loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=3, fontsize=8)


_CHIP_STYLE = {
    "accepted": "background:#bfeebb",
    "rejected": "background:#f5b3b3;text-decoration:line-through",
    "unjudged": "background:#e6e6e6;color:#888;text-decoration:line-through",
    "correction": "background:#ffcf85;font-weight:bold",
    "bonus": "background:#b3d1ff;font-weight:bold",
    "plain": "background:#dccbee;font-weight:bold",
}
_CHIP_MEANING = {"accepted": "draft kept", "rejected": "draft rejected", "unjudged": "draft discarded unjudged",
                 "correction": "target's correction", "bonus": "target's bonus token",
                 "plain": "target's token, nothing drafted"}


def _chip(text: str, kind: str, newline: str) -> str:
    shown = html.escape(text).replace("\n", newline)
    return (f'<span title="{_CHIP_MEANING[kind]}" style="{_CHIP_STYLE[kind]};white-space:pre;'
            f'font-family:monospace;border-radius:3px;padding:0 1px">{shown}</span>')


def iterations_html(iterations: list[Iteration], decode) -> str:
    """An HTML table, one row per iteration: the drafts coloured by verdict, then the target's
    token (correction, bonus or plain step), then how many drafts were kept. ``decode``: token id -> text;
    newlines show as ``↵`` so that each row stays on one line."""
    legend = " ".join(f'<span style="{_CHIP_STYLE[k]};padding:0 4px">{m}</span>' for k, m in _CHIP_MEANING.items())
    rows = "".join(
        f"<tr><td>{n}</td><td style='text-align:left'>"
        + "".join(_chip(decode(t), kind, "↵") for t, kind in zip(it.drafts, it.verdicts))
        + " &rarr; " + _chip(decode(it.target_token), it.target_kind, "↵")
        + f"</td><td>{it.accepted}/{len(it.drafts)}</td></tr>"
        for n, it in enumerate(iterations))
    return (f"<p>{legend}</p><table><tr><th>iteration</th><th style='text-align:left'>drafts &rarr; "
            f"target's token</th><th>kept</th></tr>{rows}</table>")


def written_html(prompt: str, iterations: list[Iteration], decode) -> str:
    """The text as a reader sees it: the prompt in grey, then every new token coloured by who
    wrote it (green: drafted and kept; orange, blue or purple: the target's own correction, bonus,
    or plain step's token)."""
    written = "".join("".join(_chip(decode(t), "accepted", "\n") for t in it.drafts[: it.accepted])
                      + _chip(decode(it.target_token), it.target_kind, "\n") for it in iterations)
    return f'<pre style="line-height:1.5;white-space:pre-wrap"><span style="color:#999">{html.escape(prompt)}</span>{written}</pre>'
