"""Training corpus for the course zoo: the Python standard library's own sources.

Everything comes from the interpreter that runs this code (no download), so the
corpus is reproducible on any machine with the same Python version; its sha256 is
recorded in the zoo manifest. The library and its own test suite (``test/``) give
about 20M characters. Cleaning matters as much as size: the first zoo attempt
trained on raw sources and learnt to loop on codec tables and comment rulers, so
generated tables, files that do not parse, near-duplicates and rulers are removed.
Size matters too: the library alone (9M characters) let a 23M target overfit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import random
import re
import sys
import sysconfig
import warnings
from dataclasses import dataclass
from pathlib import Path

EOS = "<|endoftext|>"

# Directory names whose files are generated data, vendored tooling or not the stdlib.
_SKIP_DIRS = {
    "site-packages", "__pycache__", "encodings", "ensurepip", "pydoc_data", "turtledemo",
    "lib-dynload",
}
_SKIP_FILE_PREFIXES = ("_sysconfigdata", "config-")
# A "literal line" starts like a table element (quote, digit, bracket, minus) and
# ends with a comma: dict/tuple/list tables such as html.entities or stringprep.
_LITERAL_LINE = re.compile(r"""^\s*[-'"(\[{0-9].*,\s*(#.*)?$""")
# Comment rulers ("#####", "# ----", "#" alone) teach the model to loop.
_RULER = re.compile(r"^\s*#[\s#=\-*~_.]*$")
_MIN_BLOCK_CHARS = 120  # shorter repeated blocks (e.g. "return None") are normal code


@dataclass(frozen=True)
class Corpus:
    """A cleaned corpus: ``train`` and ``heldout`` map relative path -> text."""

    train: dict[str, str]
    heldout: dict[str, str]
    sha256: str

    def text(self, split: str = "train") -> str:
        """All documents of a split joined by the end-of-text marker."""
        docs = self.train if split == "train" else self.heldout
        return "".join(EOS + docs[k] for k in sorted(docs))


def stdlib_dir() -> Path:
    """The base interpreter's standard library (the same for a venv and its base)."""
    return Path(sysconfig.get_paths()["stdlib"])


def _is_generated(text: str) -> bool:
    """True for files dominated by literal tables or very long lines, or that do not
    parse (the test suite's deliberately broken and Python 2 fixtures)."""
    try:
        with warnings.catch_warnings():  # e.g. "is" with a literal, in tests of exactly that
            warnings.simplefilter("ignore")
            compile(text, "<corpus>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return True
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return True
    if max(len(ln) for ln in lines) > 500 or sum(map(len, lines)) / len(lines) > 90:
        return True
    literal = sum(1 for ln in lines if _LITERAL_LINE.match(ln))
    return literal / len(lines) > 0.3


def _clean(text: str) -> str:
    """Drop comment rulers, trailing spaces and runs of blank lines."""
    out: list[str] = []
    for line in text.splitlines():
        line = line.rstrip()
        if _RULER.match(line):
            continue
        if not line and out and not out[-1]:
            continue
        out.append(line)
    return "\n".join(out).strip("\n") + "\n"


def _dedup_blocks(docs: dict[str, str]) -> dict[str, str]:
    """Remove blank-line separated blocks already seen in an earlier file.

    License headers, copied helper functions and boilerplate recur across the
    stdlib; keeping one copy stops the model from over-weighting them.
    """
    seen: set[str] = set()
    out: dict[str, str] = {}
    for name in sorted(docs):
        kept = []
        for block in docs[name].split("\n\n"):
            key = re.sub(r"\s+", " ", block).strip()
            if len(key) >= _MIN_BLOCK_CHARS:
                if key in seen:
                    continue
                seen.add(key)
            kept.append(block)
        text = "\n\n".join(kept).strip("\n") + "\n"
        if len(text) > 200:
            out[name] = text
    return out


def source_files(root: Path | None = None) -> list[Path]:
    """The stdlib ``.py`` files the corpus may use, sorted (generated data excluded)."""
    root = root or stdlib_dir()
    files = []
    for folder, subfolders, names in os.walk(root):
        rel = Path(folder).relative_to(root)
        # Skipped folders are not walked (the base interpreter's site-packages can be large).
        subfolders[:] = [d for d in subfolders
                         if d not in _SKIP_DIRS and not (rel == Path(".") and d.startswith("config-"))]
        files.extend(Path(folder) / name for name in names
                     if name.endswith(".py") and not name.startswith(_SKIP_FILE_PREFIXES))
    return sorted(files)


def build_corpus(max_files: int | None = None, heldout_frac: float = 0.03, seed: int = 0) -> Corpus:
    """Read, filter, clean and deduplicate the stdlib; split held-out files by seed.

    ``max_files`` keeps only the first files (sorted) for tiny smoke-test builds.
    """
    root = stdlib_dir()
    docs: dict[str, str] = {}
    hashes: set[str] = set()
    for path in source_files(root)[:max_files]:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if _is_generated(text):
            continue
        text = _clean(text)
        digest = hashlib.sha256(text.encode()).hexdigest()
        if digest in hashes:  # identical files (e.g. copies kept for compatibility)
            continue
        hashes.add(digest)
        docs[path.relative_to(root).as_posix()] = text
    docs = _dedup_blocks(docs)

    names = sorted(docs)
    n_held = max(1, round(heldout_frac * len(names)))
    held = set(random.Random(seed).sample(names, n_held))
    corpus = Corpus(
        train={k: docs[k] for k in names if k not in held},
        heldout={k: docs[k] for k in names if k in held},
        sha256="",
    )
    digest = hashlib.sha256((corpus.text("train") + corpus.text("heldout")).encode()).hexdigest()
    return Corpus(corpus.train, corpus.heldout, digest)


def corpus_cache_key(root: Path | None = None) -> str:
    """What a default build depends on: this module's code, the Python version, and every
    source file's path, size and modification time (as ``make`` judges staleness)."""
    root = root or stdlib_dir()
    digest = hashlib.sha256(Path(__file__).read_bytes())
    digest.update(f"{sys.version}\0{root}\0".encode())
    for path in source_files(root):
        stat = path.stat()
        digest.update(f"{path.relative_to(root).as_posix()}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
    return digest.hexdigest()[:16]


def load_or_build_corpus(cache_dir: Path) -> Corpus:
    """The default corpus, read from ``cache_dir`` when a build for the same inputs is stored
    there, else built and stored (written under a name of this process's, then renamed, so
    processes building at once never read half a file)."""
    path = cache_dir / f"stdlib-{corpus_cache_key()}.json"
    try:
        return Corpus(**json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):  # missing, unreadable or damaged: build again
        pass
    corpus = build_corpus()
    partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        partial.write_text(json.dumps(dataclasses.asdict(corpus)), encoding="utf-8")
        partial.replace(path)
    except OSError:  # a read-only home or a full disk: the corpus still works, built each time
        with contextlib.suppress(OSError):
            partial.unlink()
    return corpus


@functools.cache
def cached_corpus() -> Corpus:
    """The default corpus (:func:`build_corpus` with its defaults), once per process and kept on
    disk between processes: prompt helpers ask for it again and again, and a build reads and
    cleans the whole stdlib (about 10 s), against a fraction of a second to read it back. The
    folder is ``$SPECDEC_CACHE/corpus`` (default ``~/.cache/specdec/corpus``)."""
    from specdec_ref.paths import cache_root

    return load_or_build_corpus(cache_root() / "corpus")


def _prompt_from(lines: list[str], start: int, min_chars: int, max_chars: int) -> str | None:
    """Whole lines from ``start`` until ``min_chars`` is reached at a safe stopping point.

    A safe point is the end of a statement (brackets closed, no continuation, not a
    comment), so the continuation is open-ended code rather than the rest of an
    import list or table, which would invite the model to repeat itself.
    """
    depth = 0
    for end in range(start, len(lines)):
        line = lines[end]
        depth += sum(line.count(c) for c in "([{") - sum(line.count(c) for c in ")]}")
        text = "\n".join(lines[start:end + 1])
        if len(text) > max_chars:
            return None
        stripped = line.strip()
        safe = (depth == 0 and stripped and not stripped.startswith(("#", "@"))
                and not stripped.endswith(("\\", ",")) and '"""' not in stripped
                and "'''" not in stripped)
        if len(text) >= min_chars and safe:
            return text
    return None


def is_test_file(name: str) -> bool:
    """True for files of the stdlib's test suites (``test/``, ``idle_test/``, ...)."""
    return any(part in ("test", "tests", "idle_test") for part in name.split("/")[:-1])


def code_prompts(docs: dict[str, str], min_chars: int = 100, max_chars: int = 400) -> list[str]:
    """Every opening of a library (non-test) function or class in ``docs``, in file order.

    Each starts at a ``def``/``class`` line and ends with a complete statement,
    ``min_chars``-``max_chars`` characters long, *without* its final line break:
    tokenizer A glues a newline to the next line's indentation ("\\n        "), so a
    prompt ending in a lone "\\n" token tells the model the next line is not indented
    and it abandons the function it was given.
    Test files are left out: their ``self.assertEqual`` runs are easier to predict than
    the library code the lessons show, and would flatter acceptance rates.
    """
    prompts = []
    for name in sorted(n for n in docs if not is_test_file(n)):
        lines = docs[name].splitlines()
        for i, line in enumerate(lines):
            if re.match(r"\s*(async\s+)?(def|class)\s", line):
                prompt = _prompt_from(lines, i, min_chars, max_chars)
                if prompt:
                    prompts.append(prompt)
    return prompts


def heldout_prompts(n: int = 32, corpus: Corpus | None = None, seed: int = 0,
                    min_chars: int = 100, max_chars: int = 400) -> list[str]:
    """``n`` evaluation prompts, drawn (seeded) from ``code_prompts`` of the held-out files."""
    candidates = code_prompts((corpus or cached_corpus()).heldout, min_chars, max_chars)
    if len(candidates) < n:
        raise ValueError(f"only {len(candidates)} held-out prompts available, asked for {n}")
    return random.Random(seed).sample(candidates, n)
