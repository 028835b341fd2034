"""SmolLM2's prompt sets: prose openings, chat requests and Python function openings, each split
by topic, task or source file into training and held-out prompts.

The held-out prompts (:func:`heldout_prompts`) are what the lessons, benchmarks and tests
measure SmolLM2's drafters on; the training ones (:func:`prompts`) are what its draft
(``specdec_ref.recipes.distill``) and its EAGLE head (``specdec_ref.recipes.eagle_data``) were
trained on, so the two share no topic, task or file.
"""

from __future__ import annotations

import random

from transformers import PreTrainedTokenizerBase

from specdec_ref.zoo.corpus import cached_corpus, code_prompts

KINDS = ("prose", "code", "chat")

TOPICS = [
    "the printing press", "volcanoes", "honey bees", "the Roman Empire", "photosynthesis",
    "the moon landing", "coffee", "the human heart", "electric cars", "the Great Wall of China",
    "rainforests", "the internet", "chess", "the water cycle", "ancient Egypt", "vaccines",
    "jazz music", "the solar system", "earthquakes", "recycling", "the French Revolution",
    "dinosaurs", "the stock market", "sleep", "climate change", "bicycles", "the piano",
    "black holes", "gardening", "the Olympic Games", "bread baking", "whales", "democracy",
    "the printing of money", "glaciers", "the telephone", "meditation", "deserts", "robots",
    "the Renaissance", "penguins", "solar power", "the immune system", "libraries",
    "the Silk Road", "tea", "lightning", "museums", "coral reefs", "the steam engine",
    "migration of birds", "mathematics", "the Amazon river", "friendship", "bridges",
    "the human brain", "volunteering", "the Industrial Revolution", "mushrooms", "trains",
    "the ocean tides", "public speaking", "the Middle Ages", "butterflies", "wind energy",
    "architecture", "the periodic table", "cats", "rivers", "the history of writing",
    "space telescopes", "nutrition", "forests", "the Vikings", "time management",
    "the camera", "insects", "the Arctic", "music festivals", "DNA", "pyramids",
    "airplanes", "soap", "the Moon", "hurricanes", "philosophy", "farming", "castles",
    "the English language", "exercise", "money", "elephants", "maps", "clocks",
    "rain", "the Pacific Ocean", "poetry", "cheese", "mountains", "computers",
    "the theory of evolution", "owls", "snow", "the calendar", "theatre", "salt",
    "sharks", "electricity", "cities", "cooking pasta", "the alphabet", "fireworks",
    "trees", "languages", "submarines", "the sun", "kindness", "birds", "medicine",
]

PROSE = [
    "The history of {t} begins", "{T} is one of the most", "Most people know little about {t}, but",
    "Here is a short explanation of {t}.", "In this essay, I will describe {t}.",
    "A beginner's guide to {t}:", "When I first learned about {t},",
    "Scientists who study {t} have found that", "There are three reasons why {t} matters.",
    "{T} has changed a great deal over the last century.",
]

CHAT = [
    "Explain {t} in simple terms.", "What are the main ideas behind {t}?",
    "Write a short poem about {t}.", "Give me three interesting facts about {t}.",
    "How would you teach {t} to a ten-year-old?", "What are common misconceptions about {t}?",
    "Summarize the history of {t} in a paragraph.", "Why is {t} important?",
]

CODE_TASKS = [
    "reverses a string", "checks whether a number is prime", "computes the factorial of n",
    "returns the n-th Fibonacci number", "counts the vowels in a sentence",
    "finds the largest element of a list", "removes duplicates from a list",
    "checks whether a word is a palindrome", "sorts a list of dictionaries by a key",
    "reads a text file and counts its lines", "merges two sorted lists",
    "converts Celsius to Fahrenheit", "computes the average of a list of numbers",
    "flattens a nested list", "counts word frequencies in a text",
    "finds the greatest common divisor of two numbers", "checks whether two strings are anagrams",
    "returns the square of every number in a list", "capitalizes every word in a sentence",
    "finds the second largest number in a list", "implements binary search",
    "computes the sum of the digits of an integer", "generates all subsets of a list",
    "checks whether a year is a leap year", "converts a binary string to an integer",
    "removes the whitespace from a string", "transposes a matrix", "computes the median of a list",
    "validates an email address with a regular expression", "splits a list into chunks of size n",
    "implements bubble sort", "returns the common elements of two lists",
    "counts how many times each character appears", "computes the power set of a string",
    "finds the longest word in a sentence", "checks whether a list is sorted",
    "converts a dictionary to a JSON string", "computes compound interest",
    "finds the missing number in a list from 1 to n", "rotates a list by k positions",
]
CODE_CHAT = ["Write a Python function that {t}.", "How do I write Python code that {t}?"]


def _held(i: int) -> bool:
    """Every fifth topic, task or file opening is held out (never seen in training)."""
    return i % 5 == 0


def topic_prompts(tokenizer: PreTrainedTokenizerBase, topics: list[str],
                  tasks: list[str] = ()) -> tuple[list[str], list[str]]:
    """Prose openings on ``topics``, and chat requests (through the chat template) on
    ``topics`` and code ``tasks``."""
    def chat(text: str) -> str:
        return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)

    prose = [p.format(t=t, T=t[0].upper() + t[1:]) for t in topics for p in PROSE]
    chats = [chat(p.format(t=t)) for t in topics for p in CHAT]
    chats += [chat(p.format(t=t)) for t in tasks for p in CODE_CHAT]
    return prose, chats


def prompts(tokenizer: PreTrainedTokenizerBase, split: str, code_limit: int | None = None,
            seed: int = 0) -> dict[str, list[str]]:
    """Prompt texts by kind for ``split`` ("train" or "heldout"); chat prompts already
    carry the chat template. Held-out prompts share no topic, task or source file with
    the training ones."""
    want_held = split == "heldout"
    topics = [t for i, t in enumerate(TOPICS) if _held(i) == want_held]
    tasks = [t for i, t in enumerate(CODE_TASKS) if _held(i) == want_held]
    prose, chats = topic_prompts(tokenizer, topics, tasks)
    corpus = cached_corpus()
    code = code_prompts(corpus.heldout if want_held else corpus.train, max_chars=300)
    rng = random.Random(seed)
    rng.shuffle(code)
    out = {"prose": prose, "code": code[:code_limit] if code_limit else code, "chat": chats}
    for kind in KINDS:
        random.Random(seed + 1).shuffle(out[kind])
    return out


def interleave(by_kind: dict[str, list[str]]) -> list[tuple[str, str]]:
    """``(kind, text)`` pairs taking one prompt of each kind in turn, up to the shortest kind."""
    return [(kind, texts[i]) for i in range(min(len(t) for t in by_kind.values()))
            for kind, texts in ((k, by_kind[k]) for k in KINDS)]


def heldout_prompts(tokenizer: PreTrainedTokenizerBase, per_kind: int = 8, seed: int = 0) -> dict[str, list[str]]:
    """``per_kind`` evaluation prompts of each kind, none seen in training."""
    return {kind: texts[:per_kind] for kind, texts in prompts(tokenizer, "heldout", seed=seed).items()}
