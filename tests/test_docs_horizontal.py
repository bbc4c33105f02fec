"""docs/horizontal.md: the server loop of the optimizer-wrapper path runs as written."""

import pathlib
import re
import warnings

import numpy as np
import pytest

from keras_fedpriv.optimizers import SignDSMessage, aggregate, flatten_update

pytestmark = [pytest.mark.jax]

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "horizontal.md"


def _server_loop_block():
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    matches = [b for b in blocks if "server_update" in b and "SignDSRounds" in b]
    assert len(matches) == 1, "docs/horizontal.md: expected one server-loop example"
    return matches[0]


def test_aggregate_is_documented_as_a_module_function():
    text = DOC.read_text()
    assert "keras_fedpriv.optimizers.aggregate(" in text
    assert "encoder.aggregate" not in text and "SignDSEncoder.aggregate" not in text


def test_signds_server_loop_example_runs():
    namespace = {}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="SignDS: k")  # small top-k set warning
        exec(_server_loop_block(), namespace)  # noqa: S102 - our own docs
    clients, server, magrr = namespace["clients"], namespace["server"], namespace["magrr"]
    messages, bits, lr = namespace["messages"], namespace["bits"], namespace["lr"]
    # The last round: one message and one bit per client, collected through on_message.
    assert len(messages) == len(bits) == len(clients) == 4
    assert all(isinstance(m, SignDSMessage) for m in messages)
    assert set(int(b) for b in bits) <= {0, 1}
    # Every client made one message per round (three rounds).
    assert all(len(m.optimizer.messages) == 3 for m in namespace["client_models"])
    # The server's step comes from MagRR and the update is exactly the aggregated messages.
    assert lr == magrr.last_lr_global and lr > 0
    np.testing.assert_allclose(flatten_update(server.trainable_variables)[0],
                               namespace["flat"] + aggregate(messages, global_lr=lr), rtol=0,
                               atol=0)
    # The clients' weights went back to the start of their round (the server's weights).
    start = namespace["flat"]
    for m in namespace["client_models"]:
        np.testing.assert_array_equal(flatten_update(m.trainable_variables)[0], start)
