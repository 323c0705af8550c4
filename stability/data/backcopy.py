"""A corpus where most positions have nothing to attend to: synthetic back-copy documents beside the
built-in text, offline and deterministic.

``backcopy_corpus(n_bytes, text_fraction, seed)`` returns exactly ``n_bytes`` of ASCII: documents
separated by blank lines, about ``text_fraction`` of the bytes built-in text
(``stability.data.builtin``) and the rest *back-copy* documents, the synthetic task of Guo et al.
(2024, "Active-Dormant Attention Heads: Mechanistically Demystifying Extreme-Token Phenomena in LLMs",
their Bigram-Backcopy task), which made a first-token attention sink and a massive first-token
activation form in transformers of one to three layers:

* filler: a chain of ``FILLER`` symbols, each drawn from the few likely successors of the one before
  (a fixed bigram table, the same for every seed): predicting it needs the current symbol only, so
  an attention head has nothing to look up;
* triggers: after a filler symbol, with probability ``TRIGGER_RATE``, one of ``TRIGGERS``; the symbol
  after the k-th trigger (k = 1, 2, ...) is the filler symbol k places *before* that trigger (a
  back-copy; Guo et al. copy from one place back, here each trigger has its own distance, so each
  needs a head of its own), and the chain goes on from the copied symbol. These positions, under a
  tenth of the synthetic ones, are the only ones where attention has work to do; at every other one
  each copying head is idle.

The filler and trigger symbols are ASCII punctuation the built-in text never uses, so a model can tell
a synthetic position from its own symbol. Gu et al. (ICLR 2025, "When Attention Sink Emerges in
Language Models") and Sun et al. (2024, "Massive Activations in Large Language Models") read the first
token's sink as a no-op: heads with nothing to add put their attention on a token whose value is
small; this corpus makes such positions the majority. The documents interleave by bytes: the next
document is text while the text written so far is below ``text_fraction`` of all bytes written.

Determinism: only ``random.Random`` (through the built-in corpus's choice helpers) seeded from ints,
and a fixed bigram table; the same (n_bytes, text_fraction, seed) gives the same bytes on every machine.
"""

from __future__ import annotations

import functools

from stability.data.builtin import Rng, builtin_corpus

__all__ = ["FILLER", "TRIGGERS", "TRIGGER_RATE", "backcopy_corpus", "backcopy_document"]

FILLER = "$%&'()/;<>@[]_{}"          # 16 symbols, none of them in the built-in text
TRIGGERS = "#^~|"                    # after the k-th comes the filler symbol k places before it
TRIGGER_RATE = 0.1                   # chance of a trigger after a filler symbol
SUCCESSORS = (0.6, 0.3, 0.1)         # probabilities of each filler symbol's likely successors
DOCUMENT_SYMBOLS = (200, 800)        # symbols per synthetic document, both ends included
_TABLE_SEED = 20241017


@functools.lru_cache(maxsize=1)
def _bigram_table() -> dict[str, tuple[str, ...]]:
    """Each filler symbol's successors, most likely first (fixed: every seed speaks the same chain)."""
    rng = Rng(_TABLE_SEED)
    table = {}
    for symbol in FILLER:
        pool = list(FILLER)
        table[symbol] = tuple(pool.pop(rng.below(len(pool))) for _ in SUCCESSORS)
    return table


def _successor(rng: Rng, symbol: str) -> str:
    r, total = rng.random(), 0.0
    followers = _bigram_table()[symbol]
    for follower, p in zip(followers, SUCCESSORS):
        total += p
        if r < total:
            return follower
    return followers[-1]


def backcopy_document(rng: Rng) -> str:
    """One synthetic document: a filler chain with back-copy triggers (see the module docstring)."""
    length = rng.between(*DOCUMENT_SYMBOLS)
    out = [rng.pick(FILLER)]
    while len(out) < length:
        if rng.chance(TRIGGER_RATE):
            distance = rng.between(1, len(TRIGGERS))
            if len(out) >= distance and out[-distance] in FILLER:   # copies filler only, never a trigger
                out += [TRIGGERS[distance - 1], out[-distance]]
                continue
        out.append(_successor(rng, out[-1]))   # the last symbol is filler: a trigger is never last
    return "".join(out)


@functools.lru_cache(maxsize=4)
def backcopy_corpus(n_bytes: int, text_fraction: float = 0.5, seed: int = 1234) -> bytes:
    """Exactly ``n_bytes`` of back-copy and built-in documents, about ``text_fraction`` of the bytes text.

    Deterministic in (n_bytes, text_fraction, seed); cached in memory."""
    if not isinstance(n_bytes, int) or isinstance(n_bytes, bool) or n_bytes < 0:
        raise ValueError(f"n_bytes={n_bytes!r} is invalid: expected a non-negative integer")
    if not isinstance(text_fraction, (int, float)) or not 0.0 <= text_fraction <= 1.0:
        raise ValueError(f"text_fraction={text_fraction!r} is invalid: expected a fraction in [0, 1]")
    text_docs = iter(builtin_corpus(n_bytes + 1024, seed).decode("ascii").split("\n\n")) if text_fraction else None
    rng = Rng(seed + 1)
    docs: list[str] = []
    written = text_written = 0
    while written < n_bytes:
        if text_docs is not None and text_written <= text_fraction * written:
            doc = next(text_docs)
            text_written += len(doc) + 2
        else:
            doc = backcopy_document(rng)
        docs.append(doc)
        written += len(doc) + 2
    return ("\n\n".join(docs) + "\n\n").encode("ascii")[:n_bytes]
