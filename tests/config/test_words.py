"""Counts, amounts and names as a person writes them (config/words.py)."""

from decimal import Decimal

import pytest

from config.words import amount, counted, joined_without_repeat, listed


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((1, "device"), "1 device"),
        ((2, "device"), "2 devices"),
        ((0, "request"), "0 requests"),
        ((3, "replica", "replicas"), "3 replicas"),
    ],
)
def test_counted(args, expected):
    assert counted(*args) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [(Decimal("8.00"), "8"), (Decimal("0.1429"), "0.14"), (14.858, "14.86"), (12000, "12000"), (Decimal("2.5"), "2.5")],
)
def test_amount(value, expected):
    assert amount(value) == expected


def test_listed():
    assert [listed([]), listed(["A"]), listed(["A", "B"]), listed(["A", "B", "C"], "or")] == [
        "",
        "A",
        "A and B",
        "A, B or C",
    ]


@pytest.mark.parametrize(
    ("first", "second", "expected"),
    [
        ("Huawei Ascend", "Ascend 910B 64GB", "Huawei Ascend 910B 64GB"),
        ("Intel Gaudi", "Gaudi 2 96GB", "Intel Gaudi 2 96GB"),
        ("NVIDIA", "H100 80GB SXM", "NVIDIA H100 80GB SXM"),
        ("Llama 3.1 8B Instruct", "3.1", "Llama 3.1 8B Instruct"),
        ("Mistral 7B Instruct", "0.3", "Mistral 7B Instruct 0.3"),
    ],
)
def test_joined_without_repeat(first, second, expected):
    assert joined_without_repeat(first, second) == expected
