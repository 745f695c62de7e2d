"""The package's docstrings say what a user needs and leave design rationale to the guides.

Measured as the lines that module, class and function docstrings span (by ``ast``) over all
the lines of ``skfedspd/**/*.py``: at most 35 %, numpydoc sections (Parameters, Attributes,
Returns, short Examples) as in scikit-learn, with the design rationale in ``docs/``.
"""

import ast
from pathlib import Path

import skfedspd

MAX_DOCSTRING_SHARE = 0.35


def docstring_lines(source):
    """``(lines, docstring lines)`` of one module's source."""
    tree = ast.parse(source)
    spanned = 0
    for node in ast.walk(tree):
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and ast.get_docstring(node) and isinstance(node.body[0], ast.Expr)):
            spanned += node.body[0].end_lineno - node.body[0].lineno + 1
    return source.count("\n"), spanned


def test_docstring_lines_count_a_module_docstring_and_a_function_docstring():
    source = '"""Module."""\n\n\ndef f():\n    """One\n    two."""\n    return 1\n'
    assert docstring_lines(source) == (7, 3)


def test_docstrings_are_at_most_a_third_of_the_package():
    total = spanned = 0
    for path in Path(skfedspd.__file__).parent.rglob("*.py"):
        lines, doc = docstring_lines(path.read_text(encoding="utf-8"))
        total, spanned = total + lines, spanned + doc
    assert spanned / total <= MAX_DOCSTRING_SHARE, (
        f"docstrings span {spanned} of the package's {total} lines ({spanned / total:.1%}), more than "
        f"{MAX_DOCSTRING_SHARE:.0%}: keep the numpydoc sections short and move rationale to docs/")
