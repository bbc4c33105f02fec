"""Pure randomizers (no Keras state): randomized response, quantize+RR, SignDS, Laplace,
clip+Gaussian, validation, RNG."""

from keras_fedpriv.mechanisms import signds
from keras_fedpriv.mechanisms.quantize import (
    quantize_keep_probability,
    quantize_realized_epsilon,
    quantize_rr,
    quantize_rr_dp_event,
    quantize_turn_on_probability,
)
from keras_fedpriv.mechanisms.events import repeat_event
from keras_fedpriv.mechanisms.gaussian import clip_by_l2_norm, gaussian_dp_event, gaussian_mechanism
from keras_fedpriv.mechanisms.laplace import laplace, laplace_dp_event, laplace_scale
from keras_fedpriv.mechanisms.random import draw_secret
from keras_fedpriv.mechanisms.randomized_response import (
    binary_randomized_response,
    flip_probability,
    kary_randomized_response,
    keep_probability,
    other_probability,
    randomized_response_dp_event,
    realized_epsilon,
    rr_with_prior,
    rr_with_prior_dp_event,
    rr_with_prior_k,
)
from keras_fedpriv.mechanisms.signds import optimal_output_dim, optimal_threshold, signds_dp_event
from keras_fedpriv.mechanisms.validation import validate_eps

__all__ = [
    "binary_randomized_response",
    "clip_by_l2_norm",
    "draw_secret",
    "flip_probability",
    "gaussian_dp_event",
    "gaussian_mechanism",
    "kary_randomized_response",
    "keep_probability",
    "laplace",
    "laplace_dp_event",
    "laplace_scale",
    "optimal_output_dim",
    "optimal_threshold",
    "other_probability",
    "quantize_keep_probability",
    "quantize_realized_epsilon",
    "quantize_rr",
    "quantize_rr_dp_event",
    "quantize_turn_on_probability",
    "randomized_response_dp_event",
    "realized_epsilon",
    "repeat_event",
    "rr_with_prior",
    "rr_with_prior_dp_event",
    "rr_with_prior_k",
    "signds",
    "signds_dp_event",
    "validate_eps",
]
