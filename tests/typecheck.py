"""`make typecheck`: mypy over the autoresponse.* namespace, named as setup.cfg installs it.

The rooms (messages/, actors/, ...) become autoresponse.* only through setuptools'
package_dir, and the editable install maps them with an import hook that mypy does not
follow; from the folders alone mypy would call them ``messages.envelope``. So this hands mypy
every module of the project under its installed name (read from setup.cfg's package_dir, as
tests/test_layout.py does): every ``autoresponse.*`` import resolves, in a fresh clone too,
and errors name the files in the folders. Which modules are held to which rules is in
pyproject.toml's [tool.mypy]; extra arguments go to mypy.

    python tests/typecheck.py [mypy options...]
"""

from __future__ import annotations

import configparser
import os
import sys
import time
from pathlib import Path

from mypy import util
from mypy.fscache import FileSystemCache
from mypy.main import process_options, run_build
from mypy.modulefinder import BuildSource

ROOT = Path(__file__).resolve().parent.parent


def project_sources() -> list[BuildSource]:
    """Every module of setup.cfg's packages, under the name it is installed as."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    mapping = dict(line.split(" = ") for line in config["options"]["package_dir"].strip().splitlines())
    folders = {Path(folder) for folder in mapping.values()}
    sources = []
    for package, folder in mapping.items():
        for path in sorted(Path(folder).rglob("*.py")):
            # A folder mapped on its own (actors/ under autoresponse.actors) is not also part
            # of the package whose folder holds it.
            if any(f != Path(folder) and f in path.parents for f in folders):
                continue
            parts = path.relative_to(folder).with_suffix("").parts
            module = ".".join((package, *(p for p in parts if p != "__init__")))
            sources.append(BuildSource(str(path), module))
    return sources


def main(argv: list[str]) -> int:
    started = time.time()
    os.chdir(ROOT)
    fscache = FileSystemCache()
    _, options = process_options(["--config-file", "pyproject.toml", *argv],
                                 require_targets=False, fscache=fscache)
    sources = project_sources()
    _, messages, blockers = run_build(sources, options, fscache, started, sys.stdout, sys.stderr)
    errors, notes, files = util.count_stats(messages)
    formatter = util.FancyFormatter(sys.stdout, sys.stderr, options.hide_error_codes)
    if errors or blockers:
        print(formatter.format_error(errors, files, len(sources), blockers=blockers))
        return 2 if blockers else 1
    print(formatter.format_success(len(sources)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
