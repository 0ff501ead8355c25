"""Counts, amounts and names as a person writes them, for pages, mails and the timeline: "1 device", "2 devices",
"14.86" rather than "14.858", "Huawei Ascend 910B" rather than "Huawei Ascend Ascend 910B". Identifiers (slugs,
usernames, codes) stay in URLs, the API and the data; what a person reads goes through here."""

from decimal import ROUND_HALF_UP, Decimal


def counted(number: int, noun: str, plural: str | None = None) -> str:
    """'1 device', '3 devices', '0 requests' (an irregular plural is given: counted(2, 'replica'))."""
    return f"{number} {noun if number == 1 else plural or noun + 's'}"


def amount(value, places: int = 2) -> str:
    """A quantity rounded to at most `places` decimals, without trailing zeros: 8.00 -> '8', 0.1429 -> '0.14',
    14.858 -> '14.86'."""
    number = Decimal(str(value)).quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP)
    text = f"{number:f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def listed(items: list[str], conjunction: str = "and") -> str:
    """'A', 'A and B', 'A, B and C'."""
    items = [item for item in items if item]
    if len(items) < 3:
        return f" {conjunction} ".join(items)
    return f"{', '.join(items[:-1])} {conjunction} {items[-1]}"


def joined_without_repeat(first: str, second: str) -> str:
    """The two names one after the other, the words that end the first and start the second said once:
    ('Huawei Ascend', 'Ascend 910B 64GB') -> 'Huawei Ascend 910B 64GB'; ('Llama 3.1 8B', '3.1') -> 'Llama 3.1 8B'
    when the second is within the first already."""
    if not second or second in first.split():
        return first
    head, tail = first.split(), second.split()
    for overlap in range(min(len(head), len(tail)), 0, -1):
        if [word.casefold() for word in head[-overlap:]] == [word.casefold() for word in tail[:overlap]]:
            return " ".join([*head, *tail[overlap:]])
    return f"{first} {second}"
