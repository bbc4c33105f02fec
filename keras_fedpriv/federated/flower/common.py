"""What the Flower apps share: message sizes, records, error lines, waiting for nodes.

Helpers of the Flower apps (`keras_fedpriv.federated.flower` and the vertical
adapter), public so that no module reaches into another's private names.
"""

from __future__ import annotations

import inspect
import logging
import re
import time
from typing import Any, Callable, Mapping

from flwr.app import Context, Message
from flwr.serverapp import Grid

from keras_fedpriv.privacy.budget import PrivacyBudget

__all__ = ["RENAMED", "call_with_context", "check_renamed", "first_line", "message_nbytes",
           "party_budget", "wait_for_nodes"]

logger = logging.getLogger("keras_fedpriv.flower")


#: former argument names -> the current ones
RENAMED = {"magrr_eps": "eps_rr"}


def check_renamed(renamed: Mapping[str, Any], where: str) -> None:
    """Refuse keyword arguments that were renamed (or never existed), naming the new name.

    Args:
        renamed: the ``**kwargs`` a function received beyond its own arguments.
        where: the function's name, for the message.

    Returns:
        None.

    Raises:
        TypeError: any key is given.
    """
    for name in renamed:
        if name in RENAMED:
            raise TypeError(f"{where}() takes `{RENAMED[name]}` now; `{name}` was renamed "
                            f"(pass {RENAMED[name]}=...).")
        raise TypeError(f"{where}() got an unexpected keyword argument {name!r}.")


def message_nbytes(message: Message) -> int:
    """The size of a Flower message as Flower serializes it (protobuf bytes).

    What Flower sends for the message, content and metadata, before the
    transport's own framing (HTTP/gRPC headers, TLS).
    """
    from flwr.common.serde import message_to_proto

    return len(message_to_proto(message).SerializeToString())


def call_with_context(fn: Callable[..., Any], *args: Any, context: Context) -> Any:
    """``fn(*args, context=context)`` if ``fn`` declares ``context``, else ``fn(*args)``."""
    try:
        takes = "context" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
        takes = False
    return fn(*args, context=context) if takes else fn(*args)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def first_line(reason: Any) -> str:
    """An error reply's own message, one line: a client's traceback is its own business."""
    text = _ANSI.sub("", str(reason))
    # a ClientApp exception, as the engine wraps it
    match = re.search(r"occurred\. Message: *\n?(.+)", text)
    line = match.group(1) if match else (text.strip().splitlines() or [""])[0]
    return line.strip()[:200]


def wait_for_nodes(grid: Grid, count: int, timeout: float, what: str = "clients",
                    required: Mapping[int, str] | None = None) -> list[int]:
    """The connected node ids once ``count`` are, and every node of ``required`` (node id ->
    what it is, for the message) is too (`TimeoutError` after ``timeout``)."""
    required = dict(required or {})
    deadline = time.monotonic() + timeout
    while True:
        nodes = sorted(grid.get_node_ids())
        absent = sorted(set(required) - set(nodes))
        if len(nodes) >= count and not absent:
            return nodes
        if time.monotonic() > deadline:
            if absent:
                raise TimeoutError("; ".join(f"pinned node {n} ({required[n]}) is not connected"
                                             for n in absent)
                                   + f" (connected: {nodes}) after {timeout:g} s.")
            raise TimeoutError(f"only {len(nodes)} of the {count} {what} needed connected "
                               f"within {timeout:g} s.")
        time.sleep(0.5)


def party_budget(context: Context, max_epsilon: float | None, delta: float,
            path: str | Callable[[Context], str] | None,
            per_record: bool = False) -> PrivacyBudget | None:
    """A party's `PrivacyBudget` from its own code and its operator's node config.

    The node config's ``max-epsilon`` and the code's ``max_epsilon``: the smaller counts;
    the node config's ``privacy-budget-path`` before the code's ``path``.
    """
    caps = [c for c in (max_epsilon, context.node_config.get("max-epsilon")) if c is not None]
    if not caps:
        return None
    where = context.node_config.get("privacy-budget-path")
    if where is None:
        where = path(context) if callable(path) else path
    return PrivacyBudget(min(float(c) for c in caps), delta,
                         path=str(where) if where else None, per_record=per_record)

