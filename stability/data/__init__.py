"""Corpora to deterministic batches.

A corpus is one of:

* ``"builtin"``: ``stability.data.builtin.builtin_corpus(config.builtin_bytes)``, byte-level;
* ``"backcopy"``: ``stability.data.backcopy.backcopy_corpus(config.builtin_bytes, config.text_fraction)``,
  byte-level: synthetic back-copy documents, where most positions have nothing to attend to, beside
  the built-in text;
* ``"stdlib"``: the source files of the running Python's standard library
  (``stability.data.stdlib``), byte-level, held-out split by file;
* a path ending in ``.bin``: a nanoGPT-style file of little-endian uint16 token ids, memory-mapped;
* a text / JSONL / Parquet file with ``data.tokenizer`` set to a local Hugging Face tokenizer
  directory: tokenized once into a ``.bin`` token file (``stability.data.tokens``), memory-mapped after;
* any other path: a text file read as raw bytes (memory-mapped as uint8), byte-level.

Except for "stdlib", the last ``holdout_fraction`` of the tokens is the held-out split; the rest is
train. Windows never cross the boundary, so the two splits share no token position. ``Corpus.info``
says what the corpus is (kind, size, provenance); the experiment copies it into the record.

BOS. Byte corpora use ids 0..255 for bytes and ``BOS_ID = 256``, so ``vocab_size >= 257``. For a
``.bin`` token file the file's own BOS convention is unknown to us, so the harness reserves the
*last* id of the model's vocabulary, ``bos_id = vocab_size - 1``, when no token in the file uses it
(true for GPT-2 tokens, max id 50256, with vocab_size padded to 50304). If the file does use that id,
``bos_id`` is None; then ``data.bos=True`` is a ConfigError (raise model.vocab_size by one, or set
data.bos=false).

Batches. ``get_batch(corpus, split, index, batch_size, context, seed)`` draws ``batch_size`` window
offsets uniformly with a ``torch.Generator`` seeded from a fixed mix of (seed, index, split), so batch
``index`` is the same on every machine and does not depend on which batches were drawn before; both
arms of a paired run get identical batches. With BOS a window is ``[BOS] + tokens[o : o + context]``
and x, y = window[:-1], window[1:]; without BOS x = tokens[o : o + context] and
y = tokens[o + 1 : o + context + 1]. Both are (batch_size, context) int64.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from stability.config import ConfigError, DataConfig
from stability.data.backcopy import backcopy_corpus
from stability.data.builtin import builtin_corpus
from stability.data.stdlib import stdlib_corpus

__all__ = ["BOS_ID", "SPLITS", "Corpus", "eval_batches", "get_batch", "load_corpus", "probe_batch"]

BOS_ID = 256
SPLITS = ("train", "heldout")
EVAL_SEED = 0x5EED_E7A1   # held-out evaluation batches: fixed, independent of the run seed
PROBE_SEED = 0x5EED_9B0E  # the single probe batch: fixed, distinct from the eval batches
_SCAN_CHUNK = 1 << 24     # tokens per chunk when scanning a token file for its max id
_MASK64 = (1 << 64) - 1


@dataclass
class Corpus:
    """Token ids split into train and held-out parts (1-D integer arrays, possibly memory-mapped)."""

    name: str
    train: np.ndarray
    heldout: np.ndarray
    vocab_size: int
    bos_id: int | None
    info: dict = field(default_factory=dict)

    def split(self, split: str) -> np.ndarray:
        if split == "train":
            return self.train
        if split == "heldout":
            return self.heldout
        raise ValueError(f"split={split!r} is unknown: expected one of {SPLITS}")


# ----------------------------------------------------------------------------- loading

def _check_file(path: Path) -> int:
    """The file's size in bytes, or a ConfigError saying why it cannot be used."""
    if not path.exists():
        raise ConfigError(f"data.corpus={str(path)!r} does not exist: expected 'builtin' or a path to an "
                          f"existing text or .bin token file")
    if path.is_dir():
        raise ConfigError(f"data.corpus={str(path)!r} is a directory: expected a text or .bin token file")
    try:
        with open(path, "rb") as handle:
            handle.read(1)
        size = os.path.getsize(path)
    except OSError as error:
        raise ConfigError(f"data.corpus={str(path)!r} cannot be read ({error.strerror or error}): "
                          f"expected a readable file") from None
    if size == 0:
        raise ConfigError(f"data.corpus={str(path)!r} is empty (0 bytes): expected a non-empty file")
    return size


def _max_id(tokens: np.ndarray) -> int:
    """The largest id, scanned in chunks so a large memmap is never loaded whole."""
    best = 0
    for start in range(0, len(tokens), _SCAN_CHUNK):
        best = max(best, int(tokens[start:start + _SCAN_CHUNK].max()))
    return best


def _check_vocab(vocab_size: int) -> None:
    if not isinstance(vocab_size, (int, np.integer)) or isinstance(vocab_size, bool) or vocab_size <= 0:
        raise ConfigError(f"model.vocab_size={vocab_size!r} is invalid: expected a positive integer")


def _sequence_need(context: int, bos: bool) -> int:
    """Tokens one sequence of ``context`` positions takes from a split."""
    return context if bos else context + 1


def _check_lengths(corpus: Corpus, context: int, bos: bool) -> None:
    need = _sequence_need(context, bos)
    for split in SPLITS:
        have = len(corpus.split(split))
        if have < need:
            raise ConfigError(
                f"data.corpus={corpus.name!r} is too short: its {split} split has {have} tokens "
                f"(train {len(corpus.train)}, heldout {len(corpus.heldout)}) but one sequence of "
                f"context={context} {'with' if bos else 'without'} BOS needs {need}: expected a longer "
                f"corpus, a smaller context or another data.holdout_fraction")


def _byte_corpus(config: DataConfig, vocab_size: int) -> tuple[np.ndarray | None, dict, tuple | None]:
    """(tokens, info, presplit) of a byte-level corpus; presplit is (train, heldout) for "stdlib"."""
    if vocab_size < BOS_ID + 1:
        raise ConfigError(f"model.vocab_size={vocab_size} is too small for the byte corpus "
                          f"{config.corpus!r}: expected at least {BOS_ID + 1} (256 bytes + BOS)")
    if config.corpus == "builtin":
        data = builtin_corpus(config.builtin_bytes)
        return np.frombuffer(data, dtype=np.uint8), {"kind": "builtin", "bytes": len(data),
                                                     "description": "generated English-like text"}, None
    if config.corpus == "backcopy":
        data = backcopy_corpus(config.builtin_bytes, float(config.text_fraction))
        return np.frombuffer(data, dtype=np.uint8), {
            "kind": "backcopy", "bytes": len(data), "text_fraction": config.text_fraction,
            "description": "synthetic back-copy documents beside generated English-like text"}, None
    if config.corpus == "stdlib":
        train, heldout, info = stdlib_corpus(config.holdout_fraction)
        return None, dict(info), (np.frombuffer(train, dtype=np.uint8), np.frombuffer(heldout, dtype=np.uint8))
    path = Path(config.corpus)
    size = _check_file(path)
    return np.memmap(path, dtype=np.uint8, mode="r"), {"kind": "bytes", "path": str(path), "bytes": size}, None


def _token_file(path: Path, config: DataConfig, vocab_size: int) -> tuple[np.ndarray, dict, int | None]:
    """(tokens, info, bos_id) of a uint16 token file, every id checked against the vocabulary."""
    name = str(path)
    size = _check_file(path)
    if size % 2:
        raise ConfigError(f"data.corpus={name!r} has an odd length of {size} bytes: expected a "
                          f"uint16 token file (an even number of bytes)")
    tokens = np.memmap(path, dtype=np.uint16, mode="r")
    top = _max_id(tokens)
    if top >= vocab_size:
        raise ConfigError(f"data.corpus={name!r} holds token id {top} (its max id) but "
                          f"model.vocab_size={vocab_size}: expected every id below the vocab size "
                          f"(set model.vocab_size to at least {top + 2} to leave room for BOS)")
    bos_id = vocab_size - 1 if top < vocab_size - 1 else None
    if config.bos and bos_id is None:
        raise ConfigError(f"data.corpus={name!r} uses id {top} = model.vocab_size - 1, which "
                          f"the harness reserves for BOS: expected model.vocab_size >= {top + 2} or "
                          f"data.bos=false")
    return tokens, {"kind": "tokens", "path": name, "tokens": len(tokens), "max_id": top}, bos_id


def load_corpus(config: DataConfig, vocab_size: int, context: int | None = None) -> Corpus:
    """Load and validate the corpus named by ``config.corpus``; every problem is a ConfigError.

    ``context`` (optional): also check that each split holds at least one sequence of that length
    (``get_batch`` checks again in any case)."""
    _check_vocab(vocab_size)
    vocab_size = int(vocab_size)
    presplit = None
    if config.tokenizer:
        from stability.data.tokens import token_file

        path, source_info = token_file(config)
        tokens, info, bos_id = _token_file(path, config, vocab_size)
        info = {**info, **source_info}
    elif config.corpus.endswith(".bin"):
        tokens, info, bos_id = _token_file(Path(config.corpus), config, vocab_size)
    else:
        tokens, info, presplit = _byte_corpus(config, vocab_size)
        bos_id = BOS_ID
    if presplit is None:
        n = len(tokens)
        n_held = round(n * config.holdout_fraction)
        presplit = (tokens[: n - n_held], tokens[n - n_held:])
        info["split"] = f"by position: the last {config.holdout_fraction:g} of the tokens"
    train, heldout = presplit
    info.update(name=config.corpus, train_tokens=len(train), heldout_tokens=len(heldout))
    corpus = Corpus(name=config.corpus, train=train, heldout=heldout, vocab_size=vocab_size, bos_id=bos_id,
                    info=info)
    if context is not None:
        _check_lengths(corpus, context, config.bos)
    return corpus


# ----------------------------------------------------------------------------- batches

def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def batch_seed(seed: int, index: int, split: str) -> int:
    """The generator seed of batch ``index`` of ``split`` under run seed ``seed`` (pure integer math)."""
    base = (seed * 1_000_003 + index) & _MASK64
    return _splitmix64(base ^ (0 if split == "train" else 0xA5A5_A5A5_5A5A_5A5A)) >> 1  # fits int64


def get_batch(corpus: Corpus, split: str, index: int, batch_size: int, context: int, seed: int,
              bos: bool = True, device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Batch number ``index`` of ``split``: (x, y), each (batch_size, context) int64 on ``device``."""
    tokens = corpus.split(split)
    for name, value, low in (("index", index, 0), ("batch_size", batch_size, 1), ("context", context, 1)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low:
            raise ValueError(f"{name}={value!r} is invalid: expected an integer >= {low}")
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool):
        raise TypeError(f"seed={seed!r} is invalid: expected an integer")
    if bos and corpus.bos_id is None:
        raise ValueError(f"corpus {corpus.name!r} has no BOS id: call get_batch with bos=False")
    need = _sequence_need(context, bos)
    if len(tokens) < need:
        _check_lengths(corpus, context, bos)
    generator = torch.Generator(device="cpu")
    generator.manual_seed(batch_seed(int(seed), int(index), split))
    offsets = torch.randint(0, len(tokens) - need + 1, (batch_size,), generator=generator).numpy()
    rows = np.asarray(tokens[offsets[:, None] + np.arange(need)[None, :]], dtype=np.int64)
    if bos:
        rows = np.concatenate([np.full((batch_size, 1), corpus.bos_id, dtype=np.int64), rows], axis=1)
    window = torch.from_numpy(rows)
    x, y = window[:, :-1].contiguous(), window[:, 1:].contiguous()
    if str(device) != "cpu":
        x, y = x.to(device), y.to(device)
    return x, y


def eval_batches(corpus: Corpus, n_batches: int, batch_size: int, context: int, bos: bool = True,
                 device="cpu") -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n_batches`` fixed held-out batches, the same for every run seed and arm."""
    return [get_batch(corpus, "heldout", i, batch_size, context, EVAL_SEED, bos=bos, device=device)
            for i in range(n_batches)]


def probe_batch(corpus: Corpus, batch_size: int, context: int, bos: bool = True,
                device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """One fixed held-out batch for the heavy probes, the same for every run seed and arm."""
    return get_batch(corpus, "heldout", 0, batch_size, context, PROBE_SEED, bos=bos, device=device)
