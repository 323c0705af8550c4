"""Tokenize local text / JSONL / Parquet files once into the harness's uint16 token-file format.

``token_file(data_config)`` returns the path of a ``.bin`` file of little-endian uint16 token ids
(the format ``stability.data`` memory-maps) for ``data.corpus`` tokenized by the Hugging Face
tokenizer in the local directory ``data.tokenizer`` (its ``tokenizer.json``, read with the
``tokenizers`` library; nothing is downloaded). The file is written the first time into
``data.token_dir`` under a name keyed by the tokenizer file, the source file (size and mtime) and
``data.text_field``, with a ``.json`` sidecar describing it; later runs find it and only map it.

Sources: ``.jsonl`` (one JSON object per line, the document in ``text_field``), ``.parquet`` (the
column ``text_field``, read in record batches with pyarrow) and any other file as UTF-8 text (one
document). Documents are separated by the tokenizer's end-of-text token when it has one
(``eos_token`` of tokenizer_config.json, else one of ``EOS_CANDIDATES``). The ``datasets`` library
is not used: one streaming pass over the file is all that is needed, and it would keep a second
copy of the text as an Arrow cache.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from stability.config import ConfigError, DataConfig

__all__ = ["token_file", "tokenize_to_file"]

FORMAT_VERSION = 1
EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>")
_BATCH_DOCS = 256        # documents per encode_batch call
_TEXT_CHUNK = 1 << 20    # characters of a text file encoded at once (split at line ends)


def _load_tokenizer(directory: Path):
    """The ``tokenizers.Tokenizer`` of a local directory; ConfigError naming it when there is none."""
    name = str(directory)
    if not directory.is_dir():
        raise ConfigError(f"data.tokenizer={name!r} does not exist: expected a local Hugging Face tokenizer "
                          f"directory holding tokenizer.json")
    if not (directory / "tokenizer.json").is_file():
        raise ConfigError(f"data.tokenizer={name!r} has no tokenizer.json: expected a directory saved by a Hugging "
                          f"Face fast tokenizer (tokenizer.save_pretrained or Tokenizer.save)")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ConfigError('data.tokenizer needs the tokenizers library: pip install -e ".[hf]"') from None
    try:
        return Tokenizer.from_file(str(directory / "tokenizer.json"))
    except Exception as error:  # noqa: BLE001 -- a corrupt tokenizer file is bad input
        raise ConfigError(f"data.tokenizer={name!r}: tokenizer.json cannot be loaded ({error})") from None


def _eos_id(tokenizer, directory: Path) -> int | None:
    """The end-of-text id that separates documents, or None when the tokenizer has none."""
    names = list(EOS_CANDIDATES)
    settings = directory / "tokenizer_config.json"
    if settings.is_file():
        eos = json.loads(settings.read_text()).get("eos_token")
        eos = eos.get("content") if isinstance(eos, dict) else eos
        if isinstance(eos, str):
            names.insert(0, eos)
    for name in names:
        token_id = tokenizer.token_to_id(name)
        if token_id is not None:
            return token_id
    return None


def _documents(source: Path, text_field: str) -> Iterator[str]:
    """The documents of a source file (see module docstring); ConfigError naming what is missing."""
    suffix = source.suffix.lower()
    if suffix == ".jsonl":
        with open(source, encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    item = json.loads(line)
                except json.JSONDecodeError as error:
                    raise ConfigError(f"data.corpus={str(source)!r} line {number} is not JSON ({error})") from None
                if not isinstance(item, dict) or not isinstance(item.get(text_field), str):
                    raise ConfigError(f"data.corpus={str(source)!r} line {number} has no string field "
                                      f"{text_field!r}: expected data.text_field to name the text")
                yield item[text_field]
    elif suffix == ".parquet":
        import pyarrow.parquet as pq

        table = pq.ParquetFile(source)
        if text_field not in table.schema_arrow.names:
            raise ConfigError(f"data.corpus={str(source)!r} has no column {text_field!r} (columns "
                              f"{table.schema_arrow.names}): expected data.text_field to name the text column")
        for batch in table.iter_batches(columns=[text_field]):
            yield from (text for text in batch.column(0).to_pylist() if text)
    else:
        with open(source, encoding="utf-8", errors="replace") as handle:
            while chunk := handle.read(_TEXT_CHUNK):
                yield chunk + handle.readline()  # finish the line so no word is cut


def tokenize_to_file(tokenizer_dir: str | Path, source: str | Path, out: str | Path, text_field: str = "text"
                     ) -> dict:
    """Tokenize ``source`` with the tokenizer of ``tokenizer_dir`` into the uint16 file ``out`` (written
    atomically). Returns the description written next to it as ``<out>.json``."""
    directory, source, out = Path(tokenizer_dir), Path(source), Path(out)
    tokenizer = _load_tokenizer(directory)
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    if vocab > 1 << 16:
        raise ConfigError(f"data.tokenizer={str(directory)!r} has {vocab} tokens: expected at most 65536 "
                          f"(the token file stores uint16 ids)")
    eos = _eos_id(tokenizer, directory)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    documents, tokens, batch = 0, 0, []

    def flush(handle) -> int:
        written = 0
        for encoding in tokenizer.encode_batch(batch, add_special_tokens=False):
            ids = encoding.ids + ([eos] if eos is not None and source.suffix.lower() in (".jsonl", ".parquet")
                                  else [])
            np.asarray(ids, dtype="<u2").tofile(handle)
            written += len(ids)
        batch.clear()
        return written

    with open(tmp, "wb") as handle:
        for text in _documents(source, text_field):
            batch.append(text)
            documents += 1
            if len(batch) >= _BATCH_DOCS:
                tokens += flush(handle)
        tokens += flush(handle)
    if tokens == 0:
        tmp.unlink()
        raise ConfigError(f"data.corpus={str(source)!r} gave no tokens: expected non-empty text")
    os.replace(tmp, out)
    info = {"kind": "tokenized", "source": str(source), "tokenizer": str(directory), "text_field": text_field,
            "tokenizer_vocab_size": vocab, "eos_id": eos, "documents": documents, "tokens": tokens,
            "format_version": FORMAT_VERSION}
    Path(str(out) + ".json").write_text(json.dumps(info, indent=1) + "\n")
    return info


def token_file(config: DataConfig) -> tuple[Path, dict]:
    """(path of the token file of ``config``, its description), tokenizing only when it is not there yet."""
    source, directory = Path(config.corpus), Path(config.tokenizer)
    if not source.is_file():
        raise ConfigError(f"data.corpus={config.corpus!r} does not exist: expected a text, .jsonl or .parquet file "
                          f"to tokenize with data.tokenizer")
    _load_tokenizer(directory)  # a missing or broken tokenizer is an error even when the file is cached
    stat = source.stat()
    key = hashlib.sha256()
    key.update((directory / "tokenizer.json").read_bytes())
    key.update(f"{source.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{config.text_field}|{FORMAT_VERSION}".encode())
    out = Path(config.token_dir) / f"{source.stem}-{key.hexdigest()[:16]}.bin"
    sidecar = Path(str(out) + ".json")
    if out.is_file() and sidecar.is_file():
        return out, {**json.loads(sidecar.read_text()), "cached": True}
    return out, {**tokenize_to_file(directory, source, out, config.text_field), "cached": False}
