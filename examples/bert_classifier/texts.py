"""English-like text of any length, made deterministically from a seed: the tokenizer's
training corpus at build time, and the inputs of tests and benchmarks.

    make_text(seed=3, n_words=40)   # the same 40 words on every machine, every time

Sentences follow a small grammar (determiner, adjectives, noun, verb, adverb, a
prepositional phrase) over a fixed vocabulary of common English words with their
inflections, plus a few thousand made-up proper names built from syllables, so a WordPiece
trained on it has whole words and sub-word pieces to learn. Only ``random.Random(seed)``
decides, so nothing depends on the Python hash seed or the platform.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


DETERMINERS = ("the", "a", "this", "that", "every", "some", "no", "one", "our", "their")
ADJECTIVES = _words(
    "good bad small large quiet loud quick slow bright dark warm cold old new young early "
    "late happy sad strange simple clever honest gentle brave calm eager fair kind proud "
    "rich poor short long deep shallow heavy light soft hard clean busy empty full green "
    "blue red golden silver wooden broken hidden famous careful modern ancient"
)
NOUNS = _words(
    "movie book story song city river garden house window teacher student doctor driver "
    "farmer market station engine computer network letter question answer picture morning "
    "evening winter summer village mountain forest island bridge road train ship friend "
    "family child neighbor company customer problem reason moment result system review "
    "service kitchen table chair door street music dinner game team player country"
)
VERBS = _words(
    "open close watch read write find keep help start finish visit follow explain enjoy "
    "answer call carry change check clean cook cross dance fix jump learn listen move "
    "paint play pull push reach remember repair show study travel turn wait walk want "
    "wonder work"
)
ADVERBS = _words(
    "quickly slowly quietly happily rarely often never always carefully gladly badly "
    "easily barely nearly really simply suddenly finally"
)
PREPOSITIONS = ("in", "on", "near", "under", "behind", "with", "without", "after", "before")
CONJUNCTIONS = ("and", "but", "because", "while", "although", "so")

_ONSETS = _words("b br c ch d f g gr h j k l m n p r s sh st t th tr v w z")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ea", "ou")
_CODAS = ("", "", "n", "r", "l", "s", "th", "nd", "rk", "x")


def _names(count: int = 3000) -> tuple[str, ...]:
    """Made-up proper names of two or three syllables, always the same ones."""
    rng = random.Random(20240519)
    syllables = [o + v + c for o, v, c in itertools.product(_ONSETS, _VOWELS, _CODAS)]
    names: dict[str, None] = {}
    while len(names) < count:
        parts = rng.choice((2, 2, 3))
        names["".join(rng.choice(syllables) for _ in range(parts)).capitalize()] = None
    return tuple(names)


NAMES = _names()


def _verb(rng: random.Random) -> str:
    verb = rng.choice(VERBS)
    ending = rng.choice(("s", "ed", "", "ing"))
    if ending == "ing":
        return f"is {verb.removesuffix('e')}ing"
    if ending == "ed":
        return verb + ("d" if verb.endswith("e") else "ed")
    if ending == "s":
        return verb + ("es" if verb.endswith(("s", "sh", "ch", "x")) else "s")
    return f"will {verb}"


def _noun_phrase(rng: random.Random) -> str:
    if rng.random() < 0.25:
        return rng.choice(NAMES)
    words = [rng.choice(DETERMINERS)]
    words += rng.sample(ADJECTIVES, rng.choice((0, 1, 1, 2)))
    noun = rng.choice(NOUNS)
    words.append(noun + "s" if rng.random() < 0.3 else noun)
    return " ".join(words)


def _sentence(rng: random.Random) -> str:
    parts = [_noun_phrase(rng), _verb(rng), _noun_phrase(rng)]
    if rng.random() < 0.4:
        parts.append(rng.choice(ADVERBS))
    if rng.random() < 0.5:
        parts += [rng.choice(PREPOSITIONS), _noun_phrase(rng)]
    if rng.random() < 0.3:
        parts += [rng.choice(CONJUNCTIONS), _noun_phrase(rng), _verb(rng), _noun_phrase(rng)]
    text = " ".join(parts)
    end = rng.choice((".", ".", ".", "!", "?"))
    return text[0].upper() + text[1:] + end


def make_text(seed: int, n_words: int) -> str:
    """``n_words`` whitespace-separated words of English-like text; the same for a seed.

    Raises:
        ValueError: ``n_words`` is below 1.
    """
    if n_words < 1:
        raise ValueError(f"n_words: got {n_words}, expected an integer >= 1")
    rng = random.Random(seed)
    words: list[str] = []
    while len(words) < n_words:
        words += _sentence(rng).split()
    text = " ".join(words[:n_words])
    return text if text[-1] in ".!?" else text + "."


def corpus(n_texts: int = 2000, n_words: int = 200) -> Iterator[str]:
    """The tokenizer's training texts: ``n_texts`` texts of ``n_words`` words."""
    for seed in range(n_texts):
        yield make_text(1_000_000 + seed, n_words)
