"""Every example in the README and the manual runs, and names only what exists.

The collector reads the fenced blocks of README.md and docs/**/*.md:

* ```` ```sh ```` blocks run with bash (``set -eo pipefail``) in a temporary directory
  (``HOME`` too, so data dirs land there), with the venv's bin first on ``PATH`` and
  ``.venv`` linked there, so ``autoresponse ...`` and ``.venv/bin/autoresponse ...`` both
  work; a block that exports ``AUTORESPONSE_`` variables then runs ``autoresponse config
  show``, so its values must be settings the daemon accepts;
* ```` ```python ```` blocks run with the venv's python, in a subprocess, in the same place;
* ```` ```toml ```` blocks are handed to ``autoresponse config show --config``, with the
  ``export`` lines of a ``sh`` block right above them (the secrets a page keeps out of
  the file, set in the environment).

Nothing here talks to anything but 127.0.0.1. A block that cannot run here says why in a
marker on the line before its fence, and counts as a skip with that reason (``-ra`` lists
them)::

    <!-- example: skip (needs a live Telegram token) -->

``<!-- example: daemon -->`` runs a shell block against a real ``autoresponse run`` started
for it (console off, a free admin port, which replaces ``8787`` in the block).

Skipped or not, every block is checked for names: each ``AUTORESPONSE_...`` variable (in
``sh``, ``python`` and ``toml`` blocks, and in the prose's inline code) must be a setting,
each ``autoresponse SUBCOMMAND`` a subcommand, each ``make TARGET`` a Makefile target.
So a renamed setting, command or target breaks the build.

``python tests/test_docs.py`` prints what the collector found, and the skips' reasons.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
VENV = BIN.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
RUNNABLE = {"sh": "sh", "bash": "sh", "shell": "sh", "python": "python", "toml": "toml"}
MARKER = re.compile(r"<!--\s*example:\s*(?P<kind>skip|run|daemon)\s*(?:\((?P<reason>.*)\))?\s*-->")
FENCE = re.compile(r"^(?P<fence>```+|~~~+)\s*(?P<lang>[\w+-]*)")
#: A setting's name; ``AUTORESPONSE_PAGER__...`` is a pattern, not a name.
SETTING = re.compile(r"\bAUTORESPONSE_[A-Z0-9_]*[A-Z0-9](?![A-Z0-9])(?![A-Z0-9_]*\.\.\.)")
SUBCOMMAND = re.compile(r"(?:^|[\s/`(])autoresponse[ \t]+(?P<sub>[a-z][a-z-]*)(?:[ \t]+(?P<subsub>[a-z][a-z-]*))?")
MAKE = re.compile(r"(?:^|[\s`(])make[ \t]+(?P<target>[a-z][a-z-]*)")
INLINE = re.compile(r"`([^`\n]+)`")
TIMEOUT = 120


@dataclass(frozen=True)
class Example:
    path: Path
    line: int          # the fence's line, 1-based
    lang: str          # sh, python, toml, or the fence's own word for blocks that are not run
    code: str
    kind: str          # run, skip, daemon; "show" for a block that is not run (output, a diagram)
    reason: str = ""
    exports: str = ""  # a toml block's: the export lines of the sh block right above it

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def collect(path: Path) -> tuple[list[Example], str]:
    """The fenced blocks of one Markdown file, and its prose (everything outside them)."""
    examples: list[Example] = []
    prose: list[str] = []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        opened = FENCE.match(lines[i])
        if not opened:
            prose.append(lines[i])
            i += 1
            continue
        fence, lang, start = opened["fence"], opened["lang"].lower(), i
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].startswith(fence):
            body.append(lines[i])
            i += 1
        i += 1
        before = next((line for line in reversed(lines[:start]) if line.strip()), "")
        marker = MARKER.search(before)
        if lang in RUNNABLE:
            kind = marker["kind"] if marker else "run"
            reason = (marker["reason"] or "").strip() if marker else ""
            if kind == "skip":
                assert reason, f"{path}:{start + 1}: a skipped example says why"
            above = examples[-1] if examples and FENCE.match(before) else None  # a block ends right above
            exports = "".join(line + "\n" for line in above.code.splitlines() if line.startswith("export ")) \
                if RUNNABLE[lang] == "toml" and above is not None and above.lang == "sh" else ""
            examples.append(Example(path, start + 1, RUNNABLE[lang], "\n".join(body) + "\n", kind, reason, exports))
        else:
            examples.append(Example(path, start + 1, lang or "text", "\n".join(body) + "\n", "show"))
    return examples, "\n".join(prose)


def everything() -> tuple[list[Example], list[str]]:
    examples: list[Example] = []
    prose: list[str] = []
    for page in PAGES:
        found, text = collect(page)
        examples += found
        prose.append(text)
    return examples, prose


EXAMPLES, PROSE = everything()
CHECKED = [e for e in EXAMPLES if e.kind != "show"]


def sandbox(tmp_path: Path, **extra: str) -> dict[str, str]:
    """A clean environment: no AUTORESPONSE_ or OTEL_ setting, HOME in tmp_path, the venv first."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AUTORESPONSE_", "OTEL_"))}
    env.update(HOME=str(tmp_path), PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(VENV),
               NO_COLOR="1", **extra)
    (tmp_path / ".venv").symlink_to(VENV, target_is_directory=True)
    return env


def run_shell(example: Example, tmp_path: Path, env: dict[str, str], code: str | None = None) -> None:
    code = example.code if code is None else code
    if re.search(r"^\s*export\s+.*AUTORESPONSE_", code, re.M):
        code += "autoresponse config show >/dev/null\n"
    done = subprocess.run(["bash", "-c", "set -eo pipefail\n" + code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"{example.where} exited {done.returncode}\n{done.stdout}\n{done.stderr}"


@pytest.mark.parametrize("example", CHECKED, ids=[e.where for e in CHECKED])
def test_the_example_runs(example: Example, tmp_path: Path) -> None:
    if example.kind == "skip":
        pytest.skip(f"{example.where}: {example.reason}")
    env = sandbox(tmp_path)
    if example.lang == "python":
        done = subprocess.run([sys.executable, "-c", example.code], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, f"{example.where}\n{done.stdout}\n{done.stderr}"
    elif example.lang == "toml":
        (tmp_path / "example.toml").write_text(example.code)
        done = subprocess.run(["bash", "-c", f"set -eo pipefail\n{example.exports}"
                                             "autoresponse config show --config example.toml"],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT,
                              stdin=subprocess.DEVNULL)
        assert done.returncode == 0, f"{example.where}\n{done.stderr}"
    elif example.kind == "daemon":
        from conftest import Daemon

        daemon = Daemon(tmp_path, AUTORESPONSE_CONSOLE__ENABLED="false", HOME=str(tmp_path))
        daemon.start()
        try:
            port = str(daemon.port)
            run_shell(example, tmp_path, {**env, "AUTORESPONSE_ADMIN__PORT": port,
                                          "AUTORESPONSE_DATA_DIR": str(tmp_path / "data")},
                      example.code.replace("8787", port))
        finally:
            daemon.signal(15)
            assert daemon.wait() == 0, daemon.log()
    else:
        run_shell(example, tmp_path, env)


def settings_named() -> dict[str, str]:
    """Every AUTORESPONSE_ variable the examples and the prose's inline code name, with where."""
    named: dict[str, str] = {}
    for example in CHECKED:
        for name in SETTING.findall(example.code):
            named.setdefault(name, example.where)
    for page, text in zip(PAGES, PROSE):
        for span in INLINE.findall(text):
            for name in SETTING.findall(span):
                named.setdefault(name, str(page.relative_to(ROOT)))
    return named


def not_settings(names: list[str], tmp_path: Path) -> list[str]:
    """The names the daemon's own settings check calls unknown (``... is not a setting``)."""
    env = sandbox(tmp_path, **{name: "" for name in names})
    done = subprocess.run([str(BIN / "autoresponse"), "config", "show"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    return sorted(set(re.findall(r"(AUTORESPONSE_\w+) is not a setting", done.stderr)))


def test_every_setting_the_docs_name_is_a_setting(tmp_path: Path) -> None:
    named = settings_named()
    assert len(named) > 50, "the collector found too few settings: is it still reading the docs?"
    unknown = not_settings(list(named), tmp_path)
    assert unknown == [], [f"{name} ({named[name]})" for name in unknown]


def test_a_renamed_setting_would_fail(tmp_path: Path) -> None:
    assert not_settings(["AUTORESPONSE_TERMINAL__ENABELD", "AUTORESPONSE_LLM__MODEL"], tmp_path) == [
        "AUTORESPONSE_TERMINAL__ENABELD"]


def help_choices(*words: str) -> set[str]:
    done = subprocess.run([str(BIN / "autoresponse"), *words, "--help"], capture_output=True, text=True,
                          timeout=TIMEOUT, stdin=subprocess.DEVNULL, env=os.environ | {"COLUMNS": "400"})
    assert done.returncode == 0, done.stderr
    usage = re.search(r"\{([\w,-]+)\}", done.stdout)
    return set(usage[1].split(",")) if usage else set()


def commands_named() -> dict[tuple[str, str | None], str]:
    """Every ``autoresponse SUB [SUBSUB]`` in a shell block or the prose's inline code."""
    named: dict[tuple[str, str | None], str] = {}
    texts = [(e.code, e.where) for e in CHECKED if e.lang == "sh"]
    texts += [(span, str(page.relative_to(ROOT))) for page, text in zip(PAGES, PROSE)
              for span in INLINE.findall(text)]
    for text, where in texts:
        for found in SUBCOMMAND.finditer(text):
            named.setdefault((found["sub"], found["subsub"]), where)
    return named


def test_every_command_the_docs_name_exists() -> None:
    named = commands_named()
    top = help_choices()
    assert {"run", "demo", "status", "config"} <= top
    wrong = [f"autoresponse {sub} ({where})" for (sub, _), where in named.items() if sub not in top]
    for sub in sorted({sub for sub, _ in named if sub in top}):
        inner = help_choices(sub)
        if inner:
            wrong += [f"autoresponse {sub} {subsub} ({where})" for (s, subsub), where in named.items()
                      if s == sub and subsub is not None and subsub not in inner]
    assert wrong == []


def test_every_make_target_the_docs_name_exists() -> None:
    targets = set(re.findall(r"^([a-z][a-z-]*):", (ROOT / "Makefile").read_text(), re.M))
    named = {m["target"]: e.where for e in CHECKED if e.lang == "sh" for m in MAKE.finditer(e.code)}
    named |= {m["target"]: str(page.relative_to(ROOT)) for page, text in zip(PAGES, PROSE)
              for span in INLINE.findall(text) for m in MAKE.finditer(span)}
    assert {"demo", "test", "bench", "docs", "local"} <= set(named)
    assert [f"make {t} ({w})" for t, w in named.items() if t not in targets] == []


def test_the_collector_reads_markers_and_fences(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("text `AUTORESPONSE_A`\n\n<!-- example: skip (needs a live Telegram token) -->\n"
                    "```sh\nexport X=1\n```\n\n```python\nprint(1)\n```\n\n```\n$ output\n```\n")
    examples, prose = collect(page)
    assert [(e.lang, e.kind, e.reason, e.line) for e in examples] == [
        ("sh", "skip", "needs a live Telegram token", 4), ("python", "run", "", 8), ("text", "show", "", 12)]
    assert "AUTORESPONSE_A" in prose and "$ output" not in prose


def _report() -> Any:
    spec = importlib.util.spec_from_file_location("report", ROOT / "benchmarks" / "report.py")
    assert spec is not None and spec.loader is not None
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    return report


def test_the_benchmark_figures_come_from_the_results_file() -> None:
    report = _report()
    results = json.loads(report.RESULTS.read_text())
    assert report.quick_cases(results) == []  # full runs only
    text = report.README.read_text()
    assert report.README.is_relative_to(ROOT / "docs")
    table = text.split(report.START, 1)[1].split(report.END, 1)[0]
    assert table.strip() == report.markdown(results).strip()


def test_quick_figures_never_reach_the_table(tmp_path: Path) -> None:
    report = _report()
    results = json.loads(report.RESULTS.read_text())
    page = tmp_path / "benchmarks.md"
    page.write_text(f"before\n{report.START}\nthe table\n{report.END}\nafter\n")
    for quick in ({**results, "quick": True}, {**results, "soak": {**results["soak"], "quick": True}}):
        with pytest.raises(ValueError, match="quick figures"):
            report.update_readme(quick, page)
    assert "the table" in page.read_text()
    report.update_readme(results, page)
    assert "the table" not in page.read_text() and page.read_text().startswith("before")


def test_the_readme_is_a_front_door() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme) < 8000, len(readme)
    for words in ("make demo", "make test", "make local", "make bench", "autoresponse status",
                  "AUTORESPONSE_TELEGRAM__TOKEN", "docs/index.md", "docs/status-page.png"):
        assert words in readme, words


def summary() -> str:
    kinds = Counter(e.kind for e in CHECKED)
    lines = [f"{len(CHECKED)} examples in {len(PAGES)} files: {kinds['run']} run, {kinds['daemon']} against "
             f"a daemon, {kinds['skip']} skipped; {len(EXAMPLES) - len(CHECKED)} blocks shown only; "
             f"{len(settings_named())} settings, {len(commands_named())} commands named"]
    lines += [f"  skip {e.where}: {e.reason}" for e in CHECKED if e.kind == "skip"]
    return "\n".join(lines)


if __name__ == "__main__":
    print(summary())
