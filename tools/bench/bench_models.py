"""Models shared by the benchmark scripts of this folder.

Each builder takes the Keras module to build with (Keras 3, or tf-keras for
the frameworks that need it), so every framework trains the same layers.
"""


def lenet5(keras, classes=10):
    """LeNet-5 for 28x28x1 images (about 1.2M parameters, most in the
    2450x500 dense kernel)."""
    inputs = keras.Input(shape=(28, 28, 1))
    x = keras.layers.Conv2D(20, 5, padding="same", activation="relu")(inputs)
    x = keras.layers.MaxPooling2D(2)(x)
    x = keras.layers.Conv2D(50, 5, padding="same", activation="relu")(x)
    x = keras.layers.MaxPooling2D(2)(x)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dense(500, activation="relu")(x)
    return keras.Model(inputs, keras.layers.Dense(classes, activation="softmax")(x))
