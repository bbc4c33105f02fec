"""What the Flower tests share: the seeded test app's model, a stand-in reply, the
Simulation Engine's worker settings, a stand-in SuperLink that serves a real ClientApp in this
process (`AppGrid`), and the comparison of a vertical run on Flower with the in-process one."""

import pathlib
import sys

APP = pathlib.Path(__file__).resolve().parent / "flower_app"

# The Simulation Engine's backend_config: one Ray worker process per simulation (each more one
# imports TensorFlow and the package again: about 8 CPU-s a run on 2 cores), whatever the
# machine's cores; TWO_WORKERS, for a run that must match the in-process run while a node's
# messages move between processes.
ONE_WORKER = {"init_args": {"num_cpus": 1}, "client_resources": {"num_cpus": 1, "num_gpus": 0.0}}
TWO_WORKERS = {"init_args": {"num_cpus": 2}, "client_resources": {"num_cpus": 1, "num_gpus": 0.0}}


def load_test_app():
    """The seeded Deployment Engine test app's module (``tests/flower_app/kfp_test_app``)."""
    sys.path.insert(0, str(APP))
    try:
        from kfp_test_app import apps
    finally:
        sys.path.remove(str(APP))
    return apps


def model_fn():
    """The test app's model (the same initial weights everywhere)."""
    return load_test_app().model_fn()


class Reply:
    """A stand-in for a received Flower ``Message``: content, sender, an error reason or None."""

    def __init__(self, content, node=1, error=None):
        self.content = content

        class _Meta:
            src_node_id = node

        self.metadata = _Meta()
        self._error = error

    def has_error(self):
        return self._error not in (None, False)

    @property
    def error(self):
        class _Error:
            reason = self._error

        return _Error()


class AppGrid:
    """A stand-in for the SuperLink that serves a real ``ClientApp`` in this process.

    Node ``i`` (id ``NODE0 + i``) has its own `flwr.app.Context` (its node config, a node
    state kept between messages, as a SuperNode keeps it); ``send_and_receive`` gives each
    message an id (as Flower's Grid does when it pushes one) and answers it with the
    ClientApp's reply. With ``workers`` > 1, each call goes to the next of that many stand-in
    worker processes (what the apps cached for the run in this process is swapped for that
    worker's), as the Simulation Engine hands a node's messages to whichever worker is free:
    a worker's copy of a party is then behind the node state. A ServerApp runs on it
    in-process: ``server_app(grid, grid.context())`` (inside a run: the ``in_a_run``
    fixture). Used as a context manager, it drops what the apps cached for its run at the end.
    """

    NODE0 = 100

    def __init__(self, client_app, node_configs, run_id=4242, workers=1):
        from flwr.app import Context, RecordDict

        self.app, self.run_id, self.workers = client_app, run_id, workers
        self.nodes = {self.NODE0 + i: Context(run_id=run_id, node_id=self.NODE0 + i,
                                              node_config=dict(config), state=RecordDict(),
                                              run_config={})
                      for i, config in enumerate(node_configs)}
        self.calls = 0
        self._held = {}  # worker -> what it cached for the run, while another one serves

    def context(self, run_config=None):
        """The ServerApp's context."""
        from flwr.app import Context, RecordDict

        return Context(run_id=self.run_id, node_id=0, node_config={}, state=RecordDict(),
                       run_config=dict(run_config or {}))

    def get_node_ids(self):
        return sorted(self.nodes)

    @staticmethod
    def _app_caches():
        from keras_fedpriv.federated.flower.horizontal import _caches
        from keras_fedpriv.federated.flower.vertical import _followers

        return (*_caches(), _followers())

    def _take(self):
        """Remove what the apps cached for the run; a list, one dict per cache."""
        return [{k: cache.pop(k) for k in [k for k in cache if k[0] == self.run_id]}
                for cache in self._app_caches()]

    def send_and_receive(self, messages, timeout=None):
        import uuid

        if self.workers > 1:  # the previous worker's objects go; this call's worker's come
            self._held[(self.calls - 1) % self.workers] = self._take()
            for cache, held in zip(self._app_caches(),
                                   self._held.pop(self.calls % self.workers, ())):
                cache.update(held)
        self.calls += 1
        replies = []
        for message in messages:
            message.metadata.__dict__["_message_id"] = uuid.uuid4().hex
            replies.append(self.app(message, self.nodes[message.metadata.dst_node_id]))
        return replies

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._take()
        self._held.clear()


def follower_arrays(follower):
    """A vertical follower's trainable weights, then its release totals (numpy arrays)."""
    return ([v.numpy() for v in follower.trainable_variables]
            + [follower.protection.release_totals.numpy()])


#: The history keys a vertical run on Flower and the in-process run must agree on.
VERTICAL_KEYS = ("loss", "val_loss", "val_auc", "steps", "skipped", "bytes_up", "bytes_down")


def assert_same_vertical_model(flower, local, parties, followers, keys=VERTICAL_KEYS):
    """The vertical run on Flower (``flower``: its `VerticalRunResult`; ``followers``: party ->
    `follower_arrays` of its follower at the end) trained what the in-process run did
    (``local``, its ``parties``), within a tolerance; each follower counted the same releases."""
    import numpy as np

    from keras_fedpriv.layers.release_counter import SLOTS

    # two runtimes, maybe two processes: a tolerance, never exact equality
    for a, b in zip(flower.leader.trainable_variables, local.leader.trainable_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)
    assert sorted(followers) == sorted(parties.followers)
    for p, follower in parties.followers.items():
        arrays = followers[p]
        assert len(arrays) == len(follower.trainable_variables) + 1
        for a, v in zip(arrays[:-1], follower.trainable_variables):
            np.testing.assert_allclose(a, v.numpy(), rtol=1e-5, atol=1e-6)
        # each follower recorded its own releases, the same count in both runtimes (every
        # slot but the lineage: a random id each layer draws when it is built)
        counts = [i for i, slot in enumerate(SLOTS) if slot != "lineage"]
        np.testing.assert_array_equal(arrays[-1][counts],
                                      follower.protection.release_totals.numpy()[counts])
    for key in keys:
        np.testing.assert_allclose(flower.history[key], local.history[key], rtol=1e-5,
                                   err_msg=key)


# ------------------------------------------- the seeded SignDS + MagRR + Laplace horizontal run
def signds_upload():
    """The seeded SignDS upload scheme of the horizontal runs (k 0.2, eps 10)."""
    from keras_fedpriv.optimizers import SignDSEncoder

    return SignDSEncoder(k=0.2, eps=10.0, seed=5)


def laplace_eval(rows):
    """The seeded Laplace evaluation of a client holding ``rows`` rows (the server's bound)."""
    from keras_fedpriv.callbacks import LaplaceEvaluation

    return LaplaceEvaluation(eps=2.0, from_logits=True, seed=7, max_report_rows=rows)


def signds_apps(clients, rows, out, **server):
    """The horizontal ClientApp and ServerApp (``server``: its run settings) of a seeded
    SignDS run with MagRR (eps_rr 3) and Laplace evaluation of ``rows`` rows a client, on the
    test app's model; the client with partition id i holds ``clients[i]``; the server leaves
    its `FlowerRunResult` in ``out["result"]``."""
    from keras_fedpriv.callbacks import MagRR
    from keras_fedpriv.federated.flower import horizontal_client_app, horizontal_server_app

    client = horizontal_client_app(model_fn, lambda ctx: clients[ctx.node_config["partition-id"]],
                                   signds_upload, seed=1, eps_rr=3.0,
                                   laplace_eval_fn=lambda context: laplace_eval(rows))
    server_app = horizontal_server_app(model_fn, signds_upload, seed=1,
                                       magrr=MagRR(eps_rr=3.0, seed=1),
                                       laplace_eval=laplace_eval(rows),
                                       on_finish=lambda r: out.update(result=r), **server)
    return client, server_app


def assert_same_horizontal_run(result, clients, rows, **fit):
    """The `FlowerRunResult` of `signds_apps` is what `HorizontalFL` gives in one process with
    the same settings (``fit``: rounds, clients per round, local epochs, validation data),
    within a tolerance; the server's ledger counts what the in-process run counts. Returns
    the in-process run's History."""
    import numpy as np
    import pytest

    from keras_fedpriv.callbacks import MagRR
    from keras_fedpriv.federated import HorizontalFL
    from keras_fedpriv.privacy import privacy_report

    model = model_fn()
    fl = HorizontalFL(model, clients, upload=signds_upload(), seed=1)
    hist = fl.fit(verbose=0, callbacks=[MagRR(eps_rr=3.0, seed=1), laplace_eval(rows)], **fit)
    # the same arithmetic on both paths; a tolerance, not equality, across processes
    for a, b in zip(model.get_weights(), result.model.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-6)
    assert not np.allclose(model.get_weights()[0], model_fn().get_weights()[0])
    np.testing.assert_allclose(result.history["global_lr"], hist.history["global_lr"])
    np.testing.assert_allclose(result.history["r_est"], hist.history["r_est"])
    # the clients' Laplace-noised outputs, scored by the server: the same on both paths
    for key in ("laplace_silhouette", "laplace_davies_bouldin"):
        if key in hist.history:
            np.testing.assert_allclose(result.history[key], hist.history[key], rtol=1e-6)
    assert any(k.startswith("laplace_") for k in result.history)
    # the server's ledger counts what it received; it agrees with the clients' own records
    # in the in-process run (SignDS + MagRR per participation, the Laplace rows)
    server_eps = privacy_report(result, delta=1e-5).epsilon
    assert server_eps == pytest.approx(privacy_report(fl, delta=1e-5).epsilon, rel=1e-9)
    assert np.isfinite(server_eps)
    return hist
