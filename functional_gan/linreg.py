"""The linear regression of *Deep Learning with PyTorch Step by Step*, four ways on the JAX side.

Data exactly as the book (``data_generation/simple_linear_regression.py``): ``np.random.seed(42)``,
``x = rand(100, 1)``, ``y = 1 + 2x + 0.1·randn``, shuffled indices, 80 for training and 20 for
validation. Parameters start where the book's NumPy code starts them (``np.random.seed(42)``,
``b = randn(1)``, ``w = randn(1)``: 0.49671415, −0.1382643). 1000 epochs, lr 0.1, full batch, MSE.

The trainers:

* ``numpy``: hand-written gradients ``2·mean(error)``, ``2·mean(x·error)`` (the book's NumPy code);
* ``jax.grad``: the gradient of a pure loss, a functional update, the loop one jitted ``lax.scan``;
* ``optax.sgd``: the same with an optax optimizer;
* ``flax nn.Dense``: a Flax model with the same initial values.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

LEARNING_RATE = 0.1
EPOCHS = 1000
# What the book prints for its final parameters: its NumPy code (float64) and its PyTorch code (float32).
BOOK_RESULTS = {"numpy": (1.02354094, 1.96896411), "pytorch": (1.0235, 1.9690)}


@dataclasses.dataclass(frozen=True)
class LinRegData:
    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray


@dataclasses.dataclass
class LinRegResult:
    trainer: str
    b: float
    w: float
    train_loss: float  # MSE on the training set at the last epoch's parameters before its update, as the book prints
    val_loss: float  # MSE of the final parameters on the validation set
    losses: np.ndarray  # training loss per epoch


def make_data() -> LinRegData:
    """The book's synthetic data: true b = 1, true w = 2, N = 100, seed 42, 80/20 split."""
    true_b, true_w, n = 1, 2, 100
    np.random.seed(42)
    x = np.random.rand(n, 1)
    y = true_b + true_w * x + (0.1 * np.random.randn(n, 1))
    idx = np.arange(n)
    np.random.shuffle(idx)
    train_idx, val_idx = idx[: int(n * 0.8)], idx[int(n * 0.8) :]
    return LinRegData(x[train_idx], y[train_idx], x[val_idx], y[val_idx])


# The starting point the book prints for its PyTorch model: `torch.manual_seed(42); b = torch.randn(1,
# requires_grad=True, device='cuda'); w = ...` gave b = 0.1940, w = 0.1391 on the book's GPU (printed to 4
# decimals). CUDA's generator draws other numbers than the CPU's from the same seed (the CPU gives 0.3367,
# 0.1288), so the PyTorch lessons start from these printed values to show the book's (and the notes') numbers.
BOOK_TORCH_START = (0.1940, 0.1391)


def initial_parameters() -> tuple[float, float]:
    """The book's NumPy starting point: ``np.random.seed(42); b = randn(1); w = randn(1)``."""
    rng = np.random.RandomState(42)
    b, w = rng.randn(1), rng.randn(1)
    return float(b[0]), float(w[0])


def numpy_gradients(b: float, w: float, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """The book's hand-written gradients of the MSE: ``(2·mean(error), 2·mean(x·error))``."""
    error = (b + w * x) - y
    return float(2 * error.mean()), float(2 * (x * error).mean())


def train_numpy(data: LinRegData, lr: float = LEARNING_RATE, epochs: int = EPOCHS) -> LinRegResult:
    """The book's NumPy gradient descent, in float64."""
    b, w = (np.array([v]) for v in initial_parameters())
    losses = []
    for _ in range(epochs):
        error = (b + w * data.x_train) - data.y_train
        losses.append(float((error**2).mean()))
        b_grad = 2 * error.mean()
        w_grad = 2 * (data.x_train * error).mean()
        b = b - lr * b_grad
        w = w - lr * w_grad
    val_loss = float((((b + w * data.x_val) - data.y_val) ** 2).mean())
    return LinRegResult("numpy (hand-written gradients)", float(b[0]), float(w[0]), losses[-1], val_loss, np.array(losses))


def mse_loss(params: dict, x: jax.Array, y: jax.Array) -> jax.Array:
    """A pure loss: the parameters are an argument, nothing is recorded anywhere."""
    y_hat = params["b"] + params["w"] * x
    return jnp.mean((y_hat - y) ** 2)


def _jax_arrays(data: LinRegData, dtype):
    return tuple(jnp.asarray(a, dtype) for a in (data.x_train, data.y_train, data.x_val, data.y_val))


def train_jax_grad(data: LinRegData, lr: float = LEARNING_RATE, epochs: int = EPOCHS, dtype=jnp.float32) -> LinRegResult:
    """``jax.grad`` of the pure loss and a functional update, all epochs one jitted ``lax.scan``."""
    x_train, y_train, x_val, y_val = _jax_arrays(data, dtype)
    b0, w0 = initial_parameters()
    params = {"b": jnp.asarray(b0, dtype), "w": jnp.asarray(w0, dtype)}

    @jax.jit
    def run(params):
        def epoch(params, _):
            loss, grads = jax.value_and_grad(mse_loss)(params, x_train, y_train)
            # A new value, not an in-place update: no no_grad(), no zero_() needed.
            params = jax.tree_util.tree_map(lambda p, g: p - lr * g, params, grads)
            return params, loss

        return jax.lax.scan(epoch, params, None, length=epochs)

    params, losses = run(params)
    return LinRegResult(
        "jax.grad + functional update", float(params["b"]), float(params["w"]), float(losses[-1]),
        float(mse_loss(params, x_val, y_val)), np.asarray(losses),
    )


def _train_with_optax(loss_fn, params, optimizer, x_train, y_train, epochs: int):
    """Full-batch training with an optax optimizer, all epochs one jitted ``lax.scan``: (params, losses)."""

    @jax.jit
    def run(params):
        def epoch(carry, _):
            params, opt_state = carry
            loss, grads = jax.value_and_grad(loss_fn)(params, x_train, y_train)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), loss

        (params, _), losses = jax.lax.scan(epoch, (params, optimizer.init(params)), None, length=epochs)
        return params, losses

    return run(params)


def train_optax_sgd(data: LinRegData, lr: float = LEARNING_RATE, epochs: int = EPOCHS, dtype=jnp.float32) -> LinRegResult:
    """``optax.sgd`` (PyTorch's ``optim.SGD`` without momentum), the loop one jitted ``lax.scan``."""
    x_train, y_train, x_val, y_val = _jax_arrays(data, dtype)
    b0, w0 = initial_parameters()
    params = {"b": jnp.asarray(b0, dtype), "w": jnp.asarray(w0, dtype)}
    params, losses = _train_with_optax(mse_loss, params, optax.sgd(lr), x_train, y_train, epochs)
    return LinRegResult(
        "optax.sgd", float(params["b"]), float(params["w"]), float(losses[-1]),
        float(mse_loss(params, x_val, y_val)), np.asarray(losses),
    )


def train_flax_dense(data: LinRegData, lr: float = LEARNING_RATE, epochs: int = EPOCHS, dtype=jnp.float32) -> LinRegResult:
    """A Flax ``nn.Dense(1)`` (PyTorch's ``nn.Linear(1, 1)``) started at the book's values, trained with optax.sgd."""
    x_train, y_train, x_val, y_val = _jax_arrays(data, dtype)
    b0, w0 = initial_parameters()
    model = nn.Dense(1, param_dtype=dtype, dtype=dtype)
    params = {"params": {"kernel": jnp.full((1, 1), w0, dtype), "bias": jnp.full((1,), b0, dtype)}}

    def loss_fn(params, x, y):
        return jnp.mean((model.apply(params, x) - y) ** 2)

    params, losses = _train_with_optax(loss_fn, params, optax.sgd(lr), x_train, y_train, epochs)
    return LinRegResult(
        "flax nn.Dense + optax.sgd", float(params["params"]["bias"][0]), float(params["params"]["kernel"][0, 0]),
        float(losses[-1]), float(loss_fn(params, x_val, y_val)), np.asarray(losses),
    )


JAX_TRAINERS = (train_jax_grad, train_optax_sgd, train_flax_dense)


def run_all(dtype=jnp.float32) -> list[LinRegResult]:
    """The NumPy reference and the three JAX trainers on the book's data."""
    data = make_data()
    return [train_numpy(data)] + [trainer(data, dtype=dtype) for trainer in JAX_TRAINERS]


def describe_setup() -> str:
    """One line: the book's data, starting point, first gradients and schedule."""
    data = make_data()
    b0, w0 = initial_parameters()
    b_grad, w_grad = numpy_gradients(b0, w0, data.x_train, data.y_train)
    return (f"Book's data: {len(data.x_train)} training / {len(data.x_val)} validation points; start b = {b0:.8f}, "
            f"w = {w0:.8f}; first gradients {b_grad:.4f}, {w_grad:.4f}; lr {LEARNING_RATE}, {EPOCHS} epochs")


def format_results(results: list[LinRegResult]) -> str:
    """A table of every trainer's result, then the book's published numbers to compare with."""
    lines = [f"{'trainer':<34} {'b':>12} {'w':>12} {'train MSE':>11} {'val MSE':>11}"]
    for r in results:
        lines.append(f"{r.trainer:<34} {r.b:>12.8f} {r.w:>12.8f} {r.train_loss:>11.8f} {r.val_loss:>11.8f}")
    (nb, nw), (pb, pw) = BOOK_RESULTS["numpy"], BOOK_RESULTS["pytorch"]
    lines.append(f"The book prints: NumPy b = {nb:.8f}, w = {nw:.8f}; PyTorch b = {pb:.4f}, w = {pw:.4f}")
    return "\n".join(lines)
