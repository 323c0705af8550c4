"""A real-text corpus that every machine has: the Python standard library's own source files.

``stdlib_corpus(holdout_fraction)`` reads the ``.py`` files of the running interpreter's standard
library (``sysconfig.get_paths()["stdlib"]``) as raw bytes and returns the train and held-out
byte strings with a description of where they came from. Nothing is downloaded and nothing is
generated: the text is code, comments and docstrings written by people (about 12 MB on
CPython 3.11, ~730 files).

* Files: every ``*.py`` below the standard-library root, except the directories named in
  ``EXCLUDED_DIRS`` (the test suites, installed third-party packages and byte-code caches).
* Order: files sorted by their path relative to the root (``/``-separated), so the corpus is the
  same on every machine with the same Python version. Files are joined by one blank line.
* Held-out split BY FILE: files are ranked by ``crc32`` of their relative path and taken into the
  held-out split in that order until it holds ``holdout_fraction`` of the bytes; the rest is train.
  No file is in both, so the held-out loss measures text the model never saw, not a shifted window
  of a file it trained on. The assignment of a file depends only on its path and on the sizes of
  the files before it in the crc order.
* Provenance: ``info`` holds the Python version, the root, the file and byte counts of each split
  and a SHA-256 of each split's bytes, so two records can tell whether they trained on the same text.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import sysconfig
import zlib
from pathlib import Path

__all__ = ["EXCLUDED_DIRS", "stdlib_corpus", "stdlib_files"]

EXCLUDED_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"})
SEPARATOR = b"\n\n"


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path | None = None) -> list[str]:
    """Relative paths (``/``-separated, sorted) of the ``.py`` files of the standard library."""
    root = Path(root or stdlib_root())
    found = []
    for directory, subdirs, names in os.walk(root):
        subdirs[:] = [d for d in subdirs if d not in EXCLUDED_DIRS]
        rel = Path(directory).relative_to(root)
        found.extend((rel / name).as_posix() for name in names if name.endswith(".py"))
    return sorted(found)


def _split_by_file(files: list[str], sizes: dict[str, int], holdout_fraction: float) -> tuple[list, list]:
    """(train files, held-out files), each in path order; held-out holds about the fraction of bytes."""
    total = sum(sizes.values())
    heldout, held_bytes = set(), 0
    for name in sorted(files, key=lambda f: (zlib.crc32(f.encode()), f)):
        if held_bytes >= holdout_fraction * total:
            break
        heldout.add(name)
        held_bytes += sizes[name]
    return [f for f in files if f not in heldout], [f for f in files if f in heldout]


@functools.lru_cache(maxsize=4)
def stdlib_corpus(holdout_fraction: float = 0.1, root: str | None = None) -> tuple[bytes, bytes, dict]:
    """(train bytes, held-out bytes, info) of the standard-library corpus (see module docstring).

    Cached in memory per (fraction, root). ``root`` defaults to the running interpreter's stdlib."""
    if not 0.0 < holdout_fraction < 0.5:
        raise ValueError(f"holdout_fraction={holdout_fraction!r} is invalid: expected a fraction in (0, 0.5)")
    base = Path(root) if root else stdlib_root()
    files = stdlib_files(base)
    if not files:
        raise FileNotFoundError(f"no .py files below {str(base)!r}: expected a Python standard library")
    content = {name: (base / name).read_bytes() for name in files}
    train_files, heldout_files = _split_by_file(files, {n: len(c) for n, c in content.items()}, holdout_fraction)
    train = SEPARATOR.join(content[n] for n in train_files)
    heldout = SEPARATOR.join(content[n] for n in heldout_files)
    info = {
        "kind": "stdlib",
        "description": "source files (.py) of the Python standard library, read as bytes",
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "root": str(base),
        "excluded_dirs": sorted(EXCLUDED_DIRS),
        "files": len(files), "train_files": len(train_files), "heldout_files": len(heldout_files),
        "bytes": len(train) + len(heldout), "train_bytes": len(train), "heldout_bytes": len(heldout),
        "train_sha256": hashlib.sha256(train).hexdigest(), "heldout_sha256": hashlib.sha256(heldout).hexdigest(),
        "split": "by file (crc32 of the relative path), joined in path order",
    }
    return train, heldout, info
