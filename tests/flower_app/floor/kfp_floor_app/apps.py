"""Flower's floor: a ClientApp that answers at once and a ServerApp that only exchanges messages.

Same deployment, same number of nodes and rounds as the horizontal test app, no model: a round
of this app is what Flower itself costs (process start, polling, transport).
"""

import json
import pathlib
import time

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

client = ClientApp()


@client.query()
@client.train()
def answer(msg: Message, context: Context) -> Message:
    return Message(RecordDict({"config": ConfigRecord({"ok": 1})}), reply_to=msg)


server = ServerApp()


@server.main()
def main(grid: Grid, context: Context) -> None:
    rounds = int(context.run_config["num-server-rounds"])
    nodes, deadline = [], time.monotonic() + 300
    while len(nodes) < int(context.run_config["clients-per-round"]):
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {len(nodes)} nodes connected")
        time.sleep(0.2)
        nodes = list(grid.get_node_ids())
    times = []
    for kind in ["query"] + ["train"] * rounds:  # what the horizontal server sends
        started = time.perf_counter()
        replies = grid.send_and_receive(
            [Message(RecordDict({"config": ConfigRecord({})}), dst_node_id=n, message_type=kind)
             for n in nodes], timeout=300)
        assert not any(r.has_error() for r in replies)
        times.append(time.perf_counter() - started)
    folder = context.run_config.get("result-path", "")
    if folder:
        path = pathlib.Path(str(folder))
        path.mkdir(parents=True, exist_ok=True)
        (path / "history.json").write_text(json.dumps({"history": {"round_time_s": times[1:]}}))
