"""The README's promises: two commands first, and CI runs the second one."""

from conftest import ROOT


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = text.split("```bash\n", 1)[1].split("```", 1)[0]
    assert text.index("```bash") < text.index("\n## "), "the commands must come before any section"
    return block.strip().splitlines()


def test_readme_starts_with_the_two_commands_and_ci_runs_the_second():
    run_default, run_tests = readme_commands()
    assert "train.py configs/default.py" in run_default and "-m data.prepare shakespeare" in run_default
    assert "pytest" in run_tests
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert run_tests in ci_lines
