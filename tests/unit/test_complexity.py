"""The package stays readable: no function of cyclomatic complexity above 15, no module above 600 lines (measured
with radon, the dev extra)."""

from __future__ import annotations

from pathlib import Path

from radon.complexity import cc_visit

PACKAGE = Path(__file__).resolve().parents[2] / "skynet_dspy"
MAX_COMPLEXITY = 15
MAX_LINES = 600

def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_no_function_is_too_complex():
    found = {}
    for path in _sources():
        where = path.relative_to(PACKAGE).as_posix()
        for block in cc_visit(path.read_text()):
            for function in getattr(block, "methods", [block]):  # a class's methods, or a function
                if function.complexity > MAX_COMPLEXITY:
                    name = f"{where}:{function.classname + '.' if getattr(function, 'classname', None) else ''}"
                    found[name + function.name] = function.complexity
    assert not found, f"split these into named steps (cyclomatic complexity over {MAX_COMPLEXITY}): {found}"


def test_no_module_is_too_long():
    long = {
        path.relative_to(PACKAGE).as_posix(): lines
        for path in _sources()
        if (lines := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"split these modules (over {MAX_LINES} lines): {long}"
