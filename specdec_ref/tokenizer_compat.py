"""Can the target verify the draft's token ids directly? A tokenizer compatibility report.

The native speculative path compares token *ids*, so it is safe exactly when both
tokenizers give every id the same string. Everything else (merges, normalisers, chat
templates...) changes how well the draft predicts, or how prompts are rendered, but
not whether verification is correct. The report names each difference and its effect.
"""
from __future__ import annotations

import html
import json
from dataclasses import dataclass, field

# What each kind of difference does, when the vocabularies themselves agree.
EFFECTS = {
    "vocabulary": "draft ids name different strings for the target: ids cannot be verified directly, "
                  "use the cross-tokenizer (UAG) path",
    "model": "same ids, different segmentation of new text: the native path stays correct, but the draft "
             "was trained on other splits, which costs acceptance",
    "normalizer": "text is normalised differently before splitting: the native path stays correct (the draft "
                  "reads the target's ids), acceptance may drop",
    "pre_tokenizer": "text is pre-split differently: the native path stays correct, acceptance may drop",
    "post_processor": "encoding adds different special tokens (e.g. BOS) around prompts: encode prompts with "
                      "the target's tokenizer; verification is unaffected",
    "decoder": "ids are turned back into text differently: decode output with the target's tokenizer; "
               "verification is unaffected",
    "special_tokens": "special tokens (BOS/EOS/PAD/...) differ: stop on the target's EOS; a draft that never "
                      "proposes that EOS loses a little acceptance at the end, nothing else",
    "chat_template": "only how conversations are rendered to text by apply_chat_template: token ids, the "
                     "vocabulary and verification are untouched, so the native path stays safe; render "
                     "prompts with the target's template. (transformers chooses its cross-tokenizer path "
                     "from vocabulary sizes and from whether tokenizer/assistant_tokenizer are passed, never "
                     "from the chat template.)",
}


@dataclass
class Difference:
    category: str
    detail: str

    @property
    def effect(self) -> str:
        return EFFECTS[self.category]


@dataclass
class TokenizerReport:
    """The result of :func:`compare_tokenizers`; ``native_ok`` is the verdict."""

    native_ok: bool
    vocab_sizes: tuple[int, int]
    differences: list[Difference] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        if self.native_ok:
            return "native path safe: every token id names the same string in both tokenizers"
        return "native path NOT safe: the vocabularies differ, use the cross-tokenizer (UAG) path"

    def __str__(self) -> str:
        lines = [self.verdict, f"vocabulary sizes: {self.vocab_sizes[0]} vs {self.vocab_sizes[1]}"]
        if not self.differences:
            lines.append("no differences found")
        for diff in self.differences:
            lines += [f"- {diff.category}: {diff.detail}", f"    effect: {diff.effect}"]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        colour = "#1a7f37" if self.native_ok else "#cf222e"
        rows = "".join(
            f"<tr><td><b>{html.escape(d.category)}</b></td><td>{html.escape(d.detail)}</td>"
            f"<td>{html.escape(d.effect)}</td></tr>"
            for d in self.differences
        ) or "<tr><td colspan=3>no differences found</td></tr>"
        return (
            f"<div><p style='color:{colour}'><b>{html.escape(self.verdict)}</b> "
            f"(vocabulary sizes {self.vocab_sizes[0]} vs {self.vocab_sizes[1]})</p>"
            f"<table><tr><th>category</th><th>difference</th><th>effect</th></tr>{rows}</table></div>"
        )


def check_tokenizer(tokenizer: object, role: str) -> None:
    for method in ("get_vocab", "encode", "decode"):
        if not callable(getattr(tokenizer, method, None)):
            raise TypeError(
                f"{role} must be a transformers tokenizer (PreTrainedTokenizerBase) with get_vocab/encode/decode; "
                f"got {type(tokenizer).__name__}"
            )


def _backend_sections(tokenizer) -> dict | None:
    """The fast tokenizer's JSON description (model, normalizer, ...), if it has one."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return json.loads(backend.to_str()) if backend is not None else None


def _vocabulary_difference(vocab_a: dict[str, int], vocab_b: dict[str, int]) -> str:
    only_a = len(vocab_a.keys() - vocab_b.keys())
    only_b = len(vocab_b.keys() - vocab_a.keys())
    moved = sum(1 for token in vocab_a.keys() & vocab_b.keys() if vocab_a[token] != vocab_b[token])
    return (f"{len(vocab_a)} vs {len(vocab_b)} entries; {only_a} tokens only in the first, {only_b} only in "
            f"the second, {moved} shared tokens with different ids")


def compare_tokenizers(a, b) -> TokenizerReport:
    """Compare two ``transformers`` tokenizers (``a`` the target's, ``b`` the draft's)."""
    check_tokenizer(a, "the first tokenizer")
    check_tokenizer(b, "the second tokenizer")
    vocab_a, vocab_b = a.get_vocab(), b.get_vocab()
    differences = []
    if vocab_a != vocab_b:
        differences.append(Difference("vocabulary", _vocabulary_difference(vocab_a, vocab_b)))

    backend_a, backend_b = _backend_sections(a), _backend_sections(b)
    if backend_a is not None and backend_b is not None:
        model_a, model_b = backend_a["model"], backend_b["model"]
        if model_a.get("type") != model_b.get("type"):
            differences.append(Difference("model", f"{model_a.get('type')} vs {model_b.get('type')}"))
        elif model_a.get("merges") != model_b.get("merges"):
            differences.append(Difference("model", f"{model_a.get('type')} merges differ "
                                          f"({len(model_a.get('merges') or [])} vs {len(model_b.get('merges') or [])})"))
        for section in ("normalizer", "pre_tokenizer", "post_processor", "decoder"):
            if backend_a.get(section) != backend_b.get(section):
                differences.append(Difference(section, f"{_kind(backend_a.get(section))} vs "
                                              f"{_kind(backend_b.get(section))}"))

    specials_a = {name: (tok, a.convert_tokens_to_ids(tok)) for name, tok in a.special_tokens_map.items()
                  if isinstance(tok, str)}
    specials_b = {name: (tok, b.convert_tokens_to_ids(tok)) for name, tok in b.special_tokens_map.items()
                  if isinstance(tok, str)}
    if specials_a != specials_b:
        changed = sorted(name for name in specials_a.keys() | specials_b.keys()
                         if specials_a.get(name) != specials_b.get(name))
        detail = "; ".join(f"{name}: {specials_a.get(name)} vs {specials_b.get(name)}" for name in changed)
        differences.append(Difference("special_tokens", detail))

    template_a, template_b = getattr(a, "chat_template", None), getattr(b, "chat_template", None)
    if template_a != template_b:
        differences.append(Difference("chat_template", _template_summary(template_a, template_b)))

    return TokenizerReport(native_ok=vocab_a == vocab_b, vocab_sizes=(len(vocab_a), len(vocab_b)),
                           differences=differences)


def _kind(section: dict | None) -> str:
    if section is None:
        return "none"
    return section.get("type", "custom") if isinstance(section, dict) else str(section)


def _template_summary(a: str | None, b: str | None) -> str:
    if a is None or b is None:
        return f"{'set' if a else 'none'} vs {'set' if b else 'none'}"
    return f"two different templates ({len(a)} vs {len(b)} characters)"
