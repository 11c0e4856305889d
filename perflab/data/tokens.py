"""The token dataset of the ``gpt-tiny`` workload: bytes of English text, built locally.

No download: the text is perflab's own documentation, the docstrings of every module,
class and function in the installed package's source files, read with :mod:`ast` (no
module is imported), in file order (:func:`corpus`), so a wheel install has it too. It changes only when the docstrings change; ``fingerprint``
names the version. Tokens are bytes (UTF-8), vocabulary 256, as in byte-level language
models (e.g. ByT5, Xue et al. 2022); no tokenizer library is needed.

A sample is a window of ``seq_len + 1`` bytes: the input is its first ``seq_len``, the
target the last ``seq_len`` (next-token prediction). Windows do not overlap; the first
90 % of the bytes are the ``train`` split, the rest ``val``.
"""
from __future__ import annotations

import ast
import functools
import hashlib
from pathlib import Path

import torch
from torch.utils.data import Dataset

__all__ = ["corpus", "fingerprint", "TokenDataset", "VOCAB_SIZE", "TRAIN_FRACTION"]

#: Byte-level vocabulary.
VOCAB_SIZE = 256
#: Share of the corpus in the ``train`` split (the rest is ``val``).
TRAIN_FRACTION = 0.9


@functools.lru_cache(maxsize=1)
def corpus() -> bytes:
    """perflab's docstrings (``perflab/**/*.py`` in sorted path order; in each, the
    module's, then its classes' and functions' breadth-first), each once, joined by blank
    lines, as UTF-8 bytes (about 0.3 MB). Cached per process."""
    root = Path(__file__).resolve().parents[1]              # the perflab package
    parts = []
    for path in sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).as_posix()):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):          # the module first, then breadth-first
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                 ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    parts.append(doc)
    return "\n\n".join(dict.fromkeys(parts)).encode("utf-8")


def fingerprint() -> str:
    """SHA-256 (first 16 hex digits) of :func:`corpus`: which text a run trained on."""
    return hashlib.sha256(corpus()).hexdigest()[:16]


class TokenDataset(Dataset):
    """Non-overlapping windows of :func:`corpus`.

    Item ``i``: ``(x, y)``, both int64 ``(seq_len,)``: bytes ``[i*seq_len, (i+1)*seq_len)``
    of the split and the same shifted by one (the next byte of each position).

    Args:
        seq_len: tokens per sample (>= 2).
        split: "train" (the first :data:`TRAIN_FRACTION` of the bytes) or "val".

    Raises:
        ValueError: ``seq_len`` < 2, an unknown split, or a split with no full window.
    """

    def __init__(self, seq_len: int, split: str = "train"):
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 2:
            raise ValueError(f"seq_len must be an int >= 2 tokens, got {seq_len!r}")
        if split not in ("train", "val"):
            raise ValueError(f"split must be 'train' or 'val', got {split!r}")
        data = corpus()
        cut = int(len(data) * TRAIN_FRACTION)
        part = data[:cut] if split == "train" else data[cut:]
        self.tokens = torch.frombuffer(bytearray(part), dtype=torch.uint8).to(torch.int64)
        self.seq_len, self.split = seq_len, split
        self.classes = list(range(VOCAB_SIZE))   # the vocabulary (build_training reads it)
        if len(self) < 1:
            raise ValueError(f"the {split} split has {len(part)} bytes, fewer than "
                             f"seq_len + 1 = {seq_len + 1}; use a shorter seq_len")

    def __len__(self) -> int:
        return (len(self.tokens) - 1) // self.seq_len

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not -len(self) <= i < len(self):
            raise IndexError(f"index {i} out of range for {len(self)} windows")
        i %= len(self)
        w = self.tokens[i * self.seq_len: (i + 1) * self.seq_len + 1]
        return w[:-1], w[1:]
