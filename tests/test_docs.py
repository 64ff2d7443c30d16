"""The docs agree with what kvbench does: the generated blocks are what `make report` writes now, the README
stays short, what it and docs/cli.md promise about paths holds, and docs/architecture.md names every module
that exists and none that does not."""

import ast
import importlib.util
import re
import shlex
import shutil
from pathlib import Path

import pytest

from kvbench.cli import main

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_README_LINES = 300  # hand-written; the generated blocks are not counted
GENERATED = re.compile(r"<!-- kvbench (?P<name>[\w-]+): begin .*?<!-- kvbench (?P=name): end -->", re.S)
GENERATED_FILES = ("README.md", "docs/models.md", "docs/results.svg", "docs/real-model.md", "docs/eviction.md")
SCRIPTS = ("layout_targets", "real_model_docs", "eviction_docs")  # the scripts `make report` runs, by their module names
MAKE_VARIABLES = {"$(BIN)/kvbench": "kvbench", "$(BIN)/python": "python"}


def report_recipe() -> list[list[str]]:
    """The commands of the Makefile's `report` target, its variables filled in from the Makefile itself."""
    makefile = (ROOT / "Makefile").read_text()
    variables = {f"$({name})": value.split("#")[0].strip()
                 for name, value in re.findall(r"^(\w+) \?= (.*)$", makefile, re.M)}
    recipe = re.search(r"^report: .*\n((?:\t.*\n)+)", makefile, re.M).group(1)
    commands = []
    for line in recipe.splitlines():
        line = line.strip().split(" > ")[0]
        for name, value in {**MAKE_VARIABLES, **variables}.items():
            line = line.replace(name, value)
        commands.append(shlex.split(line))
    return commands


def run_report_recipe(into: Path, monkeypatch) -> None:
    """What `make report` does, with every file it writes redirected under `into` (copies of the committed
    ones, at the same relative paths, so that links and record paths read the same)."""
    for name in GENERATED_FILES:
        (into / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, into / name)
    monkeypatch.chdir(ROOT)  # the records are read from the repository, by the paths the Makefile gives
    scripts = {}
    for name in SCRIPTS:
        spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
        scripts[f"scripts/{name}.py"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(scripts[f"scripts/{name}.py"])
    for command in report_recipe():
        argv = [str(into / arg) if arg in GENERATED_FILES else arg for arg in command]
        if argv[0] == "kvbench":
            assert main(argv[1:]) == 0, command
        else:
            assert argv[0] == "python" and argv[1] in scripts, f"make report runs {command}: test it here"
            assert scripts[argv[1]].main(argv[2:]) == 0, command


def test_the_make_report_recipe_is_what_this_test_runs():
    assert report_recipe() == [
        ["kvbench", "report", "results/reference.json", "--format", "markdown", "--plot", "docs/results.svg",
         "--into", "README.md", "--force"],
        ["python", "scripts/layout_targets.py", "--into", "README.md"],
        ["kvbench", "report", "results/llama/llama-tiny.json", "--format", "markdown", "--into", "docs/models.md",
         "--force"],
        ["python", "scripts/real_model_docs.py", "results/real/quality-quantized.json", "results/real/quality-window.json",
         "--peers", "results/real/quality-hf-int4-g16.json:results/real/quality-quantized.json",
         "results/real/quality-hf-int4.json:results/real/quality-quantized.json", "--needle", "results/real/needle.json",
         "results/real/needle-evicting.json", "--into", "docs/real-model.md"],
        ["python", "scripts/eviction_docs.py", "--ratios", "results/eviction/smollm2-ratio-025.json",
         "results/eviction/smollm2-ratio-050.json", "results/eviction/smollm2-ratio-075.json", "--costs",
         "results/eviction/compression-cost.json", "--kvpress", "results/eviction/kvpress-peer.json", "--needle",
         "results/real/needle-evicting.json", "--into", "docs/eviction.md"],
    ]


GLYPH_ID = re.compile(rb"DejaVuSans(?:-[A-Za-z]+)?-[0-9a-f]+")


def comparable(name: str, content: bytes) -> bytes:
    """A generated file as the test compares it. An SVG names each glyph it embeds by the font's glyph index,
    and the DejaVu Sans that matplotlib finds may be its own or the system's, whose indices differ for the
    same outlines (seen when a font cache was rebuilt on a machine with fonts-dejavu installed): the glyphs
    are renumbered by first appearance, so every outline and every position is still compared."""
    if not name.endswith(".svg"):
        return content
    numbers: dict[bytes, bytes] = {}
    return GLYPH_ID.sub(lambda match: numbers.setdefault(match[0], b"glyph-%d" % len(numbers)), content)


def test_every_generated_block_is_what_make_report_writes_now(tmp_path, monkeypatch, capsys):
    run_report_recipe(tmp_path, monkeypatch)
    stale = [name for name in GENERATED_FILES
             if comparable(name, (tmp_path / name).read_bytes()) != comparable(name, (ROOT / name).read_bytes())]
    assert stale == [], f"{', '.join(stale)}: stale generated blocks; run `make report` and commit the result"


def hand_written(text: str) -> list[str]:
    return GENERATED.sub("", text).splitlines()


def test_the_readme_stays_short_for_users():
    text = README.read_text()
    assert {match["name"] for match in GENERATED.finditer(text)} == {"report", "layouts"}
    lines = hand_written(text)
    assert len(lines) <= MAX_README_LINES, (f"README.md has {len(lines)} hand-written lines, at most "
                                            f"{MAX_README_LINES}: move reference material to docs/")
    headings = [line for line in lines if line.startswith("## ")]
    for topic in ("Quick start", "Results", "Reading the results", "Limitations"):
        assert any(topic in heading for heading in headings), topic


def test_hand_written_lines_leave_the_generated_blocks_out():
    text = "a\n<!-- kvbench report: begin (x) -->\nrow\nrow\n<!-- kvbench report: end -->\nb\n"
    assert hand_written(text) == ["a", "", "b"]


def test_the_readme_says_how_to_reach_kvbench_after_make_bench():
    """`make bench` installs kvbench into .venv, not on the PATH: the README's next commands say so."""
    text = README.read_text()
    quick_start = text.split("## Quick start")[1].split("\n## ")[0]
    assert ".venv/bin/kvbench" in quick_start and ". .venv/bin/activate" in quick_start
    commands = [line for block in re.findall(r"```console\n(.*?)```", quick_start, re.S) for line in block.splitlines()]
    assert commands[:2] == [line for line in commands if line.startswith("make ")]  # make bench, make test
    assert commands[2].startswith(". .venv/bin/activate")  # before the first bare `kvbench`
    assert all(line.startswith("kvbench ") for line in commands[3:]) and len(commands) > 3
    assert (ROOT / "pyproject.toml").read_text().count('kvbench = "kvbench.__main__:main"') == 1


def test_missing_output_folders_are_created_as_the_docs_say(tmp_path, capsys):
    """The decision: an --output in a missing folder is created (at the write), never refused; a path under a
    regular file still is. README.md and docs/cli.md say the same."""
    assert "Output folders that do not exist yet are created" in README.read_text()
    assert "Missing folders are created" in (ROOT / "docs" / "cli.md").read_text()
    output = tmp_path / "runs" / "today" / "run.json"
    assert main(["run", "--lengths", "4", "--modes", "full,static", "--repeats", "1", "--warmup", "0",
                 "--no-progress", "--output", str(output)]) == 0
    assert output.is_file()
    report = tmp_path / "reports" / "run.md"
    assert main(["report", str(output), "--format", "markdown", "--output", str(report)]) == 0
    assert report.read_text().startswith("**kvbench")
    (tmp_path / "file").write_text("")
    capsys.readouterr()
    assert main(["report", str(output), "--output", str(tmp_path / "file" / "run.md")]) == 2
    assert "not a directory" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["README.md", "docs/cli.md"])
def test_the_docs_name_the_interval_as_docs_statistics_does(name):
    """One name for the interval beside a speedup: the 95% rerun interval (docs/statistics.md)."""
    text = GENERATED.sub("", (ROOT / name).read_text())
    assert "rerun interval" in text
    assert "bootstrap" not in text.lower()


def test_svgs_compare_by_outline_and_position_not_by_the_fonts_glyph_numbers():
    ours = b'<path id="DejaVuSans-13af" d="M 1 2"/><use xlink:href="#DejaVuSans-13af" transform="translate(3 0)"/>'
    system = ours.replace(b"13af", b"13b2")
    assert comparable("docs/results.svg", ours) == comparable("docs/results.svg", system)
    assert comparable("docs/results.svg", ours) != comparable("docs/results.svg", system.replace(b"M 1 2", b"M 1 3"))
    assert comparable("docs/results.svg", ours) != comparable("docs/results.svg", ours.replace(b"(3 0)", b"(4 0)"))
    assert comparable("README.md", ours) != comparable("README.md", system)


def test_docs_cli_has_a_row_for_every_run_option_and_for_no_other():
    """docs/cli.md's tables of `kvbench run` name each option of the parser in a row's first cell, and nothing else:
    an option added to the parser, or one removed, makes the reference stale."""
    from kvbench.cli.options import run_parser

    section = (ROOT / "docs" / "cli.md").read_text().split("\n## kvbench run\n")[1].split("\n## ")[0]
    first_cells = [line.split(" | ")[0] for line in section.splitlines() if line.startswith("| `")]
    named = set(re.findall(r"--[a-z][a-z0-9-]*", " ".join(first_cells)))
    options = {action.option_strings[-1] for action in run_parser().actions() if action.dest != "help"}
    assert (sorted(options - named), sorted(named - options)) == ([], [])


ARCHITECTURE = ROOT / "docs" / "architecture.md"


def architecture_rows() -> list[tuple[list[str], str]]:
    """The module table of docs/architecture.md: (the paths in a row's first cell, the rest of the row)."""
    rows = []
    for line in ARCHITECTURE.read_text().splitlines():
        if line.startswith("| `kvbench/"):
            first, _, rest = line[2:].partition(" | ")
            rows.append((re.findall(r"`(kvbench/[\w/]*?(?:\.py|/))`", first), rest))
    return rows


def test_the_architecture_names_every_module_of_kvbench():
    """A module file is named by its path, or by its name in its package's row (`timing` in `kvbench/measure/`'s);
    a package's row names its __init__."""
    named = set()
    for paths, rest in architecture_rows():
        for path in paths:
            if path.endswith(".py"):
                named.add(path)
            else:
                named |= {f"{path}__init__.py", *(f"{path}{word}.py" for word in re.findall(r"`(\w+)(?:\.py)?`", rest))}
    files = {path.relative_to(ROOT).as_posix() for path in (ROOT / "kvbench").rglob("*.py")}
    assert sorted(files - named) == []


def test_every_module_path_the_architecture_names_exists():
    """Every `kvbench/...` path, and every dotted `kvbench.x.y` name outside code blocks (where the old import
    paths are shown), is a module or package that exists, or an attribute of one."""
    text = ARCHITECTURE.read_text()
    paths = set(re.findall(r"\bkvbench/[\w/-]+(?:\.\w+)?", text))
    assert sorted(path for path in paths if not (ROOT / path).exists()) == []
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    package_names = {target.id for node in ast.parse((ROOT / "kvbench" / "__init__.py").read_text()).body
                     if isinstance(node, ast.Assign) for target in node.targets if isinstance(target, ast.Name)}
    missing = []
    for name in set(re.findall(r"(?<![\w/.-])kvbench(?:\.\w+)+", prose)):
        parts = name.split(".")
        if parts[1] not in package_names and not any(
                (ROOT / Path(*parts[:end])).with_suffix(".py").is_file() or (ROOT / Path(*parts[:end])).is_dir()
                for end in range(2, len(parts) + 1)):
            missing.append(name)
    assert sorted(missing) == []
