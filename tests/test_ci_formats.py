"""The CI report formats: SARIF 2.1.0 (validated against the OASIS schema), GitHub Actions
workflow commands, and the JSON list of findings the README documents."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from jsonschema import Draft7Validator

from speedfix.commands.scan import ScanResult
from speedfix.engine.findings import Applicability, Edit, Finding, Fix, Severity
from speedfix.engine.registry import all_rules
from speedfix.engine.results import FileError
from speedfix.output.github import render_github
from speedfix.output.sarif import render_sarif

# The OASIS schema, vendored unmodified (see data/sarif-schema-2.1.0.NOTICE.md).
SARIF_SCHEMA = Path(__file__).resolve().parent / "data" / "sarif-schema-2.1.0.json"

SLOW = textwrap.dedent(
    """\
    import torch
    from torch.utils.data import DataLoader

    device = torch.device("cuda")
    scaler = torch.cuda.amp.GradScaler()
    loader = DataLoader(
        dataset,
        batch_size=64,
        shuffle=True,
    )
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        loss = model(x, y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    """
)
BROKEN = "def train(:\n    pass\n"
BINARY = b"\x00\x01torch\x00"  # a file that cannot be read as source: an error, not a finding
JSON_KEYS = {"path", "line", "column", "end_line", "end_column", "code", "name", "severity", "impact", "message", "fix"}
JSON_OPTIONAL_KEYS = {"cell", "cell_line", "no_fix_reason", "impact_reason", "impact_measured"}


@pytest.fixture(scope="module")
def sarif_validator() -> Draft7Validator:
    assert SARIF_SCHEMA.is_file(), f"the SARIF schema is expected at {SARIF_SCHEMA}"
    schema = json.loads(SARIF_SCHEMA.read_text(encoding="utf-8"))
    Draft7Validator.check_schema(schema)
    return Draft7Validator(schema, format_checker=Draft7Validator.FORMAT_CHECKER)


def _validate(validator: Draft7Validator, document: dict) -> None:
    errors = sorted(validator.iter_errors(document), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors)


def _scan(run_cli, tmp_path: Path, fmt: str, *files: str):
    return run_cli("scan", "--isolated", "--format", fmt, *files, cwd=tmp_path)


# ---------------------------------------------------------------------------------- SARIF
def test_sarif_validates_with_rules_results_locations_and_fixes(run_cli, write, tmp_path, sarif_validator):
    write("train.py", SLOW)
    result = _scan(run_cli, tmp_path, "sarif", "train.py")
    assert result.exit_code == 1
    document = json.loads(result.stdout)
    _validate(sarif_validator, document)

    assert document["version"] == "2.1.0"
    (run,) = document["runs"]
    driver = run["tool"]["driver"]
    assert driver["name"] == "speedfix" and driver["version"]
    rules = driver["rules"]
    assert [r["id"] for r in rules] == [rule.code for rule in all_rules()]
    for entry, rule in zip(rules, all_rules()):
        assert entry["name"] == rule.name
        assert entry["shortDescription"]["text"] == rule.summary
        assert entry["help"]["text"].strip() and "## " in entry["help"]["markdown"]
        assert entry["helpUri"].startswith("https://")

    results = run["results"]
    codes = {r["ruleId"] for r in results}
    assert {"SF102", "SF104", "SF203"} <= codes
    for r in results:
        assert rules[r["ruleIndex"]]["id"] == r["ruleId"]
        assert r["message"]["text"]
        (location,) = r["locations"]
        physical = location["physicalLocation"]
        assert physical["artifactLocation"] == {"uri": "train.py", "uriBaseId": "%SRCROOT%"}
        region = physical["region"]
        assert region["startLine"] >= 1 and region["startColumn"] >= 1
        assert (region["endLine"], region["endColumn"]) >= (region["startLine"], region["startColumn"])

    amp = next(r for r in results if r["ruleId"] == "SF203")
    assert amp["locations"][0]["physicalLocation"]["region"] == {"startLine": 5, "startColumn": 10, "endLine": 5, "endColumn": 35}
    (fix,) = amp["fixes"]
    (change,) = fix["artifactChanges"]
    assert change["artifactLocation"]["uri"] == "train.py"
    texts = [rep["insertedContent"]["text"] for rep in change["replacements"]]
    assert any('torch.amp.GradScaler("cuda")' in text for text in texts)
    assert "safe" in fix["description"]["text"]
    # A multi-line finding keeps its whole span.
    pin = next(r for r in results if r["ruleId"] == "SF102")
    assert pin["locations"][0]["physicalLocation"]["region"]["startLine"] == 6
    assert pin["locations"][0]["physicalLocation"]["region"]["endLine"] == 10

    (invocation,) = run["invocations"]
    assert invocation["executionSuccessful"] is True
    assert invocation["toolExecutionNotifications"] == []


def test_sarif_levels_follow_severities(sarif_validator):
    findings = [
        Finding(code=code, name=name, message="m", severity=severity, node=None, path="a.py", line=1, column=1, end_line=1, end_column=2)
        for code, name, severity in [
            ("SF101", "dataloader-no-workers", Severity.ERROR),
            ("SF102", "dataloader-no-pin-memory", Severity.WARNING),
            ("SF104", "blocking-transfer", Severity.INFO),
        ]
    ]
    document = json.loads(render_sarif(ScanResult(findings=findings, files=1)))
    _validate(sarif_validator, document)
    assert [r["level"] for r in document["runs"][0]["results"]] == ["error", "warning", "note"]
    expected = {"error": "error", "warning": "warning", "info": "note"}
    for entry, rule in zip(document["runs"][0]["tool"]["driver"]["rules"], all_rules()):
        assert entry["defaultConfiguration"]["level"] == expected[rule.severity.value]


def test_sarif_reports_a_syntax_error_as_a_result(run_cli, write, tmp_path, sarif_validator):
    write("train.py", SLOW)
    write("broken.py", BROKEN)
    report = tmp_path / "speedfix.sarif"
    result = run_cli("scan", "--isolated", "--format", "sarif", "--output", str(report), "train.py", "broken.py", cwd=tmp_path)
    assert result.exit_code == 1 and result.stderr == ""
    document = json.loads(report.read_text(encoding="utf-8"))
    _validate(sarif_validator, document)
    (run,) = document["runs"]
    rules = run["tool"]["driver"]["rules"]
    (syntax,) = [r for r in run["results"] if r["ruleId"] == "SF000"]
    assert rules[syntax["ruleIndex"]]["name"] == "invalid-syntax"
    assert syntax["level"] == "error" and syntax["message"]["text"] == "SyntaxError: invalid syntax"
    physical = syntax["locations"][0]["physicalLocation"]
    assert physical["artifactLocation"]["uri"] == "broken.py"
    assert physical["region"] == {"startLine": 1, "startColumn": 11, "endLine": 1, "endColumn": 12}
    assert {r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in run["results"]} == {"broken.py", "train.py"}
    (invocation,) = run["invocations"]
    assert invocation["executionSuccessful"] is True and invocation["toolExecutionNotifications"] == []


def test_sarif_reports_unreadable_files_as_notifications(run_cli, write, tmp_path, sarif_validator):
    write("train.py", SLOW)
    (tmp_path / "blob.py").write_bytes(BINARY)
    result = _scan(run_cli, tmp_path, "sarif", "train.py", "blob.py")
    assert result.exit_code == 2
    document = json.loads(result.stdout)
    _validate(sarif_validator, document)
    (run,) = document["runs"]
    assert run["results"], "the other files are still scanned"
    (invocation,) = run["invocations"]
    assert invocation["executionSuccessful"] is False
    (note,) = invocation["toolExecutionNotifications"]
    assert note["level"] == "error" and note["descriptor"] == {"id": "file-error"}
    assert note["message"]["text"] == "blob.py: error: binary file (contains NUL bytes)"
    assert note["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "blob.py"


def test_sarif_uris_are_encoded_and_absolute_paths_are_file_uris(sarif_validator):
    def finding(path: str) -> Finding:
        return Finding(code="SF102", name="dataloader-no-pin-memory", message="m", severity=Severity.WARNING,
                       node=None, path=path, line=2, column=3, end_line=2, end_column=9)

    document = json.loads(render_sarif(ScanResult(findings=[finding("my dir/50% a:b.py"), finding("/abs/train.py")])))
    _validate(sarif_validator, document)
    artifacts = [r["locations"][0]["physicalLocation"]["artifactLocation"] for r in document["runs"][0]["results"]]
    assert artifacts == [
        {"uri": "my%20dir/50%25%20a%3Ab.py", "uriBaseId": "%SRCROOT%"},
        {"uri": "file:///abs/train.py"},
    ]


def test_sarif_notebook_findings_name_the_cell(sarif_validator):
    fix = Fix("Pin the DataLoader's memory", Applicability.SAFE, ())
    nb = Finding(code="SF102", name="dataloader-no-pin-memory", message="no pin", severity=Severity.WARNING, node=None,
                 path="nb.ipynb", line=14, column=10, end_line=14, end_column=30, cell=3, cell_line=2, fix=fix,
                 edits=[Edit(line=14, column=29, end_line=14, end_column=29, content=", pin_memory=True")])
    document = json.loads(render_sarif(ScanResult(findings=[nb], files=1)))
    _validate(sarif_validator, document)
    (result,) = document["runs"][0]["results"]
    assert "cell 3, line 2" in result["message"]["text"]
    assert result["properties"]["notebookCell"] == 3
    assert "region" not in result["locations"][0]["physicalLocation"]  # cell positions are not .ipynb lines
    assert "fixes" not in result


# --------------------------------------------------------------------------------- GitHub
def test_github_annotations(run_cli, write, tmp_path):
    write("train.py", SLOW)
    result = _scan(run_cli, tmp_path, "github", "train.py")
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert lines and all(line.startswith("::warning file=train.py,") for line in lines)
    assert (
        "::warning file=train.py,line=5,col=10,endLine=5,endColumn=35,title=SF203 deprecated-amp-api (low impact)::"
        "SF203 [*] `torch.cuda.amp.GradScaler` is deprecated"
    ) in result.stdout
    # Columns only for one-line spans (GitHub rejects them otherwise).
    (pin,) = [line for line in lines if "title=SF102" in line]
    assert pin.startswith("::warning file=train.py,line=6,endLine=10,title=SF102 dataloader-no-pin-memory (medium impact)::SF102 [*] ")
    assert len([line for line in lines if "title=SF104" in line]) == 1  # the batch's two copies: one finding


def test_github_syntax_errors_are_annotations_and_unreadable_files_errors(run_cli, write, tmp_path):
    write("broken.py", BROKEN)
    write("ok.py", "import os\n")
    result = _scan(run_cli, tmp_path, "github", "broken.py", "ok.py")
    assert result.exit_code == 1
    assert result.stdout == (
        "::error file=broken.py,line=1,col=11,endLine=1,endColumn=12,title=SF000 invalid-syntax (high impact)::"
        "SF000 SyntaxError: invalid syntax\n"
    )
    (tmp_path / "blob.py").write_bytes(BINARY)
    result = _scan(run_cli, tmp_path, "github", "blob.py", "ok.py")
    assert result.exit_code == 2
    assert result.stdout == "::error file=blob.py,title=speedfix::blob.py: error: binary file (contains NUL bytes)\n"


def test_github_escaping():
    finding = Finding(code="SF102", name="dataloader-no-pin-memory", message="100% slower,\r\nreally: yes",
                      severity=Severity.INFO, node=None, path="dir,x/a:b%.py", line=3, column=1, end_line=3, end_column=4)
    error = FileError("bad,1.py", "unexpected\nEOF", line=2, column=5, kind="syntax")
    output = render_github(ScanResult(findings=[finding], errors=[error], files=2))
    assert output.splitlines() == [
        "::notice file=dir%2Cx/a%3Ab%25.py,line=3,col=1,endLine=3,endColumn=4,title=SF102 dataloader-no-pin-memory (medium impact)::"
        "SF102 100%25 slower,%0D%0Areally: yes",
        "::error file=bad%2C1.py,line=2,col=5,title=speedfix::bad,1.py:2:5: syntax error: unexpected%0AEOF",
    ]


def test_github_notebook_findings_are_file_annotations_naming_the_cell():
    nb = Finding(code="SF102", name="dataloader-no-pin-memory", message="no pin", severity=Severity.WARNING,
                 node=None, path="nb.ipynb", line=14, column=10, end_line=14, end_column=30, cell=3, cell_line=2)
    assert render_github(ScanResult(findings=[nb], files=1)) == (
        "::warning file=nb.ipynb,title=SF102 dataloader-no-pin-memory (medium impact)::SF102 no pin (cell 3, line 2, column 10)\n"
    )


def test_github_clean_scan_prints_nothing(run_cli, write, tmp_path):
    write("ok.py", "import os\nprint(os.getcwd())\n")
    result = _scan(run_cli, tmp_path, "github", "ok.py")
    assert result.exit_code == 0
    assert result.stdout == ""


# ----------------------------------------------------------------------------------- JSON
def test_json_keeps_the_documented_schema(run_cli, write, tmp_path):
    write("train.py", SLOW)
    result = _scan(run_cli, tmp_path, "json", "train.py")
    assert result.exit_code == 1
    findings = json.loads(result.stdout)
    assert isinstance(findings, list) and findings
    for item in findings:
        assert JSON_KEYS <= item.keys() and not (item.keys() - JSON_KEYS - JSON_OPTIONAL_KEYS)
        assert item["path"] == "train.py"
        assert all(isinstance(item[k], int) and item[k] >= 1 for k in ("line", "column", "end_line", "end_column"))
        assert item["code"].startswith("SF") and item["name"] and item["message"]
        assert item["severity"] in {"error", "warning", "info"}
        fix = item["fix"]
        if fix is not None:
            assert set(fix) == {"applicability", "title", "edits"}
            assert fix["applicability"] in {"safe", "unsafe"} and fix["title"]
            for edit in fix["edits"]:
                assert set(edit) == {"content", "line", "column", "end_line", "end_column"}
    amp = next(item for item in findings if item["code"] == "SF203")
    assert (amp["line"], amp["column"], amp["end_line"], amp["end_column"]) == (5, 10, 5, 35)
    assert amp["fix"]["applicability"] == "safe"
    assert any('torch.amp.GradScaler("cuda")' in edit["content"] for edit in amp["fix"]["edits"])


def test_json_reports_a_syntax_error_as_a_finding(run_cli, write, tmp_path):
    write("train.py", SLOW)
    write("legacy.py", 'import torch\nprint "loss", loss\n')  # Python 2
    result = _scan(run_cli, tmp_path, "json", "legacy.py", "train.py")
    assert result.exit_code == 1 and result.stderr == ""
    findings = json.loads(result.stdout)
    assert {item["path"] for item in findings} == {"legacy.py", "train.py"}
    (syntax,) = [item for item in findings if item["path"] == "legacy.py"]
    assert syntax == {
        "path": "legacy.py", "line": 2, "column": 1, "end_line": 2, "end_column": 2, "code": "SF000",
        "name": "invalid-syntax", "severity": "error", "impact": "high",
        "message": "SyntaxError: Missing parentheses in call to 'print'. Did you mean print(...)?",
        "fix": None, "no_fix_reason": "a file that does not parse is never rewritten",
    }


def test_control_characters_in_file_names_are_escaped_in_every_format(run_cli, tmp_path, good_script):
    # Printed raw before: an ESC sequence repainted the terminal, a newline forged a report line.
    name = "e\x1b[2Jvil\nfake.py:1:1: SF000 x.py"
    (tmp_path / name).write_text(good_script)
    os.mkfifo(tmp_path / "pipe\x1b[31m.py")  # reported on standard error
    shown = "e\\x1b[2Jvil\\nfake.py:1:1: SF000 x.py"
    github = "e\\x1b[2Jvil%0Afake.py%3A1%3A1%3A SF000 x.py"  # a newline is %0A there, as GitHub reads it
    for fmt in ("text", "github", "markdown"):
        result = run_cli("scan", ".", "--output-format", fmt, cwd=tmp_path)
        assert "\x1b" not in result.stdout + result.stderr, (fmt, result)
        assert (github if fmt == "github" else shown) in result.stdout, (fmt, result)
        assert "pipe\\x1b[31m.py" in result.stderr
        assert not any(line.startswith("fake.py") for line in result.stdout.splitlines())
    result = run_cli("scan", ".", "--output-format", "json", cwd=tmp_path)
    assert json.loads(result.stdout)[0]["path"] == name  # machine formats keep the real name, escaped as JSON
    result = run_cli("apply", "--diff", name, cwd=tmp_path)
    assert "\x1b" not in result.stdout + result.stderr and f"--- a/{shown}" in result.stdout


def test_file_names_the_terminal_cannot_encode_are_escaped(tmp_path, good_script):
    # A UnicodeEncodeError before, with PYTHONIOENCODING=ascii (or LC_ALL=C on older Pythons).
    (tmp_path / "entraînement.py").write_text(good_script)
    env = {**os.environ, "PYTHONIOENCODING": "ascii", "SPEEDFIX_NO_CACHE": "1"}
    for fmt in ("text", "json", "sarif", "markdown", "github"):
        result = subprocess.run([sys.executable, "-m", "speedfix", "scan", "--output-format", fmt, "."],
                                cwd=tmp_path, env=env, capture_output=True, timeout=120)
        assert result.returncode == 1 and result.stdout.isascii(), (fmt, result.stderr)
        if fmt == "json":
            assert json.loads(result.stdout)[0]["path"] == "entraînement.py"  # \u00ee: still valid JSON
        elif fmt == "sarif":
            assert "entra%C3%AEnement.py" in json.dumps(json.loads(result.stdout))  # a URI
        else:
            assert b"entra\\xeenement.py" in result.stdout
    result = subprocess.run([sys.executable, "-m", "speedfix", "apply", "--diff", "."],
                            cwd=tmp_path, env=env, capture_output=True, timeout=120)
    assert result.returncode == 1 and b"--- a/entra\\xeenement.py" in result.stdout, result.stderr
