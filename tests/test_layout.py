"""The house rules: the requested top level, one namespace, arrows that point down."""

from __future__ import annotations

import ast
import configparser
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: Each room, and the rooms its modules may import. The composition root
#: (autoresponse/: app, config, admin, CLI) may import every room; nothing imports it.
ROOMS = {
    "messages": set(),
    "actors": {"messages"},
    "supervisors": {"actors", "messages"},
    "interfaces": {"supervisors", "actors", "messages"},
    "autoresponse": {"interfaces", "supervisors", "actors", "messages"},
}
#: Where each room's folder is, relative to the repository root.
FOLDERS = {"messages": "messages", "actors": "actors", "supervisors": "supervisors",
           "interfaces": "interfaces", "autoresponse": "autoresponse"}


def room_of(module: str) -> str | None:
    """The room an ``autoresponse...`` module belongs to (None for other packages)."""
    parts = module.split(".")
    if parts[0] != "autoresponse":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in ROOMS and parts[1] != "autoresponse" else "autoresponse"


def imports_of(source: str, module: str) -> list[str]:
    """Every module ``source`` imports, at the top or inside functions (lazy imports count)."""
    found = []
    package = module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                found.append(f"{base}.{node.module}" if node.module else base)
            elif node.module:
                found.append(node.module)
    return found


def violations(modules: dict[str, str]) -> list[str]:
    """Each import that points up or sideways into the composition root."""
    wrong = []
    for module, source in modules.items():
        mine = room_of(module)
        for target in imports_of(source, module):
            theirs = room_of(target)
            if theirs is None or theirs == mine:
                continue
            if theirs not in ROOMS[mine]:  # type: ignore[index]
                wrong.append(f"{module} imports {target} ({mine} → {theirs})")
    return wrong


def project_modules() -> dict[str, str]:
    modules = {}
    for room, folder in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            relative = path.relative_to(ROOT / folder).with_suffix("")
            dotted = ".".join(p for p in relative.parts if p != "__init__")
            prefix = "autoresponse" if room == "autoresponse" else f"autoresponse.{room}"
            modules[f"{prefix}.{dotted}".rstrip(".")] = path.read_text()
    return modules


def test_the_repository_shows_the_requested_top_level() -> None:
    for name in ("setup.cfg", "actors", "messages", "supervisors", "interfaces", "tests", "benchmarks"):
        assert (ROOT / name).exists(), name
    assert (ROOT / "docs" / "ARCHITECTURE.md").is_file()


def test_arrows_point_down_only() -> None:
    assert violations(project_modules()) == []


def test_the_arrow_check_catches_a_wrong_arrow() -> None:
    modules = {
        "autoresponse.messages.bad": "from autoresponse.actors.runtime import Runtime\n",
        "autoresponse.actors.lazy": "def f():\n    from autoresponse.interfaces import telegram\n",
        "autoresponse.interfaces.x": "from autoresponse.app import Application\n",
        "autoresponse.actors.fine": "from autoresponse.messages import Envelope\n",
    }
    assert violations(modules) == [
        "autoresponse.messages.bad imports autoresponse.actors.runtime (messages → actors)",
        "autoresponse.actors.lazy imports autoresponse.interfaces (actors → interfaces)",
        "autoresponse.interfaces.x imports autoresponse.app (interfaces → autoresponse)",
    ]


def test_the_protocol_loads_without_telegram_aiohttp_or_prometheus() -> None:
    code = ("import sys, autoresponse.messages; "
            "print(sorted(m for m in ('telegram', 'aiohttp', 'prometheus_client', 'pykka') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd="/")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_root_folders_are_not_importable_under_a_second_name() -> None:
    """``messages.envelope`` and ``autoresponse.messages.envelope`` must never be two modules."""
    installed = importlib.import_module("autoresponse.messages.envelope")
    try:
        second = importlib.import_module("messages.envelope")
    except ModuleNotFoundError:
        return
    assert second is installed, "the root folder was imported as a second, separate package"


def test_the_hand_written_package_list_names_every_package() -> None:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    listed = set(config["options"]["packages"].split())
    mapping = dict(line.split(" = ") for line in config["options"]["package_dir"].strip().splitlines())
    on_disk = set()
    for package, folder in mapping.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / folder)
            on_disk.add(".".join((package, *relative.parts)))
    assert listed == on_disk


@pytest.mark.parametrize("alias", ["telegram_bot", "telegram"])
def test_an_interface_alias_names_its_platform(alias: str) -> None:
    import autoresponse.interfaces  # noqa: F401  (the built-in platforms register themselves)
    from autoresponse.messages import OriginalContext

    assert OriginalContext(chat_id=1, interface_name=alias).interface_name == "telegram"
