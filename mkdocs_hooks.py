"""MkDocs hook: render ```python notest fences (the tested-examples marker, see docs/development.md) as Python.

Python-Markdown's fences accept a language and known options only, so the marker would otherwise turn
the fence into a paragraph. pytest-markdown-docs reads the marker from the Markdown source, unchanged.
"""

from __future__ import annotations

import re
from typing import Any

_MARKED_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<lang>python|py|python3)[ \t]+notest[ \t]*$",
                           re.MULTILINE)


def on_page_markdown(markdown: str, **_: Any) -> str:
    return _MARKED_FENCE.sub(r"\g<indent>\g<fence>\g<lang>", markdown)
