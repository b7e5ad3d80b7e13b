"""Settings from the environment, a TOML file and the caller's defaults."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel, SecretStr

from autoresponse import Settings
from autoresponse.config import AdminSettings, ConfigError
from autoresponse.supervisors import Platform, registered


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


# ---------------------------------------------------------------- operator errors: one line each


def test_a_toml_file_that_does_not_parse_names_the_file_line_and_column(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('[llm]\nmodel = "unterminated\n')
    with pytest.raises(ConfigError, match=r"c\.toml: not valid TOML: .*\(at line 2, column \d+\)"):
        Settings.load(config)


def test_a_value_that_does_not_validate_names_its_variable_the_value_and_what_was_expected(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUTORESPONSE_ADMIN__PORT", "abc")
    with pytest.raises(ConfigError) as caught:
        Settings.load()
    assert str(caught.value) == ("AUTORESPONSE_ADMIN__PORT is 'abc': should be a valid integer, "
                                 "unable to parse string as an integer")


def test_a_list_variable_that_is_not_json_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTORESPONSE_TERMINAL__ALLOWED_COMMANDS", "notjson")
    with pytest.raises(ConfigError, match=r"^AUTORESPONSE_TERMINAL__ALLOWED_COMMANDS is 'notjson': "
                                          r"expected a JSON list"):
        Settings.load()


def test_a_bad_value_in_the_file_names_its_section_and_key(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('[admin]\nport = 70000\n[telegram]\nallowed_users = [1, "me"]\n')
    with pytest.raises(ConfigError) as caught:
        Settings.load(config)
    message = str(caught.value)
    assert f"{config}: [admin] port is 70000: should be less than or equal to 65535" in message
    assert f"{config}: [telegram] allowed_users[1] is 'me': should be a valid integer" in message
    assert "\n" not in message


def test_the_environment_is_named_when_it_overrides_the_file(monkeypatch: pytest.MonkeyPatch,
                                                             tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[admin]\nport = 8000\n")
    monkeypatch.setenv("AUTORESPONSE_ADMIN__PORT", "-1")
    with pytest.raises(ConfigError, match=r"^AUTORESPONSE_ADMIN__PORT is '-1': should be greater"):
        Settings.load(config)


def test_a_bad_secret_is_named_but_never_shown(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[llm]\napi_key = 987654321\n")
    with pytest.raises(ConfigError) as caught:
        Settings.load(config)
    assert "[llm] api_key (a secret, not shown): should be a valid string" in str(caught.value)
    assert "987654321" not in str(caught.value)


def test_a_bad_value_inside_a_whole_section_variable_names_the_variable_and_the_key(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUTORESPONSE_LLM", '{"model": "m", "max_attempts": 0}')
    with pytest.raises(ConfigError, match=r"^AUTORESPONSE_LLM\.max_attempts is 0: should be greater than "
                                          r"or equal to 1$"):
        Settings.load()


@pytest.mark.parametrize(("text", "expected"), [
    ("[terminal]\nenabeld = true\n", "unknown key [terminal] enabeld (did you mean enabled?)"),
    ('[telegarm]\ntoken = "x"\n', "unknown section [telegarm] (did you mean [telegram]?)"),
    ("[telegarm]\n", "unknown section [telegarm] (did you mean [telegram]?)"),
    ('data_dri = "/tmp"\n', "unknown key data_dri (did you mean data_dir?)"),
    ("[llm.retry]\nx = 1\n", "unknown section [llm.retry]"),
])
def test_an_unknown_key_in_the_file_is_an_error_with_a_suggestion(tmp_path: Path, text: str,
                                                                  expected: str) -> None:
    config = tmp_path / "c.toml"
    config.write_text(text)
    with pytest.raises(ConfigError) as caught:
        Settings.load(config)
    assert str(caught.value) == f"{config}: {expected}"


@pytest.mark.parametrize(("name", "expected"), [
    ("AUTORESPONSE_TERMINAL__ENABELD", "did you mean AUTORESPONSE_TERMINAL__ENABLED?"),
    ("AUTORESPONSE_TELEGARM__TOKEN", "did you mean AUTORESPONSE_TELEGRAM__TOKEN?"),
    ("AUTORESPONSE_DATADIR", "did you mean AUTORESPONSE_DATA_DIR?"),
])
def test_an_unknown_variable_is_an_error_with_a_suggestion(monkeypatch: pytest.MonkeyPatch, name: str,
                                                           expected: str) -> None:
    monkeypatch.setenv(name, "1")
    with pytest.raises(ConfigError) as caught:
        Settings.load()
    assert str(caught.value) == f"{name} is not a setting ({expected})"


class Route(BaseModel):
    number: str = ""
    api_key: SecretStr | None = None


class PagerSettings(BaseModel):
    enabled: bool = False
    token: SecretStr | None = None
    routes: dict[str, Route] = {}


def test_the_known_keys_come_from_the_registered_platforms(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTORESPONSE_PAGER__TOKNE", "x")
    with pytest.raises(ConfigError, match="AUTORESPONSE_PAGER__TOKNE is not a setting$"):
        Settings.load()
    with registered(Platform("pager", PagerSettings, lambda m: None)):
        with pytest.raises(ConfigError, match=r"\(did you mean AUTORESPONSE_PAGER__TOKEN\?\)"):
            Settings.load()
        monkeypatch.delenv("AUTORESPONSE_PAGER__TOKNE")
        monkeypatch.setenv("AUTORESPONSE_PAGER__TOKEN", "x")
        assert Settings.load().section("pager").token is not None


def test_keys_are_checked_inside_a_dict_of_models(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    with registered(Platform("pager", PagerSettings, lambda m: None)):
        config.write_text('[pager.routes.ops]\nnumber = "555"\n')
        monkeypatch.setenv("AUTORESPONSE_PAGER__ROUTES__DEV", '{"number": "556"}')
        routes = Settings.load(config).section("pager").routes
        assert (routes["ops"].number, routes["dev"].number) == ("555", "556")

        config.write_text('[pager.routes.ops]\nnumbr = "555"\n')
        with pytest.raises(ConfigError, match=r"unknown key \[pager\.routes\.ops\] numbr "
                                              r"\(did you mean number\?\)$"):
            Settings.load(config)

        config.write_text("[pager.routes.ops]\napi_key = 1234567\n")
        with pytest.raises(ConfigError) as caught:
            Settings.load(config)
        assert "[pager.routes.ops] api_key (a secret, not shown)" in str(caught.value)
        assert "1234567" not in str(caught.value)


def test_an_empty_admin_token_is_no_token(monkeypatch: pytest.MonkeyPatch) -> None:
    for blank in ("", "   "):
        monkeypatch.setenv("AUTORESPONSE_ADMIN__TOKEN", blank)
        assert Settings.load().admin.token is None
    assert AdminSettings(token="t0ken").token is not None


def test_a_data_dir_that_is_a_file_is_refused_with_the_reason(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match=r"the data directory .*/file .* cannot be used: it is a file$"):
        Settings.load(data_dir=tmp_path / "file").check_data_dir()
    with pytest.raises(ConfigError, match=r"the data directory .*/file/data .* cannot be used: "
                                          r".*/file is a file$"):
        Settings.load(data_dir=tmp_path / "file" / "data").check_data_dir()
    assert Settings.load(data_dir=tmp_path / "new" / "data").check_data_dir().is_dir()
