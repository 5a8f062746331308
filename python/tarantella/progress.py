"""Progress reports to the launcher.

``tarantella --max-restarts N`` starts a failed job again only when the
failed attempt had got somewhere: an attempt that fails before any rank
completed a training step fails from an error a restart would meet again
(a bad argument, a missing file, an exception in the model's code). A rank
records its first completed step by creating the file the launcher names in
``TNT_PROGRESS_FILE``; ``fit`` does so through ``Reporter``, a custom training
loop by calling ``step_completed()`` after its first step. Outside the
launcher there is no such file and both do nothing.
"""
import keras

from tarantella import log
from tarantella import settings
from tarantella.backup import position

_reported = False


def step_completed():
    """Records that this rank completed a training step (once per process;
    later calls return at once)."""
    global _reported
    if _reported:
        return
    _reported = True
    path = settings.get("TNT_PROGRESS_FILE")
    if path is None:
        return
    try:
        with open(path, "w") as f:
            f.write("a training step completed\n")
    except OSError as e:
        # Training goes on; only a restart of this attempt is at stake.
        log.logger.warning("cannot record the first completed step in %s (%s): with "
                           "--max-restarts, a failure of this attempt may be taken for one "
                           "before the first step and not be restarted", path, e.strerror)


class Reporter(keras.callbacks.Callback):
    """Calls step_completed() after every training batch of fit. It reads
    no logs, so Keras may call it asynchronously, as it does the batch hooks
    of its own callbacks."""

    async_safe = True

    def on_train_batch_end(self, batch, logs=None):
        if not position.skipping(batch):
            step_completed()
