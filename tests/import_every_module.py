"""Import every module of the source tree, and load every entry point, from an installed
autoresponse (a wheel in a fresh venv), so a package left out of setup.cfg's hand-written
list, or a console script pointing nowhere, fails here.

Run by ``make wheel-check``: ``python tests/import_every_module.py REPO`` from outside REPO.
"""

from __future__ import annotations

import configparser
import importlib
import importlib.metadata
import importlib.util
import sys
from pathlib import Path


def module_files(repo: Path) -> dict[str, Path]:
    """Every module of setup.cfg's packages, by its installed name, and the file it is in."""
    config = configparser.ConfigParser()
    config.read(repo / "setup.cfg")
    mapping = dict(line.split(" = ") for line in config["options"]["package_dir"].strip().splitlines())
    modules = {}
    for package, folder in mapping.items():
        for path in sorted((repo / folder).rglob("*.py")):
            relative = path.relative_to(repo / folder).with_suffix("")
            if relative.parts[0] in {child.split(".")[-1] for child in mapping if child != package}:
                continue  # a mapped sub-room is listed under its own name
            parts = [p for p in relative.parts if p != "__init__"]
            modules[".".join((package, *parts))] = path
    return dict(sorted(modules.items()))


def expected_modules(repo: Path) -> list[str]:
    return list(module_files(repo))


def main() -> int:
    repo = Path(sys.argv[1]).resolve()
    missing = []
    for name in expected_modules(repo):
        try:
            if name.endswith(".__main__"):  # running it is its point: find it, do not run it
                spec = importlib.util.find_spec(name)
                if spec is None:
                    raise ImportError(f"no module named {name!r}")
                where = Path(spec.origin or "").resolve()
            else:
                where = Path(importlib.import_module(name).__file__ or "").resolve()
        except ImportError as exc:
            missing.append(f"{name}: {exc}")
            continue
        if Path(sys.prefix).resolve() not in where.parents:
            missing.append(f"{name} was imported from {where}, not from the installed wheel")
    for entry in importlib.metadata.distribution("autoresponse").entry_points:
        try:
            entry.load()
        except (ImportError, AttributeError) as exc:
            missing.append(f"entry point {entry.name} = {entry.value}: {exc}")
    if missing:
        print("the wheel lacks modules:\n  " + "\n  ".join(missing), file=sys.stderr)
        return 1
    print(f"imported {len(expected_modules(repo))} modules from the installed wheel")
    return 0


if __name__ == "__main__":
    sys.exit(main())
