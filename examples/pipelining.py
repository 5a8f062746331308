"""Pipelining: an MLP on Fashion-MNIST, cut into stages that run on different ranks.

    tarantella -n 2 -- examples/pipelining.py                    # 2 stages, one per rank
    tarantella -n 4 -- examples/pipelining.py --strategy all     # 2 replicas of 2 stages
    tarantella -n 2 -- examples/pipelining.py --auto             # Tarantella cuts the model

The SplitLayer marks where the model is cut; `parallel_strategy` and
`num_micro_batches` are the only other differences from serial Keras
(docs/pipelining.md). The model is saved whole, as a file plain Keras loads.
"""
import argparse

import keras
import tensorflow as tf

import tarantella as tnt
from fashion_mnist import DATA_DIR, load_fashion_mnist


def mlp(split):
    inputs = keras.Input(shape=(28, 28, 1), name="image")
    x = keras.layers.Flatten()(inputs)
    x = keras.layers.Dense(1024, activation="relu")(x)
    x = keras.layers.Dense(1024, activation="relu")(x)
    if split:
        x = tnt.keras.layers.SplitLayer(name="cut")(x)  # stage 0 ends here
    x = keras.layers.Dense(1024, activation="relu")(x)
    outputs = keras.layers.Dense(10, activation="softmax")(x)
    return keras.Model(inputs, outputs, name="mlp")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", choices=["pipelining", "all"], default="pipelining",
                        help="pipelining: one rank per stage; all: replicas of the pipeline")
    parser.add_argument("--auto", action="store_true",
                        help="no SplitLayer: let Tarantella cut the model into 2 stages")
    parser.add_argument("--micro_batches", type=int, default=8)
    parser.add_argument("--batch_size", type=int, default=256, help="global batch size")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--train_size", type=int, default=60000,
                        help="use the first N training samples")
    parser.add_argument("--data_dir", default=DATA_DIR)
    parser.add_argument("--save", metavar="PATH", help="save the whole trained model (.keras)")
    args = parser.parse_args()

    tnt.init()
    keras.utils.set_random_seed(42)
    (x_train, y_train), (x_test, y_test) = load_fashion_mnist(args.data_dir)
    x_train, y_train = x_train[:args.train_size], y_train[:args.train_size]

    strategy = {"pipelining": tnt.ParallelStrategy.PIPELINING,
                "all": tnt.ParallelStrategy.ALL}[args.strategy]
    model = tnt.Model(mlp(split=not args.auto), parallel_strategy=strategy,
                      num_micro_batches=args.micro_batches,
                      **({"num_stages": 2} if args.auto else {}))
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(),
                  metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")])

    train = tf.data.Dataset.from_tensor_slices((x_train, y_train))
    train = train.shuffle(len(x_train), seed=42).batch(args.batch_size)
    test = tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(args.batch_size)
    model.fit(train, epochs=args.epochs, verbose=2)
    loss, accuracy = model.evaluate(test, verbose=0)
    if tnt.is_master_rank():
        print(f"test loss {loss:.4f}, test accuracy {accuracy:.4f}")
    if args.save:
        model.save(args.save)


if __name__ == "__main__":
    main()
