"""The simulator counts prompts in the served model's own tokens when it carries a byte-level BPE tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

from clusterctl.lab.vllm_sim import bpe

#: A byte-level BPE in the shape ``tokenizers`` writes (GPT-2's byte map: "Ġ" is the space).
TOKENIZER = {
    "normalizer": None,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
    "model": {
        "type": "BPE",
        "vocab": {
            "Ġ": 0,
            "t": 1,
            "h": 2,
            "e": 3,
            "Ġt": 4,
            "he": 5,
            "Ġthe": 6,
            "c": 7,
            "a": 8,
            "1": 9,
            "2": 10,
            "Ã": 11,
            "©": 12,
        },
        "merges": [["Ġ", "t"], ["h", "e"], ["Ġt", "he"]],
    },
}


def _write(tmp_path: Path, doc: dict) -> Path:
    (tmp_path / "tokenizer.json").write_text(json.dumps(doc))
    return tmp_path


def test_merges_apply_by_rank_over_gpt2_pieces(tmp_path: Path) -> None:
    enc = bpe.load(_write(tmp_path, TOKENIZER))
    assert enc is not None
    assert enc(" the cat") == ["Ġthe", "Ġ", "c", "a", "t"]
    assert enc("the12") == ["t", "he", "1", "2"]  # letters and numbers are separate pieces
    assert enc("é") == ["Ã", "©"]  # UTF-8 bytes through the byte map


def test_merges_written_as_strings_load_too(tmp_path: Path) -> None:
    doc = json.loads(json.dumps(TOKENIZER))
    doc["model"]["merges"] = ["Ġ t", "h e", "Ġt he"]
    enc = bpe.load(_write(tmp_path, doc))
    assert enc is not None and enc(" the") == ["Ġthe"]


def test_anything_else_keeps_the_simulator_words(tmp_path: Path) -> None:
    assert bpe.load(tmp_path) is None  # no tokenizer.json (the synthetic models)
    doc = json.loads(json.dumps(TOKENIZER))
    doc["model"]["type"] = "WordPiece"
    assert bpe.load(_write(tmp_path, doc)) is None
    (tmp_path / "tokenizer.json").write_text("{not json")
    assert bpe.load(tmp_path) is None
