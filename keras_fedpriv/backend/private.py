"""Every Keras or TensorFlow private API the package reaches, in one place.

A Keras or TensorFlow upgrade that moves one of these breaks this file only
(and `tests/test_house.py` fails if any other module reaches ``keras.src``,
``tensorflow.python`` or a private attribute of a Keras object).
"""

from __future__ import annotations

from typing import Any, Iterable

__all__ = ["compile_loss", "compute_output_spec", "flatten_layers", "in_stateless_scope",
           "keep_call_arguments_out",
           "loss_tracker", "model_compile_loss", "seed_generator_class",
           "resource_variable_class", "unscale_loss_for_distribution"]


def keep_call_arguments_out(error: BaseException) -> None:
    """Mark ``error`` so that Keras does not append the layer's call arguments to its
    message ("Arguments received by ..."): keras/src/utils/traceback_utils.py skips errors
    that carry this attribute ("only inject info for the innermost failing call")."""
    error._keras_call_info_injected = True


def flatten_layers(layer: Any, include_self: bool = True) -> Iterable[Any]:
    """``layer`` and all its sublayers, recursively (Keras' ``Layer._flatten_layers``)."""
    return layer._flatten_layers(include_self=include_self, recursive=True)


def compute_output_spec(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Keras' symbolic shape inference of ``fn(*args)`` (``keras.src.backend``)."""
    from keras.src import backend as keras_backend

    return keras_backend.compute_output_spec(fn, *args, **kwargs)


def compile_loss(loss: Any) -> Any:
    """Keras' ``CompileLoss`` for ``loss`` (what ``model.compile(loss=...)`` builds)."""
    from keras.src.trainers.compile_utils import CompileLoss

    return CompileLoss(loss)


def unscale_loss_for_distribution(value: Any) -> Any:
    """The loss unscaling Keras' own ``train_step`` applies under ``tf.distribute``
    before updating the loss tracker (no public equivalent in Keras 3.15)."""
    from keras.src.losses import loss as keras_loss_module

    return keras_loss_module.unscale_loss_for_distribution(value)


def model_compile_loss(model: Any) -> Any:
    """The compiled loss of ``model`` (``Model._compile_loss``)."""
    return model._compile_loss


def loss_tracker(model: Any) -> Any:
    """The mean metric ``model.fit`` reports as ``loss`` (``Model._loss_tracker``)."""
    return model._loss_tracker


def resource_variable_class() -> type:
    """TensorFlow's ``ResourceVariable`` (to subclass a variable that is no Keras weight)."""
    from tensorflow.python.ops import resource_variable_ops

    return resource_variable_ops.ResourceVariable


def in_stateless_scope() -> bool:
    """Whether Keras runs a stateless call now (variables are read from and written to a
    ``StatelessScope``, as inside JAX's compiled ``fit``)."""
    from keras.src.backend.common.stateless_scope import in_stateless_scope as inside

    return inside()


def seed_generator_class() -> type:
    """Keras' ``SeedGenerator``: a layer tracks an attribute of this type as random state,
    carried through JAX's functional ``fit`` but never among the layer's weights."""
    import keras

    return keras.random.SeedGenerator


# -- vertical (federated/vertical/) --

def model_compute_loss(model: Any, **kwargs: Any) -> Any:
    """``model.compute_loss(**kwargs)`` the way Keras' own steps call it
    (``Trainer._compute_loss``: with ``training`` only where ``compute_loss`` takes it)."""
    return model._compute_loss(**kwargs)


def own_losses(layer: Any) -> list[Any]:
    """The losses ``layer`` added itself (``add_loss``), not its sublayers'
    (``Layer._get_own_losses``)."""
    return layer._get_own_losses()


def inputs_struct(model: Any) -> Any:
    """A functional model's nested input structure (``Functional._inputs_struct``), or None."""
    return getattr(model, "_inputs_struct", None)


def build_shapes(layer: Any) -> dict[str, Any]:
    """The shapes a layer was built with (``Layer._build_shapes_dict``), or an empty dict."""
    return getattr(layer, "_build_shapes_dict", None) or {}


def reattach_jax_state(model: Any, state: Any) -> None:
    """Give a model's variables the values of a JAX step ``state`` back, and mark them synced.

    During JAX's ``fit``/``evaluate``/``predict`` Keras takes the values out of the model's
    variables (``_purge_model_variables``) and puts them back only from the state of a step
    that returned: a step that raises (a refusal while tracing, an invalid input found on the
    host) would leave variables without values. ``state`` is the step's state: trainable and
    non-trainable values, then optimizer (``fit`` only) and metrics values (not ``predict``).
    ``_jax_state_synced`` keeps Keras from overwriting them with an earlier step's state.
    """
    groups = [model.trainable_variables, model.non_trainable_variables]
    if len(state) == 4:
        groups.append(model.optimizer.variables)
    if len(state) >= 3:
        groups.append(model.metrics_variables)
    for variables, values in zip(groups, state):
        for variable, value in zip(variables, values):
            variable.assign(value)
    model._jax_state_synced = True
