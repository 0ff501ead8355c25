"""JSON values as PostgreSQL's jsonb gives them back.

jsonb keeps a number as `numeric`, so a float that Python writes in exponent form comes back as an integer:
1e16 is stored and read back as 10000000000000000. Anything hashed or compared before and after a save must
use this form, or a reloaded value looks changed (a frozen snapshot would look tampered with).
"""

from decimal import Decimal
from typing import Any


def as_stored(value: Any) -> Any:
    """The value as it reads back from jsonb: integral floats in exponent form become the integers they name."""
    if isinstance(value, float) and value.is_integer() and "e" in repr(value):
        # Through the decimal text, as PostgreSQL parses it: int(1.2345678901234567e19) would add binary noise.
        return int(Decimal(repr(value)))
    if isinstance(value, dict):
        return {key: as_stored(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [as_stored(item) for item in value]
    return value
