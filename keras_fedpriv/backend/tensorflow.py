"""The TensorFlow implementation of the backend interface (see `keras_fedpriv.backend`)."""

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
    """A client's whole local training as one traced function of a compiled Keras model.

    The returned ``train(global_weights, x, y, order, bn_start)`` sets the
    trainable weights to ``global_weights`` and the BatchNormalization
    statistics ``bn_variables`` to ``bn_start``, resets the optimizer to the
    state it had when this was built, runs the mini-batches of ``batch_size`` rows of
    ``order`` (``len(order) // len(x)`` epochs, the last batch of each epoch
    short) and returns ``(deltas, mean loss, bn_end)``: the per-variable
    float32 updates, the mean of the steps' losses and the final statistics.
    The model keeps the trained state.

    Here: one ``tf.function`` with a dynamic batch dimension, traced once for
    every client and round (``x_spec``, ``y_spec``: ``(shape, dtype)`` of one
    example's features and label).
    """
    import numpy as np
    import tensorflow as tf

    opt = model.optimizer
    tv = list(model.trainable_variables)
    if not opt.built:
        opt.build(tv)
    opt_vars = list(opt.variables)
    opt_init = [np.array(v.numpy()) for v in opt_vars]
    bs = batch_size
    bn = list(bn_variables)
    signature = [
        [tf.TensorSpec(v.shape, v.dtype) for v in tv],
        tf.TensorSpec((None,) + tuple(x_spec[0]), tf.as_dtype(x_spec[1])),
        tf.TensorSpec((None,) + tuple(y_spec[0]), tf.as_dtype(y_spec[1])),
        tf.TensorSpec((None,), tf.int32),
        [tf.TensorSpec(v.shape, v.dtype) for v in bn],
    ]

    @tf.function(input_signature=signature)
    def local_train(global_weights, x, y, order, bn_start):
        for v, w in zip(tv, global_weights):
            v.assign(w)
        for v, w in zip(bn, bn_start):
            v.assign(w)
        for v, init in zip(opt_vars, opt_init):
            v.assign(tf.constant(init, dtype=v.dtype))
        n = tf.shape(x)[0]
        batches_per_epoch = (n + bs - 1) // bs
        steps = (tf.shape(order)[0] // n) * batches_per_epoch
        total = tf.constant(0.0, tf.float32)
        for step in tf.range(steps):
            epoch = step // batches_per_epoch
            b = step % batches_per_epoch
            start = epoch * n + b * bs
            stop = epoch * n + tf.minimum((b + 1) * bs, n)
            idx = order[start:stop]
            xb = tf.gather(x, idx)
            yb = tf.gather(y, idx)
            with tf.GradientTape() as tape:
                y_pred = model(xb, training=True)
                loss = model.compute_loss(x=xb, y=yb, y_pred=y_pred, training=True)
                # as Keras' train_step: a LossScaleOptimizer (mixed_float16) or a
                # loss_scale_factor scales the loss here and unscales in apply()
                scaled = opt.scale_loss(loss)
            grads = tape.gradient(scaled, tv)
            opt.apply(grads, tv)
            total += tf.cast(loss, tf.float32)
        deltas = [tf.cast(v, tf.float32) - tf.cast(w, tf.float32)
                  for v, w in zip(tv, global_weights)]
        bn_end = [tf.identity(v) for v in bn]
        return deltas, total / tf.cast(tf.maximum(steps, 1), tf.float32), bn_end

    def train(global_weights, x, y, order, bn_start):
        deltas, loss, bn_end = local_train(list(global_weights), x, y, order, list(bn_start))
        return [d.numpy() for d in deltas], float(loss), [np.array(b) for b in bn_end]

    return train




# == end of training steps ==
