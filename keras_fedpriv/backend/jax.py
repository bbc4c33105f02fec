"""The JAX implementation of the backend interface (see `keras_fedpriv.backend`)."""

from __future__ import annotations

# Each section below is one part of the interface; keras_fedpriv/backend/tensorflow.py and
# keras_fedpriv/backend/jax.py define the same names in the same sections.

# == secret random stream and local state (layers/secret_rng.py, layers/release_counter.py) ==



# == end of secret random stream ==


# == input checks and graph helpers (layers/input_checks.py, the protection layers) ==



# == end of input checks ==


# == Philox and mechanisms (mechanisms/) ==



# == end of Philox ==


# == training steps (federated/: VerticalModel, LocalTrainer) ==

# -- horizontal: local training --

def local_training(model, batch_size, x_spec, y_spec, bn_variables):
    """A client's whole local training with a compiled Keras model (the contract:
    `keras_fedpriv.backend.tensorflow.local_training`).

    Here: one ``jax.jit``-compiled, stateless training step (Keras'
    ``StatelessScope`` around the forward pass and the loss,
    ``jax.value_and_grad``, ``optimizer.stateless_apply``) run over the
    mini-batches from the host; the model's whole state (weights,
    BatchNormalization statistics, random-generator states, optimizer) is
    carried through the steps and written back at the end (after an error too:
    random states and release counters never go back). A step is compiled
    once per batch shape: the full batch and each distinct short last batch.
    """
    import jax
    import keras
    import numpy as np

    del x_spec, y_spec  # every batch shape is compiled on first use
    opt = model.optimizer
    tv_refs = list(model.trainable_variables)
    if not opt.built:
        opt.build(tv_refs)
    ntv_refs = list(model.non_trainable_variables)
    opt_refs = list(opt.variables)
    opt_init = [np.array(v.numpy()) for v in opt_refs]
    bn_at = [next(i for i, r in enumerate(ntv_refs) if r is v) for v in bn_variables]

    def loss_and_state(tv, ntv, ov, xb, yb):
        mapping = list(zip(tv_refs, tv)) + list(zip(ntv_refs, ntv)) + list(zip(opt_refs, ov))
        with keras.StatelessScope(state_mapping=mapping, collect_losses=True) as scope:
            y_pred = model(xb, training=True)
            loss = model.compute_loss(x=xb, y=yb, y_pred=y_pred, training=True)
            # as Keras' train_step: a LossScaleOptimizer or a loss_scale_factor
            # scales the loss here and unscales in stateless_apply()
            scaled = opt.scale_loss(loss)
        return scaled, (loss, [scope.get_current_value(v) for v in ntv_refs])

    @jax.jit
    def step(state, xb, yb):
        tv, ntv, ov = state
        (_, (loss, ntv)), grads = jax.value_and_grad(loss_and_state, has_aux=True)(
            tv, ntv, ov, xb, yb)
        tv, ov = opt.stateless_apply(ov, grads, tv)
        return (tv, ntv, ov), loss.astype("float32")

    def train(global_weights, x, y, order, bn_start):
        ntv = [v.value for v in ntv_refs]
        for i, w in zip(bn_at, bn_start):
            ntv[i] = np.asarray(w, ntv_refs[i].dtype)
        state = ([np.asarray(w, v.dtype) for v, w in zip(tv_refs, global_weights)], ntv,
                 [np.asarray(o, v.dtype) for v, o in zip(opt_refs, opt_init)])
        n = len(x)
        starts = [(e * n + b, e * n + min(b + batch_size, n))
                  for e in range(len(order) // n) for b in range(0, n, batch_size)]
        losses = []
        try:
            for start, stop in starts:
                idx = order[start:stop]
                state, loss = step(state, x[idx], y[idx])
                losses.append(loss)
        finally:  # even after an error: random states and counters never go back
            for refs, values in zip((tv_refs, ntv_refs, opt_refs), state):
                for v, value in zip(refs, values):
                    v.assign(value)
        deltas = [np.asarray(v, np.float32) - np.asarray(w, np.float32)
                  for v, w in zip(state[0], global_weights)]
        total = float(np.sum(np.asarray(jax.device_get(losses), np.float32)))
        return deltas, total / max(len(starts), 1), [np.array(state[1][i]) for i in bn_at]

    return train




# == end of training steps ==
