"""Every docstring example (``>>>``) of the project runs, so none drifts from the code.

The modules are the ones ``make wheel-check`` imports (tests/import_every_module.py reads
them from setup.cfg's package_dir), each imported once, under its installed
``autoresponse.*`` name, never as ``messages.envelope`` beside ``autoresponse.messages.envelope``.
Each module whose file holds a ``>>>`` is one case, named after the module; doctest runs its
examples (``ELLIPSIS`` on, so ``<... object at 0x...>`` can be written so).

* An example marked ``# doctest: +SKIP`` is not run; a module whose examples are all marked
  so counts as a skip (``-ra`` lists them), so they stay in sight.
* A module that needs an optional dependency (one of setup.cfg's extras) which is not
  installed is a skip naming it; any other import error is a failure.
* Every ``>>>`` in the file must be an example doctest runs: one in a comment, a nested
  function or a string that is no docstring would never run, so it fails here too.

``python tests/test_doctests.py`` prints each module's count of examples, run and skipped.
"""

from __future__ import annotations

import configparser
import doctest
import importlib
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from import_every_module import module_files

ROOT = Path(__file__).resolve().parent.parent
#: A line that starts an example (doctest's own pattern for it, less the comment-only ones).
PROMPT = re.compile(r"^[ \t]*>>>(?![ \t]*(?:#.*)?$)", re.MULTILINE)
OPTIONS = doctest.ELLIPSIS


def optional_dependencies() -> dict[str, str]:
    """The top-level module of each optional requirement, and the extra that installs it
    (``nats-py`` in ``nats`` gives ``nats``, ``tweepy[async]`` in ``x`` gives ``tweepy``)."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    found = {}
    for extra, requirements in config["options.extras_require"].items():
        for line in requirements.splitlines():
            if match := re.match(r"[A-Za-z0-9_]+", line.strip()):
                found.setdefault(match.group().lower(), extra)
    return found


def with_examples() -> dict[str, Path]:
    """The modules whose file holds an example (``__main__`` runs when imported: none has)."""
    return {name: path for name, path in module_files(ROOT).items()
            if PROMPT.search(path.read_text()) and not name.endswith(".__main__")}


MODULES = with_examples()


def load(name: str) -> ModuleType:
    """The module, or a skip if an optional dependency of it is not installed."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").split(".")[0]
        extras = optional_dependencies()
        if missing in extras:
            pytest.skip(f"{name} needs {missing} (pip install 'autoresponse[{extras[missing]}]')")
        raise


def examples_of(name: str, module: ModuleType) -> list[doctest.DocTest]:
    return [test for test in doctest.DocTestFinder().find(module, name) if test.examples]


def skipped(test: doctest.DocTest) -> int:
    return sum(bool(example.options.get(doctest.SKIP)) for example in test.examples)


def test_the_examples_are_found() -> None:
    """The collector sees the modules it must: a broken pattern would quietly test nothing."""
    assert "autoresponse.messages.envelope" in MODULES
    assert "autoresponse.actors.kernel.backoff" in MODULES
    assert len(MODULES) > 50
    assert not PROMPT.search(">>> # a comment runs nothing\n>>>\n")
    assert PROMPT.search("    >>> 1 + 1  # two\n")


@pytest.mark.parametrize("name", list(MODULES))
def test_docstring_examples(name: str) -> None:
    module = load(name)
    tests = examples_of(name, module)
    found = sum(len(test.examples) for test in tests)
    written = len(PROMPT.findall(MODULES[name].read_text()))
    assert found == written, (
        f"{name} has {written} '>>>' lines but doctest finds {found} examples: one is in a "
        "comment, a nested function or a string that is no docstring, and never runs")
    runner = doctest.DocTestRunner(optionflags=OPTIONS)
    report: list[str] = []
    failed = 0
    for test in tests:
        failed += runner.run(test, out=report.append).failed
    if failed:
        pytest.fail(f"{failed} of the examples of {name} failed:\n{''.join(report)}", pytrace=False)
    if all(skipped(test) == len(test.examples) for test in tests):
        pytest.skip(f"the {found} examples of {name} are all marked +SKIP")


def main() -> int:
    total = ran = 0
    for name in MODULES:
        tests = examples_of(name, importlib.import_module(name))
        count = sum(len(test.examples) for test in tests)
        skips = sum(skipped(test) for test in tests)
        total, ran = total + count, ran + count - skips
        print(f"{name}: {count} examples, {skips} marked +SKIP")
    print(f"{len(MODULES)} modules, {total} examples, {ran} run, {total - ran} marked +SKIP")
    return 0


if __name__ == "__main__":
    sys.exit(main())
