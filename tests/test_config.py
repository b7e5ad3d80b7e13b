"""Settings from the environment, a TOML file and the caller's defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoresponse import Settings


def test_nested_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTORESPONSE_LLM__BASE_URL", "http://127.0.0.1:11434/v1")
    monkeypatch.setenv("AUTORESPONSE_TERMINAL__ENABLED", "true")
    monkeypatch.setenv("AUTORESPONSE_TERMINAL__ALLOWED_COMMANDS", '["df", "uptime"]')
    settings = Settings.load()
    assert settings.llm.base_url == "http://127.0.0.1:11434/v1"
    assert settings.terminal.enabled is True
    assert settings.terminal.allowed_commands == ["df", "uptime"]


def test_environment_beats_file_beats_defaults(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('[llm]\nmodel = "from-file"\nread_timeout = 7\n[terminal]\ntimeout = 3\n')
    monkeypatch.setenv("AUTORESPONSE_LLM__MODEL", "from-env")
    settings = Settings.load(config, defaults={"terminal": {"enabled": True, "timeout": 9},
                                               "llm": {"read_timeout": 99}})
    assert settings.llm.model == "from-env"
    assert settings.llm.read_timeout == 7
    assert settings.terminal.timeout == 3
    assert settings.terminal.enabled is True  # from the defaults, merged under the file


def test_the_api_key_is_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTORESPONSE_LLM__API_KEY", "sk-hidden")
    settings = Settings.load()
    assert "sk-hidden" not in repr(settings) and "sk-hidden" not in str(settings.model_dump())
    assert settings.llm.api_key is not None and settings.llm.api_key.get_secret_value() == "sk-hidden"
