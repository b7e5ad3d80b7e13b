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


@pytest.mark.parametrize("value", ["[" * 100_000 + "]" * 100_000, "{b = " * 5_000 + "1" + "}" * 5_000])
def test_a_toml_file_nested_past_any_parser_is_one_line_too(tmp_path: Path, value: str) -> None:
    config = tmp_path / "c.toml"
    config.write_text(f"a = {value}\n")
    with pytest.raises(ConfigError, match=r"c\.toml: not valid TOML: nested too deeply"):
        Settings.load(config)


def test_a_json_variable_nested_past_any_parser_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTORESPONSE_TELEGRAM__ALLOWED_USERS", "[" * 100_000)
    with pytest.raises(ConfigError, match=r"^AUTORESPONSE_TELEGRAM__ALLOWED_USERS: expected a JSON list"):
        Settings.load()


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
    with pytest.raises(ConfigError, match=r"^AUTORESPONSE_TERMINAL__ALLOWED_COMMANDS: expected a JSON list"):
        Settings.load()


@pytest.mark.parametrize(("variable", "value", "expected"), [
    ("AUTORESPONSE_TELEGRAM", '{"token": "123456:SECRETTOKEN", "allowed_users": [1]',  # the } forgotten
     'AUTORESPONSE_TELEGRAM: expected a JSON object, e.g. {"k": "v"} (Expecting \',\' delimiter: '
     'line 1 column 53 (char 52))'),
    ("AUTORESPONSE_LLM__FALLBACKS", '[{"base_url": "http://127.0.0.1:8080/v1", "api_key": "sk-SECRETKEY"}',
     'AUTORESPONSE_LLM__FALLBACKS: expected a JSON list, e.g. ["a", "b"] (Expecting \',\' delimiter: '
     'line 1 column 69 (char 68))'),
    ("AUTORESPONSE_TELEGRAM", "123456:SECRETTOKEN",  # a token where the whole section goes
     'AUTORESPONSE_TELEGRAM: expected a JSON object, e.g. {"k": "v"} (Extra data: line 1 column 7 (char 6))'),
], ids=["section", "fallbacks", "not-json"])
def test_a_json_variable_that_does_not_parse_is_named_and_never_shown(monkeypatch: pytest.MonkeyPatch,
                                                                      variable: str, value: str,
                                                                      expected: str) -> None:
    # Any part of the value may be a secret; the error goes to stderr, which journald keeps.
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as caught:
        Settings.load()
    assert str(caught.value) == expected
    assert "SECRET" not in str(caught.value)


def test_a_secret_in_a_list_of_tables_is_named_and_never_shown(monkeypatch: pytest.MonkeyPatch,
                                                               tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('[llm]\nfallbacks = [{base_url = "http://127.0.0.1:8080/v1", api_key = 8675309}]\n')
    with pytest.raises(ConfigError) as caught:
        Settings.load(config)
    assert str(caught.value) == (f"{config}: [llm] fallbacks[0].api_key (a secret, not shown): "
                                 "should be a valid string")
    monkeypatch.setenv("AUTORESPONSE_LLM__FALLBACKS", '["sk-SECRETKEY"]')  # a key where a fallback goes
    with pytest.raises(ConfigError) as caught:
        Settings.load()
    assert str(caught.value).startswith("AUTORESPONSE_LLM__FALLBACKS[0] (a secret, not shown): ")
    assert "SECRETKEY" not in str(caught.value)


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


@pytest.mark.parametrize("given", ["debug", " Warning ", "CRITICAL"])
def test_the_log_level_takes_its_names_in_any_case(monkeypatch: pytest.MonkeyPatch, given: str) -> None:
    monkeypatch.setenv("AUTORESPONSE_LOG_LEVEL", given)
    assert Settings.load().log_level == given.strip().upper()


@pytest.mark.parametrize(("given", "level"), [("warn", "WARNING"), (" Fatal", "CRITICAL")])
def test_the_log_level_takes_loggings_other_names(monkeypatch: pytest.MonkeyPatch, given: str, level: str) -> None:
    monkeypatch.setenv("AUTORESPONSE_LOG_LEVEL", given)
    assert Settings.load().log_level == level


@pytest.mark.parametrize("given", ["verbose", "10", "WARNS", ""])
def test_a_log_level_that_is_no_level_names_its_variable_and_the_levels(monkeypatch: pytest.MonkeyPatch,
                                                                        given: str) -> None:
    monkeypatch.setenv("AUTORESPONSE_LOG_LEVEL", given)
    with pytest.raises(ConfigError) as caught:
        Settings.load()
    assert str(caught.value) == (f"AUTORESPONSE_LOG_LEVEL is {given!r}: "
                                 "should be 'DEBUG', 'INFO', 'WARNING', 'ERROR' or 'CRITICAL'")


def test_a_log_level_in_the_file_that_is_a_number_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("log_level = 20\n")
    with pytest.raises(ConfigError, match=r"c\.toml: log_level is 20: should be 'DEBUG'"):
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


@pytest.mark.parametrize(("variable", "value", "expected"), [
    ("AUTORESPONSE_TELEGRAM", '{"tokn": "123456:ABC", "allowed_users": [1]}',
     "AUTORESPONSE_TELEGRAM: unknown key tokn (did you mean token?)"),
    ("AUTORESPONSE_LLM", '{"base_url": "http://127.0.0.1:8080/v1", "modle": "smollm2"}',
     "AUTORESPONSE_LLM: unknown key modle (did you mean model?)"),
    ("AUTORESPONSE_LLM__FALLBACKS", '[{"base_url": "offline", "modle": "m", "apikey": "sk-x"}]',
     "AUTORESPONSE_LLM__FALLBACKS[0]: unknown key modle (did you mean model?); "
     "AUTORESPONSE_LLM__FALLBACKS[0]: unknown key apikey (did you mean api_key?)"),
    # Keys match in any case through nested models only, not in a list's items:
    ("AUTORESPONSE_LLM", '{"fallbacks": [{"base_url": "offline", "Model": "m"}]}',
     "AUTORESPONSE_LLM.fallbacks[0]: unknown key Model (did you mean model?)"),
], ids=["section", "llm", "fallbacks", "case-in-a-list"])
def test_an_unknown_key_inside_a_json_variable_is_an_error_with_a_suggestion(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, expected: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as caught:
        Settings.load()
    assert str(caught.value) == expected


def test_keys_of_a_json_section_still_match_in_any_case(monkeypatch: pytest.MonkeyPatch) -> None:
    # pydantic-settings matches them so through nested models: no unknown key there.
    monkeypatch.setenv("AUTORESPONSE_LLM", '{"MODEL": "m", "Fallbacks": [{"base_url": "offline", '
                                           '"model": "f"}]}')
    llm = Settings.load().llm
    assert (llm.model, llm.fallbacks[0].model) == ("m", "f")


def test_an_unknown_key_in_a_list_of_tables_is_an_error_with_a_suggestion(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('[[llm.fallbacks]]\nbase_url = "http://127.0.0.1:8080/v1"\nmodle = "smollm2"\n')
    with pytest.raises(ConfigError) as caught:
        Settings.load(config)
    assert str(caught.value) == f"{config}: unknown key [llm] fallbacks[0].modle (did you mean model?)"


@pytest.mark.parametrize(("name", "expected"), [
    ("AUTORESPONSE_TELEGRAM_TOKEN", " (did you mean AUTORESPONSE_TELEGRAM__TOKEN?)"),
    ("AUTORESPONSE_LLM_BASE_URL", " (did you mean AUTORESPONSE_LLM__BASE_URL?)"),
    ("AUTORESPONSE_LLM_MODEL", " (did you mean AUTORESPONSE_LLM__MODEL?)"),
    ("AUTORESPONSE_TELEGRAM_ALLOWED_USERS", " (did you mean AUTORESPONSE_TELEGRAM__ALLOWED_USERS?)"),
    ("AUTORESPONSE_LOG__LEVEL", " (did you mean AUTORESPONSE_LOG_LEVEL?)"),
    ("AUTORESPONSE_TELEGRAM_TOKN", " (did you mean AUTORESPONSE_TELEGRAM__TOKEN?)"),
    ("AUTORESPONSE_TELEGRAM_FOO", ""),  # not AUTORESPONSE_TELEGRAM, a whole section as JSON
])
def test_a_variable_spelled_with_one_underscore_for_two_gets_the_real_name(monkeypatch: pytest.MonkeyPatch,
                                                                          name: str, expected: str) -> None:
    monkeypatch.setenv(name, "1")
    with pytest.raises(ConfigError) as caught:
        Settings.load()
    assert str(caught.value) == f"{name} is not a setting{expected}"


def test_a_toml_file_saved_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_bytes(b'\xef\xbb\xbf[llm]\nmodel = "from-file"\n')  # as some Windows editors save it
    assert Settings.load(config).llm.model == "from-file"


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


def test_a_bot_token_of_spaces_is_no_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """As an empty one: Telegram stays off, and no run of spaces is taken for a secret to hide."""
    for blank in ("", "    "):
        monkeypatch.setenv("AUTORESPONSE_TELEGRAM__TOKEN", blank)
        settings = Settings.load()
        assert settings.telegram.enabled is False
        assert all(secret.strip() for secret in settings.secrets())


def test_a_token_or_key_pasted_with_spaces_and_a_line_end_is_sent_without_them(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """``$(cat token.txt)`` brings its line end: Telegram's URL and the LLM's header would
    carry it (and Telegram refuse the token), and the redactor look for it."""
    monkeypatch.setenv("AUTORESPONSE_TELEGRAM__TOKEN", " 123456:AAH-real \n")
    monkeypatch.setenv("AUTORESPONSE_LLM__API_KEY", "sk-real-key\n")
    monkeypatch.setenv("AUTORESPONSE_LLM__FALLBACKS", '[{"base_url": "http://127.0.0.1:9", "api_key": " sk-fb "}]')
    settings = Settings.load()
    assert settings.telegram.token is not None and settings.telegram.token.get_secret_value() == "123456:AAH-real"
    assert settings.llm.api_key is not None and settings.llm.api_key.get_secret_value() == "sk-real-key"
    [fallback] = settings.llm.fallbacks
    assert fallback.api_key is not None and fallback.api_key.get_secret_value() == "sk-fb"
    assert {"123456:AAH-real", "sk-real-key", "sk-fb"} <= set(settings.secrets())


@pytest.mark.parametrize(("variable", "whole"), [
    ("AUTORESPONSE_LLM__FALLBACKS__0__API_KEY", "AUTORESPONSE_LLM__FALLBACKS (or [llm] fallbacks"),
    ("AUTORESPONSE_LLM__FALLBACKS__0", "AUTORESPONSE_LLM__FALLBACKS (or [llm] fallbacks"),
    ("AUTORESPONSE_TELEGRAM__ALLOWED_USERS__0",
     "AUTORESPONSE_TELEGRAM__ALLOWED_USERS (or [telegram] allowed_users"),
    ("autoresponse_approvers__1", "AUTORESPONSE_APPROVERS (or approvers"),  # any case, as read
])
def test_a_variable_naming_a_list_s_item_names_the_variable_that_sets_the_list(
        monkeypatch: pytest.MonkeyPatch, variable: str, whole: str) -> None:
    monkeypatch.setenv(variable, "sk-SECRETKEY")
    with pytest.raises(ConfigError) as caught:
        Settings.load()
    assert str(caught.value) == (f"{variable} is not a setting: a list is set whole, as JSON, "
                                 f"in {whole} in the TOML file)")


def test_a_data_dir_that_is_a_file_is_refused_with_the_reason(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match=r"the data directory .*/file .* cannot be used: it is a file$"):
        Settings.load(data_dir=tmp_path / "file").check_data_dir()
    with pytest.raises(ConfigError, match=r"the data directory .*/file/data .* cannot be used: "
                                          r".*/file is a file$"):
        Settings.load(data_dir=tmp_path / "file" / "data").check_data_dir()
    assert Settings.load(data_dir=tmp_path / "new" / "data").check_data_dir().is_dir()


# ---------------------------------------------------------------- numbers, URLs and paths that cannot be meant


def _float_settings(model: type[BaseModel], path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The path of every float setting beneath ``model``, in nested sections too."""
    from typing import get_args

    found = []
    for name, field in model.model_fields.items():
        members = [field.annotation, *get_args(field.annotation)]
        if float in members:
            found.append((*path, name))
        found += [p for m in members if isinstance(m, type) and issubclass(m, BaseModel)
                  for p in _float_settings(m, (*path, name))]
    return found


FLOAT_SETTINGS = _float_settings(type(Settings()))


def test_every_section_has_float_settings_to_check() -> None:
    sections = {path[0] for path in FLOAT_SETTINGS}
    assert {"llm", "runtime", "retry", "supervision", "memory", "journal", "events", "terminal"} <= sections


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "Infinity"])
def test_no_float_setting_of_any_section_takes_inf_or_nan(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    for path in FLOAT_SETTINGS:
        variable = "AUTORESPONSE_" + "__".join(path).upper()
        monkeypatch.setenv(variable, value)
        with pytest.raises(ConfigError, match=f"^{variable} is "):  # its bound, or "a finite number"
            Settings.load()
        monkeypatch.delenv(variable)


def test_a_float_with_no_bound_is_refused_as_not_finite(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[llm]\ntemperature = nan\n")  # TOML has nan and inf literals
    with pytest.raises(ConfigError) as caught:
        Settings.load(config)
    assert str(caught.value) == f"{config}: [llm] temperature is nan: should be a finite number"
    with pytest.raises(ConfigError, match=r"^the argument runtime\.drain_seconds is inf: should be a finite"):
        Settings.load(runtime={"drain_seconds": float("inf")})


def test_a_time_longer_than_any_wait_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTORESPONSE_RUNTIME__DRAIN_SECONDS", "1e300")  # waiting for it overflows
    with pytest.raises(ConfigError, match=r"^AUTORESPONSE_RUNTIME__DRAIN_SECONDS is 1e\+300: should be less "
                                          r"than or equal to \d+$"):
        Settings.load()
    monkeypatch.setenv("AUTORESPONSE_RUNTIME__DRAIN_SECONDS", "86400")
    assert Settings.load().runtime.drain_seconds == 86400


class MeterSettings(BaseModel):
    interval: float = 1.0
    routes: dict[str, Route] = {}
    limits: list[float] = []


def test_a_registered_platform_s_floats_are_checked_too(monkeypatch: pytest.MonkeyPatch) -> None:
    with registered(Platform("meter", MeterSettings, lambda m: None)):
        monkeypatch.setenv("AUTORESPONSE_METER__INTERVAL", "nan")
        with pytest.raises(ConfigError, match="^AUTORESPONSE_METER__INTERVAL is nan: should be a finite number$"):
            Settings.load()
        monkeypatch.delenv("AUTORESPONSE_METER__INTERVAL")
        monkeypatch.setenv("AUTORESPONSE_METER__LIMITS", "[1.5, Infinity]")
        with pytest.raises(ConfigError, match=r"^AUTORESPONSE_METER__LIMITS\[1\] is inf: should be a finite"):
            Settings.load()


def test_memory_needs_a_positive_token_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTORESPONSE_MEMORY__MAX_TOKENS", "0")
    with pytest.raises(ConfigError, match="^AUTORESPONSE_MEMORY__MAX_TOKENS is '0': should be greater than "
                                          "or equal to 1$"):
        Settings.load()


@pytest.mark.parametrize("url", ["http://127.0.0.1:11434/v1", "https://api.openai.com/v1",
                                 "http://[::1]:8080/v1", "https://user:pw@llm.example/v1"])
def test_the_llm_base_url_takes_http_urls_with_a_host(url: str) -> None:
    assert Settings.load(llm={"base_url": url}).llm.base_url == url


@pytest.mark.parametrize("blank", ["", "  "])
def test_an_empty_llm_base_url_is_the_offline_engine(monkeypatch: pytest.MonkeyPatch, blank: str) -> None:
    monkeypatch.setenv("AUTORESPONSE_LLM__BASE_URL", blank)
    assert Settings.load().llm.base_url is None


@pytest.mark.parametrize("url", ["not a url", "localhost:11434", "ftp://llm.example/v1", "http:///v1",
                                 "http://llm.example:99999/v1", "http://llm.example:port/v1",
                                 "http://llm example/v1", "http://u:hunter22@[::1"])
def test_the_llm_base_url_must_be_an_http_url_with_a_host(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    monkeypatch.setenv("AUTORESPONSE_LLM__BASE_URL", url)
    with pytest.raises(ConfigError) as caught:
        Settings.load()
    message = str(caught.value)
    assert message.startswith("AUTORESPONSE_LLM__BASE_URL is ")
    assert message.endswith(": should be an http:// or https:// URL with a host, e.g. http://127.0.0.1:11434/v1")
    assert "hunter22" not in message


@pytest.mark.parametrize("url", ["http://127.0.0.1:11434/v1?key=hunter22",
                                 "https://llm.example/openai?api-version=2024-06-01&api-key=hunter22",
                                 "http://llm.example/v1#hunter22", "http://llm.example/v1?"])
@pytest.mark.parametrize(("variable", "value"), [
    ("AUTORESPONSE_LLM__BASE_URL", "{}"),
    ("AUTORESPONSE_LLM__TRANSCRIBE_URL", "{}"),
    ("AUTORESPONSE_LLM__FALLBACKS", '[{{"base_url": "{}"}}]'),
], ids=["base_url", "transcribe_url", "fallbacks"])
def test_an_llm_url_with_a_query_or_fragment_is_refused_without_showing_it(
    monkeypatch: pytest.MonkeyPatch, url: str, variable: str, value: str
) -> None:
    # The API's path went after the query ("/v1?key=X/chat/completions": no call reached the
    # server), and the query, often a key, showed in the log, /status and config show.
    monkeypatch.setenv(variable, value.format(url))
    with pytest.raises(ConfigError) as caught:
        Settings.load()
    message = str(caught.value)
    assert message.startswith(variable)
    assert message.endswith("?...': should have no query or fragment (? or #): the API's path is added "
                            "to its end (a key goes in an api_key setting)")
    assert "hunter22" not in message and "api-version" not in message


def test_the_retry_pool_size_has_a_maximum(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each retry actor is a thread started before the daemon serves: 100000 never finished.
    monkeypatch.setenv("AUTORESPONSE_RETRY__POOL_SIZE", "64")
    assert Settings.load().retry.pool_size == 64
    monkeypatch.setenv("AUTORESPONSE_RETRY__POOL_SIZE", "100000")
    with pytest.raises(ConfigError) as caught:
        Settings.load()
    assert str(caught.value) == "AUTORESPONSE_RETRY__POOL_SIZE is '100000': should be less than or equal to 64"


def test_credentials_are_found_even_in_a_url_that_does_not_parse() -> None:
    # The Telegram base URL is not checked as a URL; its credentials are still secrets,
    # and finding them must not raise (urlsplit does, on an unclosed IPv6 bracket).
    settings = Settings.load(telegram={"base_url": "http://bot:hunter22@[::1/bot"})
    assert "hunter22" in settings.secrets()
    assert "bot:hunter22" in settings.secrets()


@pytest.mark.parametrize("blank", ["", " "])
def test_an_empty_path_is_refused_not_taken_as_the_current_directory(monkeypatch: pytest.MonkeyPatch,
                                                                     blank: str) -> None:
    monkeypatch.setenv("AUTORESPONSE_DATA_DIR", blank)
    with pytest.raises(ConfigError, match=f"^AUTORESPONSE_DATA_DIR is '{blank}': should be a path, not empty"):
        Settings.load()
    monkeypatch.delenv("AUTORESPONSE_DATA_DIR")
    monkeypatch.setenv("AUTORESPONSE_JOURNAL__PATH", blank)
    with pytest.raises(ConfigError, match="^AUTORESPONSE_JOURNAL__PATH is .*: should be a path, not empty"):
        Settings.load()


def test_a_directory_given_as_the_config_file_is_named_as_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=f"^the config file {tmp_path} is a directory; give a TOML file$"):
        Settings.load(tmp_path)


def test_a_directory_where_the_journal_goes_is_refused(tmp_path: Path) -> None:
    (tmp_path / "journal.sqlite3").mkdir()
    with pytest.raises(ConfigError, match=r"^the journal .*/journal\.sqlite3 cannot be used: it is a directory$"):
        Settings.load(data_dir=tmp_path).check_data_dir()
    (tmp_path / "j").mkdir()
    with pytest.raises(ConfigError, match=r"^the journal .*/j \(AUTORESPONSE_JOURNAL__PATH, \[journal\] path\) "
                                          r"cannot be used: it is a directory$"):
        Settings.load(data_dir=tmp_path, journal={"path": tmp_path / "j"}).check_data_dir()
    assert Settings.load(data_dir=tmp_path, journal={"enabled": False}).check_data_dir() == tmp_path


def test_spans_asked_for_without_the_trace_they_are_made_from_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match=r"otel\.enabled = true needs runtime\.trace = true"):
        Settings.load(otel={"enabled": True}, runtime={"trace": False})
    assert Settings.load(runtime={"trace": False}).runtime.trace is False  # off alone is fine
