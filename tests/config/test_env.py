"""Typed environment readers: defaults for unset or blank values, a clear error for a malformed one."""

import pytest
from django.core.exceptions import ImproperlyConfigured

from config.env import env_bool, env_float, env_int, env_json


@pytest.mark.parametrize(
    ("reader", "raw", "expected"),
    [(env_int, "42", 42), (env_float, "0.25", 0.25), (env_json, '{"a": [1]}', {"a": [1]}), (env_bool, "yes", True)],
)
def test_readers_parse_their_type(monkeypatch, reader, raw, expected):
    monkeypatch.setenv("SOME_SETTING", raw)
    assert reader("SOME_SETTING", None) == expected


@pytest.mark.parametrize("reader", [env_int, env_float, env_json])
def test_unset_or_blank_gives_the_default(monkeypatch, reader):
    monkeypatch.delenv("SOME_SETTING", raising=False)
    assert reader("SOME_SETTING", "default") == "default"
    monkeypatch.setenv("SOME_SETTING", "  ")
    assert reader("SOME_SETTING", "default") == "default"


@pytest.mark.parametrize(
    ("reader", "kind"), [(env_int, "an integer"), (env_float, "a number"), (env_json, "JSON"), (env_bool, "a boolean")]
)
def test_malformed_values_name_the_setting(monkeypatch, reader, kind):
    monkeypatch.setenv("SOME_SETTING", "{not")
    with pytest.raises(ImproperlyConfigured, match=f"SOME_SETTING must be {kind}"):
        reader("SOME_SETTING", None)
