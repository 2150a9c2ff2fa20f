"""ruff's habits on `speedfix scan`: --fix, --unsafe-fixes, --diff, --show-fixes, --statistics,
--exit-zero, --output-format (with --format as its alias); and the text summary when piped."""

from __future__ import annotations

import json

from speedfix.engine.registry import rule_by_code

SAFE_FIXED = "Fixed 3 findings in 1 file (SF102 x1, SF104 x1, SF203 x1)."


def _lines(stdout: str) -> list[str]:
    return stdout.splitlines()


def test_output_format_its_alias_and_the_config_key(run_cli, write, train_script, tmp_path):
    write("train.py", train_script)
    long = run_cli("scan", "train.py", "--output-format", "json", cwd=tmp_path)
    short = run_cli("scan", "train.py", "--format", "json", cwd=tmp_path)
    assert long.exit_code == short.exit_code == 1
    assert long.stdout == short.stdout and json.loads(long.stdout)
    write("pyproject.toml", '[tool.speedfix]\noutput-format = "json"\n')
    assert run_cli("scan", "train.py", cwd=tmp_path).stdout == long.stdout
    text = run_cli("scan", "train.py", "--output-format", "text", "--no-summary", cwd=tmp_path)
    assert text.stdout.startswith("train.py:7:13: SF501 [*] ")  # the command line wins
    write("pyproject.toml", '[tool.speedfix]\noutput-format = "xml"\n')
    bad = run_cli("scan", "train.py", cwd=tmp_path)
    assert bad.exit_code == 2 and "`output-format` must be one of text, github, json, markdown, sarif" in bad.stderr


def test_exit_zero_keeps_exit_2_for_errors(run_cli, write, train_script, tmp_path):
    write("train.py", train_script)
    result = run_cli("scan", "train.py", "--exit-zero", "--no-summary", cwd=tmp_path)
    assert result.exit_code == 0 and len(_lines(result.stdout)) == 6
    (tmp_path / "blob.py").write_bytes(b"\x00\x01")
    assert run_cli("scan", "train.py", "blob.py", "--exit-zero", cwd=tmp_path).exit_code == 2


def test_statistics_count_findings_per_rule(run_cli, write, train_script, tmp_path):
    write("train.py", train_script)
    write("other.py", train_script)
    write("broken.py", "print 'x'\n")
    result = run_cli("scan", ".", "--statistics", cwd=tmp_path)
    assert result.exit_code == 1
    assert _lines(result.stdout) == [
        "2  SF101  [*] dataloader-no-workers",
        "2  SF102  [*] dataloader-no-pin-memory",
        "2  SF104  [*] blocking-transfer",
        "2  SF203  [*] deprecated-amp-api",
        "2  SF301  [*] sync-in-loop",
        "2  SF501  [*] model-not-compiled",
        "1  SF000  [ ] invalid-syntax",
    ]
    data = json.loads(run_cli("scan", ".", "--statistics", "--output-format", "json", cwd=tmp_path).stdout)
    assert data[2:4] == [
        {"code": "SF104", "name": "blocking-transfer", "count": 2, "fixable": True},
        {"code": "SF203", "name": "deprecated-amp-api", "count": 2, "fixable": True},
    ]
    assert data[-1] == {"code": "SF000", "name": "invalid-syntax", "count": 1, "fixable": False}
    refused = run_cli("scan", ".", "--statistics", "--output-format", "sarif", cwd=tmp_path)
    assert refused.exit_code == 2 and "--output-format must be one of text, json, not 'sarif'" in refused.stderr


def test_fix_writes_what_apply_writes_and_reports_the_rest(run_cli, write, train_script, tmp_path):
    scanned = write("a/train.py", train_script)
    applied = write("b/train.py", train_script)
    result = run_cli("scan", "--fix", "a", cwd=tmp_path)
    run_cli("apply", "b", cwd=tmp_path)
    assert scanned.read_bytes() == applied.read_bytes() != train_script.encode()
    assert result.exit_code == 1  # unsafe fixes and findings without one are left
    assert [line.split(": ", 2)[1].split()[0] for line in _lines(result.stdout)[:3]] == ["SF501", "SF101", "SF301"]
    assert SAFE_FIXED in result.stdout and "Found 3 findings in 1 file" in result.stdout
    # The positions are those of the fixed file on disk.
    again = run_cli("scan", "a", "--no-summary", cwd=tmp_path)
    assert _lines(again.stdout) == _lines(result.stdout)[:3]
    unsafe = run_cli("scan", "--fix", "--unsafe-fixes", "a", cwd=tmp_path)
    assert "Fixed 3 findings in 1 file (SF101 x1, SF301 x1, SF501 x1)." in unsafe.stdout
    assert unsafe.exit_code == run_cli("scan", "a", cwd=tmp_path).exit_code


def test_diff_prints_the_patch_writes_nothing_and_exits_1(run_cli, write, train_script, tmp_path):
    path = write("train.py", train_script)
    result = run_cli("scan", "--diff", "train.py", cwd=tmp_path)
    assert result.exit_code == 1 and path.read_text() == train_script
    assert result.stdout == run_cli("apply", "--diff", "train.py", cwd=tmp_path).stdout
    assert "+    loader = DataLoader(train_set, batch_size=32, shuffle=True, pin_memory=True)" in result.stdout
    assert "Would fix 3 findings in 1 file" in result.stderr
    assert run_cli("scan", "--diff", "--fix", "train.py", cwd=tmp_path).stdout == result.stdout  # --diff wins
    assert run_cli("scan", "--diff", "--exit-zero", "train.py", cwd=tmp_path).exit_code == 0
    clean = write("clean.py", "import torch\nx = torch.zeros(3)\n")
    nothing = run_cli("scan", "--diff", clean)
    assert nothing.exit_code == 0 and nothing.stdout == ""


def test_show_fixes_without_fix_shows_each_fix_under_its_finding(run_cli, write, train_script, tmp_path):
    write("train.py", train_script)
    lines = _lines(run_cli("scan", "train.py", "--show-fixes", "--no-summary", cwd=tmp_path).stdout)
    pin = lines.index("train.py:10:14: SF102 [*] `DataLoader` without `pin_memory=True`: batches are copied to the GPU from pageable memory"
                      " (impact: medium)")
    title = rule_by_code("SF102").fix_title
    assert lines[pin + 1] == f"    safe fix: {title}"
    assert "    +    loader = DataLoader(train_set, batch_size=32, shuffle=True, pin_memory=True)" in lines[pin + 2:pin + 12]
    assert all(line == line.rstrip() for line in lines)


def test_show_fixes_with_fix_lists_the_fixes_per_file(run_cli, write, train_script, tmp_path):
    write("train.py", train_script)
    result = run_cli("scan", "--fix", "--show-fixes", "train.py", cwd=tmp_path)
    assert "Fixed 3 findings in 1 file:\n  train.py\n    1 x SF102 dataloader-no-pin-memory\n" \
           "    1 x SF104 blocking-transfer\n    1 x SF203 deprecated-amp-api\n" in result.stdout


def test_help_shows_every_ruff_style_flag(run_cli):
    text = run_cli("scan", "--help").stdout
    for flag in ("--fix", "--unsafe-fixes", "--diff", "--show-fixes", "--statistics", "--exit-zero", "--output-format", "--format"):
        assert flag in text, flag
    for name in ("text", "json", "markdown", "sarif", "github"):
        assert name in text


def test_summary_table_is_neither_wrapped_nor_padded_when_piped(run_cli, write, train_script, tmp_path):
    write("train.py", train_script)
    lines = _lines(run_cli("scan", "train.py", cwd=tmp_path).stdout)
    assert all(line == line.rstrip() for line in lines)
    header = lines.index(next(line for line in lines if line.startswith("rule ")))
    rows = lines[header + 1:]
    # the highest impact first, then by code
    assert [row.split()[0] for row in rows] == ["SF101", "SF501", "SF102", "SF301", "SF104", "SF203"]
    for row in rows:
        rule = rule_by_code(row.split()[0])
        assert row.endswith(rule.effect)  # the whole effect on the rule's own line
    assert max(map(len, rows)) > 80


def test_markdown_leads_with_ranked_actions_and_folds_the_low_impact(run_cli, write, tmp_path):
    write("train.py", """\
        import torch
        from torch.cuda.amp import autocast

        device = torch.device("cuda")
        for x, y in loader:
            x = x.to(device)
            with autocast():
                loss = model(x, y)
            loss.backward()
            optimizer.step()
        """)
    write("old.py", 'print "hello"\n')
    report = run_cli("scan", ".", "--output-format", "markdown", "--select", "SF104,SF203", cwd=tmp_path).stdout
    headings = [line for line in report.splitlines() if line.startswith("## ")]
    assert headings == ["## Top actions", "## High impact", "## Medium impact", "## Low impact"]
    assert "**3 findings** in 2 files (1 high impact, 1 medium, 1 low)" in report
    sections = {part.split("\n", 1)[0]: part for part in report.split("\n## ")}
    actions = [line for line in sections["Top actions"].splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [row.split(" | ")[1] for row in actions] == ["high", "medium", "low"]  # ranked
    assert "Add `non_blocking=True` (SF104; safe fix) | `train.py:6` |" in actions[1]
    high, medium, low = sections["High impact"], sections["Medium impact"], sections["Low impact"]
    assert "### SF000 invalid-syntax: 1 finding" in high and "**What is wrong:**" in high  # a correctness bug
    assert "### SF104 blocking-transfer: 1 finding" in medium and "#### 1. `train.py:6:9`" in medium
    assert "**What is slow:**" in medium and "**Expected gain:**" in medium
    # low impact: one row each, folded
    assert low.index("<details>") < low.index("SF203 deprecated-amp-api") < low.index("</details>")
    assert "<summary>1 low-impact finding (SF203 x1)</summary>" in low
    assert "`torch.cuda.amp.autocast` is deprecated" in low and "```diff" not in low


def test_markdown_shows_at_most_ten_actions_ranked():
    from speedfix.commands.scan import ScanResult
    from speedfix.engine.findings import Finding, Impact, Severity
    from speedfix.engine.registry import all_rules
    from speedfix.output import ReportOptions, get_reporter

    rules = [rule for rule in all_rules() if rule.code != "SF000"][:14]
    findings = [Finding(rule.code, rule.name, "m", Severity.WARNING, None, path="a.py", line=index + 1,
                        impact=Impact.LOW if index < 7 else Impact.HIGH)
                for index, rule in enumerate(rules)]
    report = get_reporter("markdown").scan(ScanResult(findings=findings, files=1), ReportOptions())
    section = report.split("## Top actions", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert len(rows) == 10 and "The 10 of 14 actions that matter most" in section
    assert [row.split(" | ")[1] for row in rows] == ["high"] * 7 + ["low"] * 3
    # a correctness bug first, then by position
    correctness = [rule.code for rule in rules[7:] if rule.category.value == "correctness"]
    firsts = [row.split(" | ")[2].rsplit("(", 1)[1].split(";")[0] for row in rows[:7]]
    assert firsts[:len(correctness)] == correctness and len(correctness) >= 1


def test_rule_pages_and_lists_in_every_format_that_has_them(run_cli):
    page = json.loads(run_cli("rule", "SF102", "--output-format", "json").stdout)
    assert page["code"] == "SF102" and page["loss_check"] == "exact" and "Why is this bad?" in page["sections"]
    markdown = run_cli("rule", "SF102", "--output-format", "markdown").stdout
    assert markdown == run_cli("rule", "SF102").stdout  # piped text is the Markdown source
    assert markdown.startswith("# SF102 dataloader-no-pin-memory\n")
    refused = run_cli("rule", "SF102", "--output-format", "sarif")
    assert refused.exit_code == 2 and "must be one of text, json, markdown" in refused.stderr
    table = run_cli("rules").stdout.splitlines()
    assert table[0].split() == ["code", "name", "fix", "summary"] and all(line == line.rstrip() for line in table)
