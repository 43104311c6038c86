"""Regenerate the options table of docs/configuration.md from celery_singleton_lock.options
(``make docs-gen``); tests/docs checks that the page matches."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from celery_singleton_lock.options import reference_markdown

PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
BEGIN, END = "<!-- BEGIN GENERATED OPTIONS -->", "<!-- END GENERATED OPTIONS -->"


def main() -> int:
    text = PAGE.read_text(encoding="utf-8")
    pattern = re.compile(re.escape(BEGIN) + r"\n.*?" + re.escape(END), re.S)
    if not pattern.search(text):
        print(f"{PAGE}: markers not found", file=sys.stderr)
        return 1
    PAGE.write_text(pattern.sub(f"{BEGIN}\n{reference_markdown()}{END}", text), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
