"""A mkdocs hook: the source tree as it installs, for the API reference.

The rooms sit at the repository's root and install as one namespace through setup.cfg's
``package_dir`` (messages/ is ``autoresponse.messages``, and so on), which griffe, the
reader behind mkdocstrings, cannot follow from the editable install. Before each build
this links them into ``build/api-sources/autoresponse/`` as they install, and
mkdocs.yml's handler reads its ``paths`` there: the docstrings are read, nothing is
imported.
"""

from __future__ import annotations

import configparser
import shutil
from pathlib import Path
from typing import Any

from mkdocs.plugins import event_priority

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / "build" / "api-sources"


@event_priority(100)  # before mkdocstrings' handler looks for its paths
def on_config(config: Any, **_: Any) -> Any:
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    mapping = dict(line.split(" = ") for line in setup["options"]["package_dir"].strip().splitlines())
    shutil.rmtree(TREE, ignore_errors=True)
    top = TREE / "autoresponse"
    top.mkdir(parents=True)
    for entry in (ROOT / mapping.pop("autoresponse")).iterdir():
        if entry.name != "__pycache__":
            (top / entry.name).symlink_to(entry)
    for package, folder in mapping.items():  # autoresponse.messages = messages, ...
        (top / package.split(".", 1)[1]).symlink_to(ROOT / folder, target_is_directory=True)
    return config
