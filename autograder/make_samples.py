"""Write exercise 1's sample submissions (and the broken inputs real classes hand in) from the
current release, so their locked cells are exactly what a student receives.

    .venv/bin/python autograder/make_samples.py

It also writes ``samples/roster.csv`` for every sample student (of every assignment). Each student is named by the bug they made. After changing ``solutions/`` and re-releasing,
run this again; ``autograder/samples/expected/ex01_speculative_loop.json`` says what each
one must score, cell by cell.
"""
from __future__ import annotations

import copy
import os
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent
SAMPLES = HERE / "samples"
ASSIGNMENT = "ex01_speculative_loop"
RELEASE = HERE.parent / "exercises" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"


def fill(release: Path, answers: dict[str, str]):
    """The release notebook with the answer cells named in ``answers`` (by grade_id) filled in."""
    nb = nbformat.read(release, as_version=4)
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in answers:
            cell.source = answers[gid].strip("\n")
    missing = set(answers) - {c.metadata.get("nbgrader", {}).get("grade_id") for c in nb.cells}
    if missing:
        raise ValueError(f"no answer cells {sorted(missing)} in {release}")
    return nb


# --- answers written the way students write them ----------------------------------------------

TOKENS_CLOSED_FORM = '''
def expected_tokens_per_pass(a: float, k: int) -> float:
    """Expected new tokens per target pass for acceptance probability a and k drafts."""
    if a == 1:
        return float(k + 1)
    return (1 - a ** (k + 1)) / (1 - a)
'''

TOKENS_SEED_FORMULA = '''
def expected_tokens_per_pass(a: float, k: int) -> float:
    """Expected new tokens per target pass for acceptance probability a and k drafts."""
    return 1 + a * k
'''

# Sums the geometric series until its terms vanish: forgets k, and never ends when a = 1.
TOKENS_LOOPS = '''
def expected_tokens_per_pass(a: float, k: int) -> float:
    """Expected new tokens per target pass for acceptance probability a and k drafts."""
    total, term = 0.0, 1.0
    while term > 1e-12:
        total += term
        term *= a
    return total
'''

ACCEPT_LOOP = '''
def accept_greedy(target_logits: torch.Tensor, drafts: torch.Tensor) -> tuple[int, int]:
    """(number of leading drafts the target agrees with, the target's next token)."""
    best = target_logits.argmax(-1).tolist()
    n = 0
    while n < len(drafts) and best[n] == int(drafts[n]):
        n += 1
    return n, best[n]
'''

# Counts every agreeing draft, not only the leading ones.
ACCEPT_COUNTS_ALL = '''
def accept_greedy(target_logits: torch.Tensor, drafts: torch.Tensor) -> tuple[int, int]:
    """(number of leading drafts the target agrees with, the target's next token)."""
    best = target_logits.argmax(-1)
    n = int((best[:-1] == drafts).sum())
    return n, int(best[n])
'''

ACCEPT_KILLS_KERNEL = '''
def accept_greedy(target_logits: torch.Tensor, drafts: torch.Tensor) -> tuple[int, int]:
    """(number of leading drafts the target agrees with, the target's next token)."""
    import os
    best = target_logits.argmax(-1)
    if len(drafts) > 1:
        os._exit(1)  # left over from debugging: stops the Python process at once
    n = int((best[:-1] == drafts).int().cumprod(0).sum())
    return n, int(best[n])
'''


def decoder(draft_loop: str, keep: str) -> str:
    """A cache-free decoder with the drafting loop and the update of the sequence given."""
    return f'''
@torch.inference_mode()
def greedy_speculative_generate(target, draft, input_ids: torch.Tensor, max_new_tokens: int, k: int) -> torch.Tensor:
    """Greedy speculative decoding without caches; returns [1, prompt + new] token ids."""
    ids = input_ids
    stop = input_ids.shape[1] + max_new_tokens
    while ids.shape[1] < stop:
        proposal = ids
{draft_loop}
        scores = target(proposal).logits[0, ids.shape[1] - 1:]
        n, tok = accept_greedy(scores, proposal[0, ids.shape[1]:])
{keep}
    return ids
'''


DRAFT_UP_TO_K = '''\
        for _ in range(min(k, stop - ids.shape[1] - 1)):
            proposal = torch.cat([proposal, draft(proposal).logits[:, -1:].argmax(-1)], dim=1)'''
KEEP_ACCEPTED = '''\
        ids = torch.cat([proposal[:, :ids.shape[1] + n], torch.tensor([[tok]])], dim=1)'''

DECODER_ALT = '''
@torch.inference_mode()
def greedy_speculative_generate(target, draft, input_ids: torch.Tensor, max_new_tokens: int, k: int) -> torch.Tensor:
    """Greedy speculative decoding without caches; returns [1, prompt + new] token ids."""
    tokens = input_ids[0].tolist()
    goal = len(tokens) + max_new_tokens
    while len(tokens) < goal:
        guesses = []
        budget = min(k, goal - len(tokens) - 1)  # the target adds one token itself
        while len(guesses) < budget:
            logits = draft(torch.tensor([tokens + guesses])).logits
            guesses.append(int(logits[0, -1].argmax()))
        checked = target(torch.tensor([tokens + guesses])).logits[0, len(tokens) - 1:]
        n, tok = accept_greedy(checked, torch.tensor(guesses, dtype=torch.long))
        tokens += guesses[:n] + [tok]
    return torch.tensor([tokens])
'''

DECODER_CALLS_REFERENCE = '''
@torch.inference_mode()
def greedy_speculative_generate(target, draft, input_ids: torch.Tensor, max_new_tokens: int, k: int) -> torch.Tensor:
    """Greedy speculative decoding without caches; returns [1, prompt + new] token ids."""
    return speculative_generate(target, draft, input_ids, max_new_tokens=max_new_tokens,
                                num_draft_tokens=k, eos_token_id=[]).sequences
'''

DECODER_NEVER_DRAFTS = '''
@torch.inference_mode()
def greedy_speculative_generate(target, draft, input_ids: torch.Tensor, max_new_tokens: int, k: int) -> torch.Tensor:
    """Greedy speculative decoding without caches; returns [1, prompt + new] token ids."""
    ids = input_ids
    for _ in range(max_new_tokens):
        next_token = target(ids).logits[:, -1:].argmax(-1)
        ids = torch.cat([ids, next_token], dim=1)
    return ids
'''

DECODER_IGNORES_K = decoder('''\
        for _ in range(min(4, stop - ids.shape[1] - 1)):  # 4 drafts worked best when I tried
            proposal = torch.cat([proposal, draft(proposal).logits[:, -1:].argmax(-1)], dim=1)''', KEEP_ACCEPTED)

# Drops the target's token when every draft was accepted (drafts up to the end so it still stops).
DECODER_NO_BONUS = decoder('''\
        for _ in range(min(k, stop - ids.shape[1])):
            proposal = torch.cat([proposal, draft(proposal).logits[:, -1:].argmax(-1)], dim=1)''', '''\
        drafted = proposal.shape[1] - ids.shape[1]
        ids = proposal[:, :ids.shape[1] + n]
        if n < drafted:
            ids = torch.cat([ids, torch.tensor([[tok]])], dim=1)''')

# Always drafts k tokens, so the last pass runs past max_new_tokens.
DECODER_OVERSHOOTS = decoder('''\
        for _ in range(k):
            proposal = torch.cat([proposal, draft(proposal).logits[:, -1:].argmax(-1)], dim=1)''', KEEP_ACCEPTED)

# Keeps the rejected drafts in the sequence (the cache-free form of "no rollback").
DECODER_KEEPS_REJECTED = decoder(DRAFT_UP_TO_K, '''\
        ids = torch.cat([proposal, torch.tensor([[tok]])], dim=1)''')

# Its own acceptance rule inline, so only accept_greedy's crash matters.
DECODER_INLINE_RULE = decoder(DRAFT_UP_TO_K, KEEP_ACCEPTED).replace(
    "n, tok = accept_greedy(scores, proposal[0, ids.shape[1]:])",
    "best = scores.argmax(-1)\n        n = int((best[:-1] == proposal[0, ids.shape[1]:]).int().cumprod(0).sum())\n"
    "        tok = int(best[n])")

# Leaves debugging output in: the draft's whole embedding matrix (megabytes of text).
DECODER_PRINTS = DECODER_ALT + '''
print(draft.model.embed_tokens.weight.tolist())
'''

# Writes next to the notebook, over the notebook, and up into the grader's folders.
DECODER_WRITES_FILES = DECODER_ALT + '''
import json
with open("results.json", "w") as f:
    json.dump({"k": 4}, f)
with open("ex01_speculative_loop.ipynb", "w") as f:
    f.write("overwritten")
with open("../../../gradebook.db", "w") as f:
    f.write("not a database")
'''

CORRECT = {"expected_tokens_per_pass": TOKENS_CLOSED_FORM, "accept_greedy": ACCEPT_LOOP,
           "greedy_speculative_generate": DECODER_ALT}

STUDENTS = {
    "alt_correct": CORRECT,
    "seed_formula": {**CORRECT, "expected_tokens_per_pass": TOKENS_SEED_FORMULA},
    "calls_reference": {**CORRECT, "greedy_speculative_generate": DECODER_CALLS_REFERENCE},
    "never_drafts": {**CORRECT, "greedy_speculative_generate": DECODER_NEVER_DRAFTS},
    "ignores_k": {**CORRECT, "greedy_speculative_generate": DECODER_IGNORES_K},
    "no_bonus": {**CORRECT, "greedy_speculative_generate": DECODER_NO_BONUS},
    # Two bugs in two functions, as students hand in too: it loses what each loses alone.
    "counts_all_matches_and_overshoots": {**CORRECT, "accept_greedy": ACCEPT_COUNTS_ALL,
                                          "greedy_speculative_generate": DECODER_OVERSHOOTS},
    "keeps_rejected": {**CORRECT, "greedy_speculative_generate": DECODER_KEEPS_REJECTED},
    # Broken inputs, not wrong answers: what a real class hands in.
    "crash_kernel": {**CORRECT, "accept_greedy": ACCEPT_KILLS_KERNEL,
                     "greedy_speculative_generate": DECODER_INLINE_RULE},
    "infinite_loop": {**CORRECT, "expected_tokens_per_pass": TOKENS_LOOPS},
    "prints_megabytes": {**CORRECT, "greedy_speculative_generate": DECODER_PRINTS},
    "writes_files": {**CORRECT, "greedy_speculative_generate": DECODER_WRITES_FILES},
    "renamed_notebook": CORRECT,
    "deleted_cell": CORRECT,
    "duplicated_cell": CORRECT,
    "invalid_json": CORRECT,
}


def cell_index(nb, grade_id: str) -> int:
    return next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


def write(student: str, nb) -> None:
    folder = SAMPLES / student / ASSIGNMENT
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.ipynb"):
        old.unlink()
    name = f"{ASSIGNMENT}.ipynb"
    if student == "renamed_notebook":
        name = f"{ASSIGNMENT}-Copy1.ipynb"  # what Jupyter's File > Duplicate names it
    if student == "deleted_cell":  # a test cell and the markdown above part 2 deleted
        for gid in ("test_accept_greedy_bonus", "q2_text"):
            del nb.cells[cell_index(nb, gid)]
    if student == "duplicated_cell":  # a test cell copied, and an answer cell copied then edited
        i = cell_index(nb, "test_expected_tokens_per_pass_values")
        nb.cells.insert(i + 1, copy.deepcopy(nb.cells[i]))
        nb.cells[i + 1].id = "copied-test"  # Jupyter gives a copied cell a new id
        j = cell_index(nb, "accept_greedy")
        first_try = copy.deepcopy(nb.cells[j])
        first_try.id, first_try.source = "first-try", ACCEPT_COUNTS_ALL.strip("\n")
        nb.cells.insert(j, first_try)
    text = nbformat.writes(nb) + "\n"
    if student == "invalid_json":  # the upload was cut off
        text = text[: len(text) // 2]
    (folder / name).write_text(text)


def write_roster() -> None:
    """samples/roster.csv (nbgrader's id,first_name,last_name,email) for every sample student,
    named after their bug: crash_kernel is Crash Kernel."""
    students = sorted(p.name for p in SAMPLES.iterdir() if p.is_dir() and p.name != "expected")
    rows = ["id,first_name,last_name,email"]
    for student in students:
        first, _, last = student.replace("_", " ").title().partition(" ")
        rows.append(f"{student},{first},{last or 'Sample'},{student}@example.edu")
    (SAMPLES / "roster.csv").write_text("\n".join(rows) + "\n")


def main() -> None:
    os.chdir(HERE.parent)
    for student, answers in STUDENTS.items():
        write(student, fill(RELEASE, answers))
    write_roster()
    print(f"wrote {len(STUDENTS)} submissions of {ASSIGNMENT} and a roster of every sample student under {SAMPLES}")


if __name__ == "__main__":
    main()
