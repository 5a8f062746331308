"""SplitLayer: the mark of a cut between two pipeline stages."""
import keras


@keras.saving.register_keras_serializable(package="tarantella")
class SplitLayer(keras.layers.Layer):
    """An identity layer: in a pipelined tnt.Model, the layers before it and
    the layers after it run on different ranks, and its output travels from
    one to the other. Several SplitLayers that are equally deep in the model
    cut several tensors at the same cut. Outside a pipeline (plain Keras,
    data parallelism) it does nothing; models holding it save and load as
    usual (with Tarantella imported, which registers it)."""

    def __call__(self, inputs, *args, **kwargs):
        if isinstance(inputs, (list, tuple, dict)):
            raise ValueError(
                f"SplitLayer '{self.name}' was given {len(inputs)} tensors; a SplitLayer cuts "
                "one tensor: put one SplitLayer on each tensor that crosses the cut")
        return super().__call__(inputs, *args, **kwargs)

    def call(self, inputs):
        return inputs

    def compute_output_shape(self, input_shape):
        return input_shape
