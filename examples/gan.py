"""A GAN on Fashion-MNIST: a model whose train_step trains two networks with
two optimizers, on every rank with Tarantella.

    tarantella -n 2 -- examples/gan.py --epochs 1

The model is the one of Keras's guide to customizing fit; the lines marked
"Tarantella" are all that distribution needs. Both optimizers average their
gradients over the global batch inside the step, so the replicas stay
identical; the losses shown are those of the global batch.
"""
import argparse

import numpy as np
import tensorflow as tf
import keras

import tarantella as tnt  # Tarantella
from fashion_mnist import DATA_DIR, load_fashion_mnist


class GAN(keras.Model):
    def __init__(self, discriminator, generator, latent_dim, seed):
        super().__init__()
        self.discriminator = discriminator
        self.generator = generator
        self.latent_dim = latent_dim
        self.seed_generator = keras.random.SeedGenerator(seed)
        self.d_loss_tracker = keras.metrics.Mean(name="d_loss")
        self.g_loss_tracker = keras.metrics.Mean(name="g_loss")

    def compile(self, d_optimizer, g_optimizer, loss_fn):
        super().compile()
        self.d_optimizer = d_optimizer
        self.g_optimizer = g_optimizer
        self.loss_fn = loss_fn

    @property
    def metrics(self):
        return [self.d_loss_tracker, self.g_loss_tracker]

    def train_step(self, real_images):
        batch_size = tf.shape(real_images)[0]
        noise = keras.random.normal((batch_size, self.latent_dim), seed=self.seed_generator)
        generated = self.generator(noise)
        combined = tf.concat([generated, real_images], axis=0)
        labels = tf.concat([tf.ones((batch_size, 1)), tf.zeros((batch_size, 1))], axis=0)
        labels += 0.05 * keras.random.uniform(tf.shape(labels), seed=self.seed_generator)
        with tf.GradientTape() as tape:
            d_loss = self.loss_fn(labels, self.discriminator(combined))
        weights = self.discriminator.trainable_weights
        self.d_optimizer.apply_gradients(zip(tape.gradient(d_loss, weights), weights))

        noise = keras.random.normal((batch_size, self.latent_dim), seed=self.seed_generator)
        with tf.GradientTape() as tape:
            g_loss = self.loss_fn(tf.zeros((batch_size, 1)),
                                  self.discriminator(self.generator(noise)))
        weights = self.generator.trainable_weights
        self.g_optimizer.apply_gradients(zip(tape.gradient(g_loss, weights), weights))

        # Weighted by the batch size, the trackers' means are global ones.
        self.d_loss_tracker.update_state(d_loss, sample_weight=batch_size)
        self.g_loss_tracker.update_state(g_loss, sample_weight=batch_size)
        return {m.name: m.result() for m in self.metrics}


def networks(latent_dim):
    discriminator = keras.Sequential([
        keras.Input((28, 28, 1)),
        # ELU rather than LeakyReLU after a convolution: TensorFlow 2.21's
        # graph optimizer fails (and says so) on LeakyReLU's gradient there.
        keras.layers.Conv2D(32, 3, strides=2, padding="same", activation="elu"),
        keras.layers.Conv2D(64, 3, strides=2, padding="same", activation="elu"),
        keras.layers.GlobalMaxPooling2D(),
        keras.layers.Dense(1)], name="discriminator")
    generator = keras.Sequential([
        keras.Input((latent_dim,)),
        keras.layers.Dense(7 * 7 * 32),
        keras.layers.LeakyReLU(0.2),
        keras.layers.Reshape((7, 7, 32)),
        keras.layers.Conv2DTranspose(32, 4, strides=2, padding="same"),
        keras.layers.LeakyReLU(0.2),
        keras.layers.Conv2DTranspose(32, 4, strides=2, padding="same"),
        keras.layers.LeakyReLU(0.2),
        keras.layers.Conv2D(1, 7, padding="same", activation="sigmoid")], name="generator")
    return discriminator, generator


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch_size", type=int, default=64, help="global batch size")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--train_size", type=int, default=10000,
                        help="use the first N training images")
    parser.add_argument("--latent_dim", type=int, default=64)
    parser.add_argument("--data_dir", default=DATA_DIR)
    parser.add_argument("--save_weights", metavar="PREFIX",
                        help="every rank writes its weights to PREFIX.rank<R>.npz")
    args = parser.parse_args()

    tnt.init()  # Tarantella
    keras.utils.set_random_seed(42)
    (x_train, _), _ = load_fashion_mnist(args.data_dir)
    images = tf.data.Dataset.from_tensor_slices(x_train[:args.train_size])
    images = images.shuffle(args.train_size, seed=42).batch(args.batch_size)

    discriminator, generator = networks(args.latent_dim)
    # Each rank draws its own noise; the averaged gradients keep the
    # replicas identical.
    gan = GAN(discriminator, generator, args.latent_dim, seed=1337 + tnt.get_rank())
    gan = tnt.Model(gan)  # Tarantella
    gan.compile(d_optimizer=keras.optimizers.Adam(0.0003),
                g_optimizer=keras.optimizers.Adam(0.0003),
                loss_fn=keras.losses.BinaryCrossentropy(from_logits=True))
    gan.fit(images, epochs=args.epochs, verbose=2)
    if args.save_weights:
        np.savez(f"{args.save_weights}.rank{tnt.get_rank()}.npz", *gan.get_weights())


if __name__ == "__main__":
    main()
