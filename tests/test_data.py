"""Tests of stability.data.builtin and stability.data: the built-in corpus, loading, validation and batches."""

from __future__ import annotations

import hashlib
import os
import re

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stability import data as data_module
from stability.config import ConfigError, DataConfig
from stability.data import BOS_ID, Corpus, eval_batches, get_batch, load_corpus, probe_batch
from stability.data.backcopy import FILLER, TRIGGERS, backcopy_corpus
from stability.data.builtin import builtin_corpus

SMALL = DataConfig(builtin_bytes=60_000)

# sha256 of builtin_corpus(20_000) with the default seed. It pins the generator across machines and
# Python versions; if you change the grammar on purpose, update it in the same change.
BUILTIN_20K_SHA256 = "e1a751749ca3f4468b86a0305d48407718f63376a4e64e33456321f38ec5b264"
# sha256 of backcopy_corpus(20_000, 0.5) with the default seed (the same pin for the back-copy generator)
BACKCOPY_20K_SHA256 = "01375bceefdc83cd1e4856cc6242c20720aa106dccc412944a5e3a139267f11a"


@pytest.fixture(scope="module")
def small_corpus() -> Corpus:
    return load_corpus(SMALL, vocab_size=257)


def _arange_file(tmp_path, n: int = 5000, name: str = "arange.bin"):
    """A token file whose token at position i is i, so every value reveals its position."""
    path = tmp_path / name
    np.arange(n, dtype=np.uint16).tofile(path)
    return path


# ----------------------------------------------------------------------------- builtin corpus

def test_builtin_corpus_is_deterministic_exact_length_ascii_and_pinned():
    first = builtin_corpus(12_345)
    builtin_corpus.cache_clear()  # regenerate rather than hit the cache
    second = builtin_corpus(12_345)
    assert first == second
    assert len(first) == 12_345 and isinstance(first, bytes)
    first.decode("ascii")  # raises if not ASCII
    assert builtin_corpus(100_000)[:12_345] == first  # prefix property
    assert builtin_corpus(12_345, seed=99) != first
    assert len(builtin_corpus(0)) == 0
    assert hashlib.sha256(builtin_corpus(20_000)).hexdigest() == BUILTIN_20K_SHA256


def test_builtin_corpus_has_documents_records_lists_and_correct_arithmetic():
    text = builtin_corpus(200_000).decode("ascii")
    assert text.count("\n\n") > 100  # many documents, separated by blank lines
    assert re.search(r"^name: [A-Z][a-z]+ [A-Z][a-z]+$", text, re.MULTILINE)  # key: value records
    assert re.search(r"^1\. .+\n2\. .+\n3\. ", text, re.MULTILINE)  # numbered lists
    sums = re.findall(r"^(\d+) ([-+*]) (\d+) = (\d+)$", text, re.MULTILINE)
    assert len(sums) > 200
    ops = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
    assert all(ops[op](int(a), int(b)) == int(c) for a, op, b, c in sums)
    assert re.search(r'"[A-Z][^"\n]*[,?]" [A-Z][a-z]+', text)  # quoted speech with a named speaker


def _entropy_bits(probabilities: np.ndarray) -> float:
    p = probabilities[probabilities > 0]
    return float(-(p * np.log2(p)).sum())


def _ngram_cross_entropy(train: np.ndarray, test: np.ndarray, order: int, vocab: int = 128) -> float:
    """Bits/byte of an interpolated n-gram byte model (add-one unigram at the bottom) on ``test``."""
    p = (np.bincount(train, minlength=vocab)[test] + 1.0) / (len(train) + vocab)
    for k in range(1, order):
        code_train = np.zeros(len(train) - k, np.int64)
        code_test = np.zeros(len(test) - k, np.int64)
        for j in range(k + 1):
            code_train = code_train * vocab + train[j:len(train) - k + j]
            code_test = code_test * vocab + test[j:len(test) - k + j]
        joint = np.bincount(code_train, minlength=vocab ** (k + 1))
        context = np.bincount(code_train // vocab, minlength=vocab ** k)
        p = (joint[code_test] + p[-len(code_test):]) / (context[code_test // vocab] + 1.0)
    return float(-np.log2(p).mean())


def test_builtin_corpus_is_learnable_trigram_beats_unigram_by_over_one_bit():
    corpus = load_corpus(DataConfig(builtin_bytes=300_000), vocab_size=257)
    train = np.asarray(corpus.train[:200_000], dtype=np.int64)
    heldout = np.asarray(corpus.heldout, dtype=np.int64)
    assert train.max() < 128 and heldout.max() < 128
    unigram = _entropy_bits(np.bincount(train, minlength=128) / len(train))
    trigram = _ngram_cross_entropy(train, heldout, order=3)
    assert 3.5 < unigram < 5.5, unigram  # English-like letter statistics
    assert trigram < unigram - 1.0, (unigram, trigram)


# ----------------------------------------------------------------------------- back-copy corpus

def test_backcopy_corpus_is_deterministic_exact_length_ascii_and_pinned():
    first = backcopy_corpus(50_000, 0.5)
    backcopy_corpus.cache_clear()
    assert backcopy_corpus(50_000, 0.5) == first and len(first) == 50_000
    first.decode("ascii")
    assert backcopy_corpus(50_000, 0.5, seed=99) != first
    assert backcopy_corpus(50_000, 0.25) != first
    assert hashlib.sha256(backcopy_corpus(20_000, 0.5)).hexdigest() == BACKCOPY_20K_SHA256


@pytest.mark.parametrize("fraction", [0.0, 0.25, 0.5, 1.0])
def test_backcopy_corpus_mixes_text_at_the_fraction_and_every_trigger_copies(fraction):
    text = backcopy_corpus(200_000, fraction).decode("ascii")
    synthetic_symbols = set(FILLER + TRIGGERS)
    assert not synthetic_symbols & set(builtin_corpus(200_000).decode("ascii"))  # a position tells its kind
    docs = [d for d in text.split("\n\n")[:-1] if d]
    synthetic = sum(len(d) for d in docs if set(d) <= synthetic_symbols)
    share = 1 - synthetic / sum(len(d) for d in docs)
    assert abs(share - fraction) < 0.03, (share, fraction)
    triggers = [i for i, c in enumerate(text[:-1]) if c in TRIGGERS]
    if fraction < 1:
        assert 0.05 < len(triggers) / synthetic < 0.1   # under a tenth of the synthetic positions
    for i in triggers:  # the k-th trigger is followed by the filler symbol k places before it
        distance = TRIGGERS.index(text[i]) + 1
        assert text[i + 1] == text[i - distance] and text[i - distance] in FILLER, (i, text[i - 6:i + 2])


def test_backcopy_corpus_loads_with_bos_and_says_what_it_is():
    corpus = load_corpus(DataConfig(corpus="backcopy", builtin_bytes=60_000, text_fraction=0.0), vocab_size=257,
                         context=64)
    assert corpus.info["kind"] == "backcopy" and corpus.info["text_fraction"] == 0.0
    x, _ = get_batch(corpus, "train", 0, 4, 64, seed=0)
    assert (x[:, 0] == BOS_ID).all() and set(x[:, 1:].unique().tolist()) <= {ord(c) for c in FILLER + TRIGGERS + "\n"}


@pytest.mark.parametrize("value", [-0.1, 1.5, float("nan"), "half", True])
def test_a_text_fraction_outside_zero_to_one_is_a_config_error(value):
    with pytest.raises(ConfigError, match="data.text_fraction=.* is invalid: expected a fraction in \\[0, 1\\]"):
        DataConfig(corpus="backcopy", text_fraction=value)


# ----------------------------------------------------------------------------- batches

def test_bos_is_at_position_zero_of_every_sequence(small_corpus):
    x, y = get_batch(small_corpus, "train", 3, 16, 32, seed=0)
    assert torch.all(x[:, 0] == BOS_ID)
    assert not torch.any(x[:, 1:] == BOS_ID) and not torch.any(y == BOS_ID)
    x, _ = get_batch(small_corpus, "train", 3, 16, 32, seed=0, bos=False)
    assert not torch.any(x == BOS_ID)


@pytest.mark.parametrize("bos", [True, False])
def test_y_is_x_shifted_by_one(tmp_path, bos):
    corpus = load_corpus(DataConfig(corpus=str(_arange_file(tmp_path))), vocab_size=5001)
    x, y = get_batch(corpus, "train", 1, 8, 24, seed=5, bos=bos)
    assert torch.equal(x[:, 1:], y[:, :-1])
    body = x[:, 1:] if bos else x
    assert torch.equal(y[:, -body.shape[1]:], body + 1)  # consecutive tokens of the file
    assert torch.equal(y, y[:, :1] + torch.arange(24))  # each row of y is one contiguous run


def test_get_batch_is_deterministic_and_independent_of_history(small_corpus):
    args = (small_corpus, "train", 7, 8, 32)
    reference = get_batch(*args, seed=3)
    for i in range(7):  # draw other batches, and disturb the global RNG
        get_batch(small_corpus, "train", i, 8, 32, seed=3)
    torch.manual_seed(12345)
    np.random.seed(12345)
    again = get_batch(*args, seed=3)
    assert torch.equal(reference[0], again[0]) and torch.equal(reference[1], again[1])
    assert reference[0].dtype == torch.int64 and reference[0].shape == (8, 32)


def test_different_seeds_and_indexes_give_different_batches(small_corpus):
    a = get_batch(small_corpus, "train", 0, 8, 32, seed=0)[0]
    b = get_batch(small_corpus, "train", 0, 8, 32, seed=1)[0]
    c = get_batch(small_corpus, "train", 1, 8, 32, seed=0)[0]
    assert not torch.equal(a, b)
    assert not torch.equal(a, c)


def test_train_and_heldout_regions_do_not_overlap(tmp_path):
    n, fraction = 5000, 0.2
    corpus = load_corpus(DataConfig(corpus=str(_arange_file(tmp_path, n)), holdout_fraction=fraction),
                         vocab_size=n + 1)
    boundary = n - round(n * fraction)
    assert len(corpus.train) == boundary and len(corpus.heldout) == n - boundary
    for bos in (True, False):
        for index in range(20):
            for split, low, high in (("train", 0, boundary), ("heldout", boundary, n)):
                x, y = get_batch(corpus, split, index, 16, 50, seed=index, bos=bos)
                tokens = torch.cat([x[:, 1:] if bos else x, y], dim=1)
                assert tokens.min() >= low and tokens.max() < high, (split, index, bos)
    builtin = load_corpus(SMALL, vocab_size=257)  # by construction for the byte corpus too
    whole = builtin_corpus(SMALL.builtin_bytes)
    assert bytes(builtin.train) + bytes(builtin.heldout) == whole
    assert len(builtin.heldout) == round(len(whole) * SMALL.holdout_fraction)


def test_uint16_token_file_round_trips(tmp_path):
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 50257, size=20_000, dtype=np.uint16)
    tokens[123] = 50256  # the max id, as GPT-2's end-of-text
    path = tmp_path / "tokens.bin"
    tokens.tofile(path)
    corpus = load_corpus(DataConfig(corpus=str(path)), vocab_size=50304)
    assert isinstance(corpus.train, np.memmap) and corpus.train.dtype == np.uint16
    assert np.array_equal(np.concatenate([corpus.train, corpus.heldout]), tokens)
    assert corpus.bos_id == 50303 and corpus.vocab_size == 50304
    x, y = get_batch(corpus, "heldout", 2, 4, 16, seed=1, bos=False)
    held = np.asarray(corpus.heldout, dtype=np.int64)
    windows = np.lib.stride_tricks.sliding_window_view(held, 17)
    for row_x, row_y in zip(x.numpy(), y.numpy()):
        window = np.concatenate([row_x, row_y[-1:]])
        assert np.any(np.all(windows == window, axis=1))  # each row is a real window of the file


def test_token_file_using_last_id_has_no_bos(tmp_path):
    path = tmp_path / "full.bin"
    np.array([0, 1, 2, 99] * 500, dtype=np.uint16).tofile(path)
    with pytest.raises(ConfigError, match="99"):
        load_corpus(DataConfig(corpus=str(path)), vocab_size=100)
    corpus = load_corpus(DataConfig(corpus=str(path), bos=False), vocab_size=100)
    assert corpus.bos_id is None
    with pytest.raises(ValueError, match="bos=False"):
        get_batch(corpus, "train", 0, 2, 8, seed=0, bos=True)
    assert get_batch(corpus, "train", 0, 2, 8, seed=0, bos=False)[0].shape == (2, 8)


def test_text_file_is_read_as_bytes(tmp_path):
    path = tmp_path / "text.txt"
    payload = ("hello world, caf\u00e9 " * 300).encode("utf-8")
    path.write_bytes(payload)
    corpus = load_corpus(DataConfig(corpus=str(path)), vocab_size=257)
    assert bytes(corpus.train) + bytes(corpus.heldout) == payload
    assert corpus.bos_id == BOS_ID


def test_unknown_split_is_a_clear_value_error(small_corpus):
    with pytest.raises(ValueError, match="'validation'"):
        get_batch(small_corpus, "validation", 0, 2, 8, seed=0)


def test_eval_and_probe_batches_are_fixed_heldout_and_seed_free(tmp_path):
    n = 5000
    corpus = load_corpus(DataConfig(corpus=str(_arange_file(tmp_path, n))), vocab_size=n + 1)
    boundary = len(corpus.train)
    first = eval_batches(corpus, 3, 4, 16)
    second = eval_batches(corpus, 3, 4, 16)
    assert len(first) == 3
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(first, second))
    assert all(y.min() >= boundary for _, y in first)
    assert not torch.equal(first[0][0], first[1][0])
    px, py = probe_batch(corpus, 4, 16)
    assert torch.equal(px, probe_batch(corpus, 4, 16)[0]) and py.min() >= boundary
    assert px.shape == (4, 16) and not torch.equal(px, first[0][0])


# ----------------------------------------------------------------------------- validation

def _expect_config_error(config: DataConfig, vocab_size: int, *fragments: str, context=None) -> None:
    with pytest.raises(ConfigError) as info:
        load_corpus(config, vocab_size, context=context)
    for fragment in fragments:
        assert fragment in str(info.value), (fragment, str(info.value))


def test_missing_corpus_file_raises_config_error(tmp_path):
    path = str(tmp_path / "nope.bin")
    _expect_config_error(DataConfig(corpus=path), 50304, path, "does not exist")
    _expect_config_error(DataConfig(corpus=path[:-4] + ".txt"), 257, "nope.txt", "does not exist")


def test_empty_corpus_file_raises_config_error(tmp_path):
    for name in ("empty.bin", "empty.txt"):
        (tmp_path / name).write_bytes(b"")
        _expect_config_error(DataConfig(corpus=str(tmp_path / name)), 50304, name, "empty")


def test_directory_as_corpus_raises_config_error(tmp_path):
    folder = tmp_path / "folder.bin"
    folder.mkdir()
    _expect_config_error(DataConfig(corpus=str(folder)), 50304, str(folder), "directory")


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root can read any file")
def test_unreadable_corpus_file_raises_config_error(tmp_path):
    path = tmp_path / "secret.txt"
    path.write_bytes(b"x" * 5000)
    path.chmod(0)
    try:
        _expect_config_error(DataConfig(corpus=str(path)), 257, "secret.txt", "cannot be read")
    finally:
        path.chmod(0o600)


def test_odd_length_token_file_raises_config_error(tmp_path):
    path = tmp_path / "odd.bin"
    path.write_bytes(b"\x01\x00" * 100 + b"\x07")
    _expect_config_error(DataConfig(corpus=str(path)), 50304, "odd.bin", "201 bytes")


def test_token_id_beyond_vocab_raises_config_error_after_scanning_every_chunk(tmp_path, monkeypatch):
    path = tmp_path / "big_ids.bin"
    tokens = np.zeros(10_000, dtype=np.uint16)
    tokens[-1] = 777  # only in the last chunk
    tokens.tofile(path)
    monkeypatch.setattr(data_module, "_SCAN_CHUNK", 1000)
    _expect_config_error(DataConfig(corpus=str(path)), 500, "777", "vocab_size=500")
    assert load_corpus(DataConfig(corpus=str(path)), 779).bos_id == 778


def test_byte_corpus_with_small_vocab_raises_config_error():
    _expect_config_error(SMALL, 256, "vocab_size=256", "257")


def test_corpus_too_short_for_context_raises_config_error(small_corpus):
    config = DataConfig(builtin_bytes=10_000)
    _expect_config_error(config, 257, "heldout", "1000", "9000", "context=4096", context=4096)
    corpus = load_corpus(config, 257)  # no context given: get_batch checks
    with pytest.raises(ConfigError, match="1000"):
        get_batch(corpus, "heldout", 0, 2, 1001, seed=0, bos=False)
    assert get_batch(corpus, "heldout", 0, 2, 1000, seed=0, bos=True)[0].shape == (2, 1000)
    assert get_batch(corpus, "heldout", 0, 2, 999, seed=0, bos=False)[0].shape == (2, 999)


# ----------------------------------------------------------------------------- property

@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch_size=st.integers(1, 8), context=st.integers(1, 96), index=st.integers(0, 10**9),
       seed=st.integers(0, 2**31 - 1), bos=st.booleans(), split=st.sampled_from(["train", "heldout"]))
def test_batch_shapes_dtypes_and_ranges_hold_for_any_arguments(small_corpus, batch_size, context, index,
                                                               seed, bos, split):
    x, y = get_batch(small_corpus, split, index, batch_size, context, seed, bos=bos)
    assert x.shape == y.shape == (batch_size, context)
    assert x.dtype == y.dtype == torch.int64
    assert int(x.min()) >= 0 and int(x.max()) < small_corpus.vocab_size
    assert int(y.min()) >= 0 and int(y.max()) < 256  # targets are bytes, never BOS
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert torch.all((x[:, 0] == BOS_ID) == bos)
