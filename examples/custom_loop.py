"""A hand-written training loop on Fashion-MNIST, on every rank with Tarantella.

    tarantella -n 2 -- examples/custom_loop.py --epochs 1

No fit(): the loop computes gradients with a GradientTape, as Keras's guide
to writing a training loop from scratch does. The lines marked
"Tarantella" distribute it: each rank takes its micro-batches of every
global batch, starts from the master's weights, and applies gradients
averaged over the global batch; the printed loss and accuracy are global.
"""
import argparse

import tensorflow as tf
import keras

import tarantella as tnt  # Tarantella
from fashion_mnist import DATA_DIR, load_fashion_mnist


def model_generator():
    inputs = keras.Input(shape=(28, 28, 1))
    x = keras.layers.Conv2D(16, 5, padding="same", activation="relu")(inputs)
    x = keras.layers.MaxPooling2D(2)(x)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dense(64, activation="relu")(x)
    return keras.Model(inputs, keras.layers.Dense(10)(x))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch_size", type=int, default=64, help="global batch size")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--train_size", type=int, default=10000)
    parser.add_argument("--data_dir", default=DATA_DIR)
    args = parser.parse_args()

    tnt.init()  # Tarantella
    keras.utils.set_random_seed(42)
    (x_train, y_train), _ = load_fashion_mnist(args.data_dir)
    dataset = tf.data.Dataset.from_tensor_slices((x_train[:args.train_size],
                                                  y_train[:args.train_size]))
    dataset = dataset.shuffle(args.train_size, seed=42).batch(args.batch_size)
    dataset = tnt.data.distribute(dataset)  # Tarantella: this rank's micro-batches

    model = model_generator()
    optimizer = keras.optimizers.Adam(1e-3)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    tnt.broadcast_variables(model.variables)  # Tarantella: the master's initial weights

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = loss_fn(y, logits)
        # Tarantella: gradients averaged over the global batch.
        tape = tnt.DistributedGradientTape(tape, num_samples=tf.shape(x)[0])
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        n = tf.cast(tf.shape(x)[0], tf.float32)
        correct = tf.reduce_sum(tf.cast(tf.argmax(logits, axis=1, output_type=tf.int32) == y,
                                        tf.float32))
        # Tarantella: sums over all ranks, for global figures.
        return tnt.allreduce(tf.stack([loss * n, correct, n]), op="sum")

    for epoch in range(args.epochs):
        totals = tf.zeros(3)
        for x, y in dataset:
            totals += train_step(x, y)
        loss, correct, n = totals.numpy()
        if tnt.is_master_rank():
            print(f"epoch {epoch + 1}: loss {loss / n:.4f}, accuracy {correct / n:.4f} "
                  f"({int(n)} samples on {tnt.get_size()} ranks)")


if __name__ == "__main__":
    main()
