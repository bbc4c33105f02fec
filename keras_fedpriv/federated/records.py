"""Named numpy arrays in a Flower ``ArrayRecord``, and back, checked before use (needs Flower).

What both protocols' messages carry over Flower: the horizontal wire
(`keras_fedpriv.federated.horizontal.wire`) and the vertical Flower adapter
(`keras_fedpriv.federated.flower.vertical`) build their records with
`arrays_record` and read received ones with `checked_arrays`, which refuses
a record of the wrong type, kind or size before anything in it is
deserialized.

Example:
    >>> import numpy as np
    >>> record = arrays_record({"w": np.zeros(3, np.float32)})
    >>> checked_arrays(record, "upload", max_bytes=1000)["w"].shape
    (3,)
"""

from __future__ import annotations

from typing import Any

import numpy as np

try:
    from flwr.app import Array, ArrayRecord
except ImportError as err:  # pragma: no cover - depends on the installed extras
    raise ImportError("keras_fedpriv.federated.records needs Flower (the `flower` extra: "
                      "pip install -e \".[flower]\").") from err

from keras_fedpriv.federated.malformed import MalformedMessage

__all__ = ["arrays_record", "checked_arrays"]


def arrays_record(arrays: dict[str, np.ndarray]) -> ArrayRecord:
    """Named numpy arrays as a Flower ArrayRecord.

    Example:
        >>> arrays_record({"ids": np.arange(4)})["ids"].numpy().tolist()
        [0, 1, 2, 3]
    """
    return ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in arrays.items()})


def checked_arrays(record: Any, what: str, max_bytes: int) -> dict[str, np.ndarray]:
    """A received ArrayRecord's arrays, checked before anything is deserialized.

    Args:
        record: what arrived under the record name ``what``.
        what: the record's name, for the message.
        max_bytes: the most bytes the protocol sends in this record.

    Returns:
        Array name -> numpy array.

    Raises:
        MalformedMessage: ``record`` is not an ArrayRecord, holds something
            other than numpy arrays, or more than ``max_bytes`` bytes.

    Example:
        >>> checked_arrays(arrays_record({"a": np.ones(2)}), "upload", 100)["a"].tolist()
        [1.0, 1.0]
    """
    if not isinstance(record, ArrayRecord):
        raise MalformedMessage(f"{what!r} must be an ArrayRecord; got {type(record).__name__}.")
    total = 0
    for key, array in record.items():
        if getattr(array, "stype", None) != "numpy.ndarray":
            raise MalformedMessage(f"{what!r} array {key!r} is not a numpy array.")
        total += len(array.data)
        if total > max_bytes:
            raise MalformedMessage(f"{what!r} holds more than the {max_bytes} bytes the protocol "
                                  "sends.")
    return {str(k): a.numpy() for k, a in record.items()}
