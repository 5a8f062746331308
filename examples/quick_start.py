"""Quick start: LeNet-5 on Fashion-MNIST, trained on every rank with Tarantella.

    tarantella -n 2 -- examples/quick_start.py        # or: mpirun -np 2 python3 ...
    python3 examples/quick_start.py                   # a 1-rank run

The three lines marked "Tarantella" are all that distinguishes this script
from serial Keras training. Data come from Debian's dataset-fashion-mnist
package (IDX files), so nothing is downloaded.
"""
import argparse

import numpy as np
import tensorflow as tf
import keras

import tarantella as tnt  # Tarantella
from fashion_mnist import DATA_DIR, load_fashion_mnist

def lenet5_model_generator():
    inputs = keras.Input(shape=(28, 28, 1), name="input")
    x = keras.layers.Conv2D(20, 5, padding="same", activation="relu")(inputs)
    x = keras.layers.MaxPooling2D(pool_size=2, strides=2)(x)
    x = keras.layers.Conv2D(50, 5, padding="same", activation="relu")(x)
    x = keras.layers.MaxPooling2D(pool_size=2, strides=2)(x)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dense(500, activation="relu")(x)
    outputs = keras.layers.Dense(10, activation="softmax")(x)
    return keras.Model(inputs=inputs, outputs=outputs)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch_size", type=int, default=64, help="global batch size")
    parser.add_argument("--learning_rate", type=float, default=0.01)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--train_size", type=int, default=60000,
                        help="use the first N training samples")
    parser.add_argument("--data_dir", default=DATA_DIR)
    parser.add_argument("--save_weights", metavar="PATH",
                        help="write the trained weights to PATH (.npz), from the master rank")
    args = parser.parse_args()

    tnt.init()  # Tarantella
    keras.utils.set_random_seed(42)

    (x_train, y_train), (x_test, y_test) = load_fashion_mnist(args.data_dir)
    x_train, y_train = x_train[:args.train_size], y_train[:args.train_size]

    model = tnt.Model(lenet5_model_generator())  # Tarantella
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=args.learning_rate,
                                                 momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(),
                  metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")])

    train_dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train))
    train_dataset = train_dataset.shuffle(len(x_train), seed=42).batch(args.batch_size)
    test_dataset = tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(args.batch_size)

    model.fit(train_dataset, epochs=args.epochs, verbose=2)
    if args.save_weights and tnt.is_master_rank():
        np.savez(args.save_weights, *model.get_weights())
    loss, accuracy = model.evaluate(test_dataset, verbose=0)
    if tnt.is_master_rank():
        print(f"test loss {loss:.4f}, test accuracy {accuracy:.4f} "
              f"({tnt.get_size()} ranks, global batch {args.batch_size})")


if __name__ == "__main__":
    main()
