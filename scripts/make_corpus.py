"""Rebuild kvbench/data/common-licenses.txt.gz, the real-text corpus (kvbench.models.corpus), from Debian's
licence texts.

Every Debian system carries them under /usr/share/common-licenses (package base-files); each licence
allows verbatim copies. The file is rebuilt byte for byte (gzip without a timestamp) and its text must
hash to kvbench.models.corpus.SHA256: a base-files release that changed a text is reported, not shipped silently.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import sys
from pathlib import Path

from kvbench.models.corpus import CORPUS_PATH, SHA256, TEXTS

SOURCE = Path("/usr/share/common-licenses")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--source", type=Path, default=SOURCE)
    parser.add_argument("--output", type=Path, default=CORPUS_PATH)
    args = parser.parse_args()
    text = "".join(f"{name}\n\n{(args.source / name).read_text(encoding='utf-8').strip()}\n\n\n" for name in TEXTS)
    digest = hashlib.sha256(text.encode()).hexdigest()
    if digest != SHA256:
        print(f"the texts under {args.source} hash to {digest}, expected {SHA256}", file=sys.stderr)
        return 1
    args.output.write_bytes(gzip.compress(text.encode(), mtime=0))
    print(f"{args.output}: {len(text)} characters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
