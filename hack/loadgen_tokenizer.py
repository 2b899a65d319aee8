"""Write a word-level Hugging Face tokenizer for aiperf: one token per whitespace-separated word.

    <aiperf venv>/bin/python hack/loadgen_tokenizer.py CORPUS.txt OUT_DIR

The vocabulary is every distinct word of CORPUS (aiperf's own prompt corpus), so the prompts
aiperf synthesizes from it decode to exactly as many words as tokens: the count the emulated
engines report back (docs/emulator.md). Runs with the load generator's virtualenv (it needs
`tokenizers`, which aiperf installs); hack/loadgen.sh calls it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers

UNKNOWN = "[UNK]"


def main(corpus: Path, out: Path) -> None:
    words = sorted(set(corpus.read_text().split()))
    vocab = {UNKNOWN: 0, **{w: i + 1 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=UNKNOWN))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": UNKNOWN, "model_max_length": 10**6}
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    print(f"[loadgen] word tokenizer ({len(vocab)} words) in {out}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(Path(sys.argv[1]), Path(sys.argv[2]))
