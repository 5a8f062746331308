"""tnt.Model: a Keras model trained with data parallelism.

The wrapper forwards everything to the Keras model it holds and changes
only what distribution needs:

* ``compile`` disables XLA for the training step (the communication ops
  are not XLA ops) and has the optimizer average gradients across ranks
  (gradients.py) before it clips or applies them;
* ``fit`` and ``evaluate`` split every global batch into micro-batches
  (data.py), broadcast the master's weights first, and report metrics of
  the global batch (metrics.py);
* output (progress bars, ``summary``) comes from the master rank only,
  unless TNT_OUTPUT_ON_ALL_DEVICES is set.
"""
import hashlib
import os

import keras
import numpy as np
import tensorflow as tf
from keras.src.trainers.data_adapters import data_adapter_utils

from tarantella import _core
from tarantella import callbacks as tnt_callbacks
from tarantella import data
from tarantella import gradients
from tarantella import log
from tarantella import metrics
from tarantella import runtime
from tarantella import timeline


def _current_graph_tensors(tensors):
    """The tensors that belong to the graph being traced now."""
    if tf.executing_eagerly():
        return []
    graph = tf.compat.v1.get_default_graph()
    return [t for t in tensors if getattr(t, "graph", None) is graph]


def _steps(dataset, steps=None):
    """The steps a loop over `dataset` takes: `steps` when given, else the
    dataset's cardinality (-1: infinite, -2: unknown, 0: no dataset)."""
    if steps is not None:
        return int(steps)
    if dataset is None:
        return 0
    return int(dataset.cardinality().numpy())


class Model:
    """Wraps `model` (a keras.Model) for training on all ranks."""

    def __init__(self, model):
        runtime.require_init()
        if isinstance(model, Model):
            model = model.model
        if not isinstance(model, keras.Model):
            raise TypeError(f"tnt.Model wraps a keras.Model; got {type(model).__name__}")
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "_tnt_reducer", gradients.GradientReducer())
        object.__setattr__(self, "_tnt_broadcast_pending", True)
        object.__setattr__(self, "_tnt_local_count", None)
        # The step's sample count goes through a variable so that TensorFlow
        # cannot treat it as a constant (see gradients.py).
        object.__setattr__(self, "_tnt_count_var",
                           tf.Variable(0.0, trainable=False, dtype=tf.float32,
                                       name="tnt_local_samples"))
        object.__setattr__(self, "_tnt_with_local", False)
        object.__setattr__(self, "_tnt_in_step", False)
        self._tnt_install_hooks()
        if model.compiled:
            # A model loaded compiled: distribute its optimizer as compile would.
            model.jit_compile = False
            self._tnt_patch_optimizer()

    @classmethod
    def from_config(cls, config, custom_objects=None):
        """A tnt.Model of the architecture in `config` (from get_config)."""
        from tarantella import models
        return models.model_from_config(config, custom_objects=custom_objects)

    # ---------------------------------------------------------------- forwarding

    def __getattr__(self, name):
        return getattr(object.__getattribute__(self, "model"), name)

    def __setattr__(self, name, value):
        if name.startswith("_tnt_"):
            object.__setattr__(self, name, value)
        else:
            setattr(self.model, name, value)

    def __call__(self, *args, **kwargs):
        return self.model(*args, **kwargs)

    def __repr__(self):
        return f"<tnt.Model wrapping {self.model!r}>"

    # ---------------------------------------------------------------- hooks

    def _tnt_install_hooks(self):
        km = self.model
        wrapper = self
        keras_train_step = km.train_step
        keras_metrics_result = km.get_metrics_result

        def train_step(batch):
            wrapper._tnt_in_step = True
            try:
                return distributed_train_step(batch)
            finally:
                wrapper._tnt_in_step = False

        def distributed_train_step(batch):
            x, _, _ = data_adapter_utils.unpack_x_y_sample_weight(batch)
            first = next(t for t in tf.nest.flatten(x) if t is not None)
            if runtime.get_size() > 1:
                wrapper._tnt_count_var.assign(tf.cast(tf.shape(first)[0], tf.float32))
                wrapper._tnt_local_count = wrapper._tnt_count_var.read_value()
            else:
                # Nothing to weight on one rank: keep the step as Keras's.
                wrapper._tnt_local_count = first
            wrapper._tnt_reducer.last_outputs = []
            return keras_train_step(batch)

        def get_metrics_result():
            deps = _current_graph_tensors(wrapper._tnt_reducer.last_outputs)
            return metrics.global_results(km, keras_metrics_result, deps,
                                          with_local=wrapper._tnt_with_local)

        # Plain attributes of the instance: Keras looks these methods up on
        # the model each time it builds its step functions.
        object.__setattr__(km, "train_step", train_step)
        object.__setattr__(km, "get_metrics_result", get_metrics_result)

    def _tnt_patch_optimizer(self):
        opt = self.model.optimizer
        if opt is None or getattr(opt, "_tnt_patched", False):
            return
        keras_apply = type(opt).apply
        wrapper = self

        def apply(grads, trainable_variables=None):
            count = wrapper._tnt_local_count
            if not wrapper._tnt_in_step:
                raise runtime.TarantellaError(
                    "the optimizer of a tnt.Model was applied outside model.fit(); custom "
                    "training loops cannot be distributed: train with fit()")
            grads = wrapper._tnt_reducer.reduce(list(grads), count)
            return keras_apply(opt, grads, trainable_variables)

        object.__setattr__(opt, "apply", apply)
        object.__setattr__(opt, "_tnt_patched", True)

    # ---------------------------------------------------------------- weights

    def _tnt_broadcast_weights(self):
        """Makes every rank hold the master's weights; an error names the
        ranks whose weight shapes differ from the master's."""
        self._tnt_broadcast_pending = False
        if runtime.get_size() == 1:
            return
        weights = self.model.get_weights()
        signature = ";".join(f"{w.dtype}{w.shape}" for w in weights).encode()
        digest = int(np.frombuffer(hashlib.sha256(signature).digest()[:8], dtype=np.int64)[0])
        differ = runtime.disagreements({"weights": digest}).get("weights")
        if differ:
            differ = sorted(differ[1])
            raise runtime.TarantellaError(
                f"ranks {differ} have models whose weight shapes differ from the master rank's; "
                "every rank must build the same model")
        if not weights:
            return
        blob = np.concatenate([np.ascontiguousarray(w).view(np.uint8).ravel() for w in weights])
        padded = np.zeros((blob.size + 7) // 8 * 8, dtype=np.uint8)
        padded[:blob.size] = blob
        _core.broadcast(padded.view(np.int64), root=runtime.MASTER_RANK)
        out, offset = [], 0
        for w in weights:
            n = w.nbytes
            out.append(padded[offset:offset + n].view(w.dtype).reshape(w.shape))
            offset += n
        self.model.set_weights(out)

    def _tnt_prepare(self, dataset):
        """Builds the model if needed and broadcasts the weights once."""
        if not self.model.built and dataset is not None:
            x, _, _ = data_adapter_utils.unpack_x_y_sample_weight(next(iter(dataset)))
            self.model(x)
        if self._tnt_broadcast_pending:
            self._tnt_broadcast_weights()

    def set_weights(self, weights):
        """Sets the weights on every rank to the master's `weights`
        (collective: call it on every rank)."""
        self.model.set_weights(weights)
        self._tnt_broadcast_weights()

    def load_weights(self, filepath, *args, **kwargs):
        """Loads weights on every rank; the master's are broadcast before the
        next fit, evaluate or predict."""
        path = os.fspath(filepath)
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path}: no such file; give the path that save_weights() "
                                    "wrote")
        try:
            result = self.model.load_weights(filepath, *args, **kwargs)
        except (OSError, ValueError) as e:
            raise runtime.TarantellaError(
                f"{path}: cannot load weights from it ({e}); give a file that save_weights() "
                "wrote for this model") from e
        self._tnt_broadcast_pending = True
        return result

    def save(self, filepath, overwrite=True, tnt_save_all_devices=False, **kwargs):
        """Saves the whole model from the master rank (every rank with
        tnt_save_all_devices=True), atomically; collective."""
        from tarantella import models
        models.write_on_master(filepath, overwrite, tnt_save_all_devices,
                               lambda path: self.model.save(path, overwrite=True, **kwargs))

    def save_weights(self, filepath, overwrite=True, tnt_save_all_devices=False, **kwargs):
        """Saves the weights from the master rank (every rank with
        tnt_save_all_devices=True), atomically; collective."""
        from tarantella import models
        models.write_on_master(filepath, overwrite, tnt_save_all_devices,
                               lambda path: self.model.save_weights(path, overwrite=True,
                                                                    **kwargs))

    def to_yaml(self, **kwargs):
        raise runtime.TarantellaError(
            "to_yaml() is gone from Keras 3: use model.to_json() and "
            "tnt.models.model_from_json(), or model.get_config()")

    # ---------------------------------------------------------------- Keras API

    def compile(self, *args, jit_compile=False, **kwargs):
        if jit_compile not in (False, "auto", None):
            log.logger.warning("jit_compile=%r ignored: Tarantella's communication runs "
                               "outside XLA", jit_compile)
        self.model.compile(*args, jit_compile=False, **kwargs)
        self._tnt_patch_optimizer()
        self._tnt_broadcast_pending = True

    def _tnt_verbose(self, verbose):
        if runtime.is_master_rank() or runtime.output_on_all_devices():
            return verbose
        return 0

    def _tnt_dataset(self, x, y, sample_weight, batch_size, micro_batch_size, distribute,
                     shuffle, what):
        """The (distributed) dataset for `x` as fit/evaluate accept it."""
        if isinstance(x, tf.data.Dataset):
            if batch_size is not None:
                raise runtime.TarantellaError(
                    f"batch_size={batch_size} was given together with a tf.data.Dataset for "
                    f"{what}: batch the dataset itself (with the global batch size) and drop "
                    "batch_size, or the data would be batched twice")
            if y is not None:
                raise runtime.TarantellaError(
                    f"y was given together with a tf.data.Dataset for {what}; a dataset "
                    "yields (x, y) pairs itself")
            ds = x
        elif x is None:
            return None
        elif data.is_array_like(x):
            if micro_batch_size is not None and batch_size is None:
                batch_size = micro_batch_size * runtime.get_size()
            ds = data.from_arrays(x, y, sample_weight, batch_size, shuffle)
        else:
            raise runtime.TarantellaError(
                f"unsupported {what} input of type {type(x).__name__}: pass a tf.data.Dataset "
                "or NumPy arrays")
        if not distribute:
            log.logger.info("%s dataset is not distributed (tnt_distribute_dataset=False): "
                            "every rank trains on all of it", what)
            return ds
        if data.is_array_like(x):
            micro_batch_size = None  # already batched with the global batch
        ds = data.distribute(ds, micro_batch_size, what)
        self._tnt_warn_batch_norm(ds, what)
        return ds

    def _tnt_warn_batch_norm(self, dataset, what):
        info = data.batch_info(dataset)
        if info.size is None:
            return
        smallest = min(data.micro_batch_sizes(info.size, runtime.get_size()))
        has_bn = any(isinstance(layer, keras.layers.BatchNormalization)
                     for layer in self.model._flatten_layers())
        if has_bn and smallest < 16:
            log.logger.warning("BatchNormalization sees micro-batches of %d samples in %s; "
                               "statistics of fewer than 16 samples are noisy: use a larger "
                               "global batch", smallest, what)

    def fit(self, x=None, y=None, batch_size=None, epochs=1, verbose="auto", callbacks=None,
            validation_split=0.0, validation_data=None, shuffle=True, sample_weight=None,
            validation_batch_size=None, tnt_micro_batch_size=None,
            tnt_validation_micro_batch_size=None, tnt_distribute_dataset=True,
            tnt_distribute_validation_dataset=True, **kwargs):
        if not self.model.compiled:
            raise runtime.TarantellaError("fit() was called before compile(): compile the "
                                          "model first")
        if validation_split and data.is_array_like(x) and not isinstance(x, tf.data.Dataset):
            arrays = tuple(a for a in (x, y, sample_weight) if a is not None)
            train, val = data.split_arrays(arrays, validation_split)
            x, y, sample_weight = (list(train) + [None, None])[:3]
            validation_data = tuple(val)
        elif validation_split:
            raise runtime.TarantellaError("validation_split works with NumPy inputs only; "
                                          "pass validation_data for datasets")
        train = self._tnt_dataset(x, y, sample_weight, batch_size, tnt_micro_batch_size,
                                  tnt_distribute_dataset, shuffle, "training")
        val = None
        if validation_data is not None:
            if isinstance(validation_data, tf.data.Dataset):
                vx, vy, vw = validation_data, None, None
            else:
                vx, vy, vw = (tuple(validation_data) + (None, None))[:3]
            vbs = validation_batch_size if validation_batch_size is not None else (
                None if isinstance(vx, tf.data.Dataset) else batch_size)
            val = self._tnt_dataset(vx, vy, vw, vbs, tnt_validation_micro_batch_size,
                                    tnt_distribute_validation_dataset, False, "validation")
        runtime.check_agreement("fit()", {
            "the number of epochs": epochs,
            "initial_epoch": kwargs.get("initial_epoch", 0),
            "the number of steps per epoch": _steps(train, kwargs.get("steps_per_epoch")),
            "the number of validation steps": _steps(val, kwargs.get("validation_steps")),
            "validation_freq": kwargs.get("validation_freq", 1)})
        self._tnt_prepare(train)
        cbs, verbose = self._tnt_callbacks(callbacks, verbose)
        cbs = timeline.with_step_spans(cbs)  # TNT_TIMELINE: mark the training steps
        # Shuffling is the dataset's business (arrays were shuffled above).
        history = self.model.fit(train, epochs=epochs, verbose=verbose, callbacks=cbs,
                                 validation_data=val, shuffle=False, **kwargs)
        history.history = {k: v for k, v in history.history.items()
                           if not k.startswith(tnt_callbacks.LOCAL_PREFIX)}
        return history

    def _tnt_callbacks(self, callbacks, verbose):
        """This rank's callbacks, and the verbosity to give Keras. When a
        callback asks for this rank's own logs, the steps also return local
        metrics, and the progress bar is one that hides them."""
        cbs = tnt_callbacks.distribute(callbacks)
        with_local = any(isinstance(cb, tnt_callbacks.Callback) and not cb.aggregate_logs
                         for cb in cbs)
        if with_local != self._tnt_with_local:
            self._tnt_with_local = with_local
            self.model.train_function = None  # rebuilt with the new results
            self.model.test_function = None
        verbose = self._tnt_verbose(verbose)
        if with_local and verbose != 0:
            cbs.append(tnt_callbacks._Forwarding(keras.callbacks.ProgbarLogger()))
            verbose = 0
        return cbs, verbose

    def evaluate(self, x=None, y=None, batch_size=None, verbose="auto", sample_weight=None,
                 tnt_micro_batch_size=None, tnt_distribute_dataset=True, **kwargs):
        ds = self._tnt_dataset(x, y, sample_weight, batch_size, tnt_micro_batch_size,
                               tnt_distribute_dataset, False, "evaluation")
        runtime.check_agreement("evaluate()", {
            "the number of steps": _steps(ds, kwargs.get("steps"))})
        self._tnt_prepare(ds)
        return self.model.evaluate(ds, verbose=self._tnt_verbose(verbose), **kwargs)

    def predict(self, x, batch_size=None, verbose="auto", tnt_micro_batch_size=None,
                tnt_distribute_dataset=True, **kwargs):
        """Predictions for every sample of `x`, in order, on every rank; each
        rank computes its micro-batches and the results are gathered."""
        size = runtime.get_size()
        if isinstance(x, tf.data.Dataset):
            if batch_size is not None:
                raise runtime.TarantellaError(
                    f"batch_size={batch_size} was given together with a tf.data.Dataset for "
                    "prediction: batch the dataset itself and drop batch_size")
            ds = x
        elif data.is_array_like(x):
            if batch_size is None:
                batch_size = tnt_micro_batch_size * size if tnt_micro_batch_size else 32
            ds = data.from_arrays(x, batch_size=batch_size)
        else:
            raise runtime.TarantellaError(
                f"unsupported prediction input of type {type(x).__name__}: pass a "
                "tf.data.Dataset or NumPy arrays")
        if tnt_micro_batch_size is not None and isinstance(x, tf.data.Dataset):
            ds = data.distribute(ds, tnt_micro_batch_size, "prediction")
            micro_done = True
        else:
            micro_done = False
        info = data.batch_info(ds)
        data.require_batched(info, "prediction")
        verbose = self._tnt_verbose(verbose)
        if size == 1 or not tnt_distribute_dataset or info.size is None:
            if size > 1 and tnt_distribute_dataset:
                log.logger.info("prediction: the dataset's batch size is unknown; every rank "
                                "predicts all of it")
            self._tnt_prepare(None)
            return self.model.predict(ds, verbose=verbose, **kwargs)
        dist = ds if micro_done else data.distribute(ds, None, "prediction")
        self._tnt_prepare(dist)
        local = self.model.predict(dist, verbose=verbose, **kwargs)
        return data.gather_batches(local, info.size)

    def summary(self, *args, **kwargs):
        if runtime.is_master_rank() or runtime.output_on_all_devices():
            return self.model.summary(*args, **kwargs)
        return None
