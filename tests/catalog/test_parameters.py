"""Order parameters against a service's declared schema (issue 12 item 4): keys, types, ranges, sizes."""

import json

import pytest

from catalog.parameters import (
    MAX_KEYS,
    ParameterInvalid,
    default_parameter_schema,
    parameters_clean,
    schema_problems,
    serving_parameter_schema,
)

SCHEMA = [
    {"name": "batch_size", "type": "int", "min": 1, "max": 65536},
    {"name": "learning_rate", "type": "number", "min": 0, "max": 1},
    {"name": "scale", "type": "number"},
    {"name": "note", "type": "string", "max_length": 20},
    {"name": "jupyter", "type": "bool", "default": True},
    {"name": "environment", "type": "enum", "choices": ["development", "production"], "default": "development"},
    {"name": "team", "type": "string", "required": True},
]


def refusal(parameters, schema=SCHEMA) -> ParameterInvalid:
    with pytest.raises(ParameterInvalid) as raised:
        parameters_clean(schema, parameters)
    assert raised.value.status_code == 422
    return raised.value


def test_valid_parameters_come_back_cleaned_with_defaults_and_as_jsonb_reads_them():
    cleaned = parameters_clean(
        SCHEMA, {"batch_size": 512.0, "learning_rate": 0.001, "scale": 1e16, "note": "ok", "team": "vision"}
    )
    assert cleaned == {
        "batch_size": 512,
        "learning_rate": 0.001,
        "scale": 10**16,
        "note": "ok",
        "jupyter": True,
        "environment": "development",
        "team": "vision",
    }
    assert type(cleaned["batch_size"]) is int and type(cleaned["scale"]) is int
    assert json.loads(json.dumps(cleaned)) == cleaned


@pytest.mark.parametrize(
    ("parameters", "code", "details"),
    [
        ({"batch_size": 1e16}, "parameter_invalid", {"parameter": "batch_size", "rule": "max", "maximum": 65536}),
        ({"batch_size": 0}, "parameter_invalid", {"parameter": "batch_size", "rule": "min", "minimum": 1}),
        ({"batch_size": 2.5}, "parameter_invalid", {"parameter": "batch_size", "rule": "type"}),
        ({"batch_size": "512"}, "parameter_invalid", {"parameter": "batch_size", "rule": "type"}),
        ({"batch_size": True}, "parameter_invalid", {"parameter": "batch_size", "rule": "type"}),
        ({"batch_size": 10**5000}, "parameter_invalid", {"parameter": "batch_size", "rule": "max", "maximum": 65536}),
        ({"learning_rate": float("nan")}, "parameter_invalid", {"parameter": "learning_rate", "rule": "type"}),
        ({"scale": float("inf")}, "parameter_invalid", {"parameter": "scale", "rule": "type"}),
        (
            {"note": "x" * 200_000},
            "parameter_invalid",
            {"parameter": "note", "rule": "max_length", "maximum": 20, "given": 200_000},
        ),
        ({"note": "a\x00b"}, "parameter_invalid", {"parameter": "note", "rule": "characters"}),
        ({"jupyter": "yes"}, "parameter_invalid", {"parameter": "jupyter", "rule": "type"}),
        (
            {"environment": "staging"},
            "parameter_invalid",
            {"parameter": "environment", "rule": "type", "choices": ["development", "production"]},
        ),
        ({}, "parameter_invalid", {"parameter": "team", "rule": "required"}),
    ],
)
def test_each_rule_is_refused_naming_the_key_and_the_rule(parameters, code, details):
    refused = refusal({"team": "vision", **parameters} if parameters else parameters)
    assert refused.code == code
    assert refused.details == {"field": "parameters", **details}
    json.dumps(refused.details, allow_nan=False)  # what the API renders: finite numbers only


def test_unknown_keys_are_refused_with_the_allowed_ones():
    refused = refusal({"team": "vision", "batch": 1e16})
    assert (refused.code, refused.details["parameter"], refused.details["rule"]) == (
        "parameter_unknown",
        "batch",
        "unknown",
    )
    assert refused.details["allowed"] == [entry["name"] for entry in SCHEMA]


def test_a_huge_key_is_refused_without_being_echoed_whole():
    refused = refusal({"k" * 10_000: 1})
    assert refused.code == "parameter_unknown"
    assert len(refused.details["parameter"]) <= 65 and len(refused.message) < 300


def test_too_many_keys_are_refused_before_anything_else():
    refused = refusal({f"key{number}": 1 for number in range(5000)})
    assert refused.code == "parameters_too_large"
    assert refused.details == {"field": "parameters", "rule": "max_keys", "maximum": MAX_KEYS, "given": 5000}


def test_the_shipped_schemas_are_valid():
    assert schema_problems(default_parameter_schema()) == []
    assert schema_problems(serving_parameter_schema()) == []
