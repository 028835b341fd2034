"""Shared fixtures; they and the helpers they use live in factories.py.

(Test modules import helpers from ``factories``, never from ``conftest``: with
tests/integration having its own conftest.py, that name is ambiguous.)
"""
from factories import family_pair, tokenizer_a, tokenizer_b  # noqa: F401  (pytest fixtures)
