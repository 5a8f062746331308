"""Training steps in the timeline (TNT_TIMELINE, see docs/performance.md).

libtnt records communication by itself; what it cannot see is where a
training step begins and ends. When the timeline is on, fit() adds
StepSpans to the callbacks, which marks each training step as a span
"step N" (category "step") on the thread that runs fit, so that a viewer
shows each bucket's allreduce against the step it belongs to.
"""
import keras

from tarantella import _core


def enabled():
    """True while this process writes a timeline."""
    return _core.is_initialized() and _core.timeline_enabled()


class StepSpans(keras.callbacks.Callback):
    """Marks every training batch as a span "step N" (N counts every step
    of the process, across fit calls)."""

    steps = 0  # of the process, so that names stay unique across fits

    def __init__(self):
        super().__init__()
        self._open = None

    def on_train_batch_begin(self, batch, logs=None):
        self._open = f"step {StepSpans.steps}"
        StepSpans.steps += 1
        _core.timeline_begin(self._open, "step")

    def on_train_batch_end(self, batch, logs=None):
        if self._open is not None:
            _core.timeline_end(self._open, "step")
            self._open = None


def with_step_spans(callbacks):
    """`callbacks` (a list) with StepSpans added when the timeline is on."""
    if enabled():
        callbacks = list(callbacks) + [StepSpans()]
    return callbacks
