"""Real text offline: the standard-library corpus (held out by file) and local files tokenized once by a
local Hugging Face tokenizer into the uint16 token-file format."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from stability import config as cfg
from stability.cli import main
from stability.config import ConfigError, DataConfig
from stability.data import load_corpus
from stability.data.stdlib import SEPARATOR, stdlib_corpus, stdlib_files, stdlib_root
from stability.record import Status


def test_stdlib_corpus_is_real_source_split_by_file_with_its_provenance():
    train, heldout, info = stdlib_corpus(0.1)
    files = stdlib_files()
    assert info["files"] == len(files) == info["train_files"] + info["heldout_files"]
    assert not any(part in ("test", "tests", "site-packages") for f in files for part in f.split("/"))
    assert 0.09 < info["heldout_bytes"] / info["bytes"] < 0.15 and info["bytes"] > 1_000_000
    root = stdlib_root()
    # a file is whole in exactly one split (sampled: files large enough not to recur inside others)
    sample = [f for f in files if (root / f).stat().st_size > 2000][:: max(1, len(files) // 40)]
    sides = [(root / name).read_bytes() in heldout for name in sample]
    for name, in_heldout in zip(sample, sides, strict=True):
        content = (root / name).read_bytes()
        assert in_heldout != (content in train), name
    assert any(sides) and not all(sides)
    assert len(heldout.split(SEPARATOR)) >= info["heldout_files"]
    assert b"def " in train and b"import " in heldout
    assert info["python"] and info["train_sha256"] != info["heldout_sha256"]
    assert stdlib_corpus(0.1)[0] is train  # read once per process
    again = stdlib_corpus(0.2)
    assert again[2]["heldout_bytes"] > info["heldout_bytes"]


def test_stdlib_corpus_loads_as_bytes_and_its_info_reaches_the_record():
    corpus = load_corpus(DataConfig(corpus="stdlib"), vocab_size=257, context=64)
    assert corpus.bos_id == 256 and corpus.train.dtype == np.uint8
    assert corpus.info["kind"] == "stdlib" and corpus.info["train_tokens"] == len(corpus.train)
    with pytest.raises(ConfigError, match=r"model\.vocab_size=100 is too small for the byte corpus 'stdlib'"):
        load_corpus(DataConfig(corpus="stdlib"), vocab_size=100)


def test_the_full_preset_starts_on_a_machine_without_data_files(tmp_path, monkeypatch, capsys):
    assert cfg.preset("full").run.data.corpus == "stdlib"
    monkeypatch.chdir(tmp_path)
    shrink = {"device": "cpu", "steps": 2, "model.backend": "torch", "model.d_model": 32, "model.n_layers": 1,
              "model.n_heads": 2, "model.n_kv_heads": 1, "model.context": 32, "data.batch_size": 2, "seeds": "0",
              "probes.eval_batches": 1, "probes.probe_batch_size": 1}
    args = [x for key, value in shrink.items() for x in ("--set", f"{key}={value}")]
    assert main(["run", "--preset", "full", *args, "--no-track", "--quiet"]) == 0
    (path,) = [p for p in tmp_path.glob("reports/runs/*/*.json") if p.name != "manifest.json"]
    record = json.loads(path.read_text())
    assert record["corpus"]["kind"] == "stdlib" and record["corpus"]["heldout_files"] > 0
    assert [a["status"] for a in record["arms"]] == [Status.COMPLETED, Status.COMPLETED]
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the root conftest turns the interpreter on for the tests
    assert main(["run", "--preset", "full", "--set", "device=cpu", "--no-track"]) == 2  # triton on the CPU
    assert "model.backend='triton' is invalid with device='cpu'" in capsys.readouterr().err


# ----------------------------------------------------------------------------- tokenized files

DOCS = [f"document {i}: the quick brown fox jumps over the lazy dog number {i}." for i in range(40)]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    """A tiny word-level tokenizer trained here (nothing downloaded), saved as a HF tokenizer directory."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers, trainers

    tokenizer = tokenizers.Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(DOCS, trainers.WordLevelTrainer(special_tokens=["[UNK]", "</s>"]))
    directory = tmp_path_factory.mktemp("tokenizer")
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    return directory


def _sources(directory):
    jsonl = directory / "docs.jsonl"
    jsonl.write_text("".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(DOCS)))
    text = directory / "docs.txt"
    text.write_text("\n".join(DOCS))
    import pyarrow as pa
    import pyarrow.parquet as pq

    parquet = directory / "docs.parquet"
    pq.write_table(pa.table({"body": DOCS}), parquet)
    return {"jsonl": (jsonl, "text"), "txt": (text, "text"), "parquet": (parquet, "body")}


@pytest.mark.parametrize("kind", ["jsonl", "txt", "parquet"])
def test_local_files_are_tokenized_once_then_memory_mapped(tmp_path, tokenizer_dir, kind):
    from tokenizers import Tokenizer

    source, field = _sources(tmp_path)[kind]
    data = DataConfig(corpus=str(source), tokenizer=str(tokenizer_dir), text_field=field,
                      token_dir=str(tmp_path / "tokens"), holdout_fraction=0.2)
    corpus = load_corpus(data, vocab_size=64, context=8)
    (written,) = (tmp_path / "tokens").glob("*.bin")
    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    eos = tokenizer.token_to_id("</s>")
    first = tokenizer.encode(DOCS[0], add_special_tokens=False).ids
    tokens = np.concatenate([corpus.train, corpus.heldout])
    assert isinstance(corpus.train, np.memmap) and tokens.dtype == np.uint16
    assert tokens[: len(first)].tolist() == first
    if kind != "txt":  # documents of a JSONL / Parquet file end with the tokenizer's end-of-text token
        assert tokens[len(first)] == eos and corpus.info["documents"] == len(DOCS)
    assert corpus.info["kind"] == "tokenized" and corpus.info["cached"] is False and corpus.bos_id == 63
    stamp = os.stat(written).st_mtime_ns
    again = load_corpus(data, vocab_size=64, context=8)
    assert again.info["cached"] is True and os.stat(written).st_mtime_ns == stamp  # not written twice
    assert np.array_equal(np.concatenate([again.train, again.heldout]), tokens)


def test_bad_tokenized_input_is_a_clear_error(tmp_path, tokenizer_dir, monkeypatch, capsys):
    source, _ = _sources(tmp_path)["jsonl"]
    base = DataConfig(corpus=str(source), tokenizer=str(tokenizer_dir), token_dir=str(tmp_path / "tokens"))
    with pytest.raises(ConfigError, match=r"data\.tokenizer='.*no-such-tokenizer' does not exist: expected a local "
                                          r"Hugging Face tokenizer directory"):
        load_corpus(DataConfig(corpus=str(source), tokenizer=str(tmp_path / "no-such-tokenizer")), 64)
    with pytest.raises(ConfigError, match=r"holds token id \d+ \(its max id\) but model\.vocab_size=10"):
        load_corpus(base, vocab_size=10)
    with pytest.raises(ConfigError, match=r"line 1 has no string field 'body'"):
        load_corpus(DataConfig(corpus=str(source), tokenizer=str(tokenizer_dir), text_field="body",
                               token_dir=str(tmp_path / "t2")), 64)
    with pytest.raises(ConfigError, match=r"data\.corpus='stdlib' is invalid: expected a text, \.jsonl or \.parquet"):
        DataConfig(corpus="stdlib", tokenizer=str(tokenizer_dir))
    monkeypatch.chdir(tmp_path)
    code = main(["run", "--preset", "smoke", "--set", f"data.corpus={source}", "--set",
                 f"data.tokenizer={tmp_path / 'missing'}", "--no-track"])
    assert code == 2 and f"data.tokenizer='{tmp_path / 'missing'}' does not exist" in capsys.readouterr().err
