from __future__ import annotations

from speedfix.engine.findings import Category, Severity
from speedfix.engine.results import SYNTAX_ERROR_CODE, SYNTAX_ERROR_NAME
from speedfix.engine.rule import Invalid, Rule, Valid


class InvalidSyntax(Rule):
    """
    ## What it does
    Reports a file that Python cannot parse: a syntax error, an indentation error, or Python 2
    code (`print "done"`). The message, line and column are the interpreter's own. It is always
    on: `select`, `ignore` and `noqa` do not turn it off, as in ruff.

    ## Why is this bad?
    A file that does not parse does not run, and no other rule can look into it. Reporting it as
    a finding (rather than failing the scan) keeps every other file's findings and gives CI and
    editors one place to see it.

    ## Example
    ```python
    for x, y in loader:
        print "step done"
    ```

    ## Use instead
    ```python
    for x, y in loader:
        print("step done")
    ```

    ## Fix safety
    No automatic fix: a file that does not parse is never rewritten. `speedfix apply` lists the
    finding among those left unfixed and leaves the file exactly as it is.

    ## Impact
    High: a file that does not parse does not run. Nothing moves it.

    ## Measured effect
    None on speed: the file has to parse before anything else can be checked or measured.
    Source: https://docs.python.org/3/library/exceptions.html#SyntaxError
    """

    impact = "high"
    code = SYNTAX_ERROR_CODE
    name = SYNTAX_ERROR_NAME
    summary = "A file that Python cannot parse (syntax error, Python 2 code); always reported"
    severity = Severity.ERROR
    category = Category.CORRECTNESS
    effect = "None on speed: the file cannot run until it parses."

    VALID = [
        Valid(
            """
            import torch
            print("step done")
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            print "step done"
            """
        ),
        Invalid(
            """
            def train(:
                pass
            """
        ),
    ]

    @classmethod
    def may_apply(cls, data: bytes, *, cuda: bool = False, hot: bool = False, linked: bool = False) -> bool:
        return False  # nothing to visit: the engine reports it when the parse fails
