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
#: (autoresponse/: app, config, admin, CLI) may import every product room; nothing imports
#: it. The kernel (actors/kernel/) is generic: it knows the protocol, the limits and the
#: journal's interface, never the pipeline built on it. The test doubles
#: (autoresponse/testing/) may import anything, and the product never imports them.
ROOMS = {
    "messages": set(),
    "foundation": {"messages"},
    "kernel": {"foundation", "messages"},
    "actors": {"kernel", "foundation", "messages"},
    "supervisors": {"actors", "kernel", "foundation", "messages"},
    "interfaces": {"supervisors", "actors", "kernel", "foundation", "messages"},
    "autoresponse": {"interfaces", "supervisors", "actors", "kernel", "foundation", "messages"},
    "testing": {"autoresponse", "interfaces", "supervisors", "actors", "kernel", "foundation",
                "messages"},
}
#: What the kernel stands on, in the actors folder: the table of limits, the SQLite
#: journal it writes through, and the JSON it writes. None imports the pipeline.
FOUNDATION = {"autoresponse.actors.limits", "autoresponse.actors.journal",
              "autoresponse.actors.journal.journal", "autoresponse.actors.journal._checkpointer",
              "autoresponse.actors.jsonbody"}
#: Where each room's folder is, relative to the repository root (the kernel and the
#: test doubles are found inside actors/ and autoresponse/).
FOLDERS = {"messages": "messages", "actors": "actors", "supervisors": "supervisors",
           "interfaces": "interfaces", "autoresponse": "autoresponse"}


def room_of(module: str) -> str | None:
    """The room an ``autoresponse...`` module belongs to (None for other packages)."""
    parts = module.split(".")
    if parts[0] != "autoresponse":
        return None
    if parts[1:3] == ["actors", "kernel"]:
        return "kernel"
    if module in FOUNDATION:
        return "foundation"
    if len(parts) > 1 and parts[1] == "testing":
        return "testing"
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
        "autoresponse.messages.bad": "from autoresponse.actors.kernel.runtime import Runtime\n",
        "autoresponse.actors.lazy": "def f():\n    from autoresponse.interfaces import telegram\n",
        "autoresponse.interfaces.x": "from autoresponse.app import Application\n",
        "autoresponse.actors.fine": "from autoresponse.messages import Envelope\n",
    }
    assert violations(modules) == [
        "autoresponse.messages.bad imports autoresponse.actors.kernel.runtime (messages → kernel)",
        "autoresponse.actors.lazy imports autoresponse.interfaces (actors → interfaces)",
        "autoresponse.interfaces.x imports autoresponse.app (interfaces → autoresponse)",
    ]


def test_the_kernel_and_the_doubles_keep_to_their_rooms() -> None:
    modules = {
        "autoresponse.actors.kernel.bad": "from autoresponse.actors.dispatcher import Dispatcher\n",
        "autoresponse.actors.kernel.fine": "from autoresponse.actors.limits import MAX_HOPS\n",
        "autoresponse.interfaces.telegram.bad": "from autoresponse.testing.fake_telegram import F\n",
        "autoresponse.testing.fine": "from autoresponse.app import Application\n",
    }
    assert violations(modules) == [
        "autoresponse.actors.kernel.bad imports autoresponse.actors.dispatcher (kernel → actors)",
        "autoresponse.interfaces.telegram.bad imports autoresponse.testing.fake_telegram "
        "(interfaces → testing)",
    ]


def test_the_doubles_are_out_of_the_product_rooms() -> None:
    """Fake servers live under autoresponse.testing only, never beside a platform's code."""
    strays = [str(p.relative_to(ROOT)) for room in ("actors", "interfaces", "supervisors", "messages")
              for p in (ROOT / room).rglob("*fake*.py")]
    assert strays == []
    assert sorted(p.name for p in (ROOT / "autoresponse" / "testing").glob("fake_*.py")) == [
        "fake_llm.py", "fake_reddit.py", "fake_telegram.py", "fake_x.py"]


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
