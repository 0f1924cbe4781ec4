"""The book's linear regression in PyTorch, the four ways it teaches: the reference runs for the JAX trainers.

Every variant starts from the book's NumPy starting point (so all trainers can be compared number
for number) and trains 1000 epochs at lr 0.1 on the full batch of 80.
"""

from __future__ import annotations

import numpy as np
import torch

from functional_gan.linreg import EPOCHS, LEARNING_RATE, LinRegData, LinRegResult, initial_parameters


def _tensors(data: LinRegData, dtype):
    return tuple(torch.as_tensor(a, dtype=dtype) for a in (data.x_train, data.y_train, data.x_val, data.y_val))


def _params(dtype):
    b0, w0 = initial_parameters()
    b = torch.tensor([b0], dtype=dtype, requires_grad=True)
    w = torch.tensor([w0], dtype=dtype, requires_grad=True)
    return b, w


def _result(name, b, w, last_loss, x_val, y_val, losses):
    with torch.no_grad():
        val_loss = ((b + w * x_val - y_val) ** 2).mean().item()
    return LinRegResult(name, float(b.item()), float(w.item()), last_loss, val_loss, np.array(losses))


def train_manual(data: LinRegData, lr=LEARNING_RATE, epochs=EPOCHS, dtype=torch.float32) -> LinRegResult:
    """Tensors with hand-written gradients (no autograd)."""
    x_train, y_train, x_val, y_val = _tensors(data, dtype)
    b0, w0 = initial_parameters()
    b, w = torch.tensor([b0], dtype=dtype), torch.tensor([w0], dtype=dtype)
    losses = []
    for _ in range(epochs):
        error = (b + w * x_train) - y_train
        losses.append((error**2).mean().item())
        b = b - lr * 2 * error.mean()
        w = w - lr * 2 * (x_train * error).mean()
    return _result("torch manual gradients", b, w, losses[-1], x_val, y_val, losses)


def train_backward(data: LinRegData, lr=LEARNING_RATE, epochs=EPOCHS, dtype=torch.float32) -> LinRegResult:
    """``loss.backward()``, an update under ``torch.no_grad()``, then ``.grad.zero_()`` (the book's final version)."""
    x_train, y_train, x_val, y_val = _tensors(data, dtype)
    b, w = _params(dtype)
    losses = []
    for _ in range(epochs):
        y_hat = b + w * x_train
        loss = ((y_hat - y_train) ** 2).mean()
        losses.append(loss.item())
        loss.backward()
        with torch.no_grad():
            b -= lr * b.grad
            w -= lr * w.grad
        b.grad.zero_()
        w.grad.zero_()
    return _result("torch backward + no_grad + zero_", b, w, losses[-1], x_val, y_val, losses)


def train_sgd(data: LinRegData, lr=LEARNING_RATE, epochs=EPOCHS, dtype=torch.float32) -> LinRegResult:
    """``optim.SGD`` with ``zero_grad()`` / ``backward()`` / ``step()``."""
    x_train, y_train, x_val, y_val = _tensors(data, dtype)
    b, w = _params(dtype)
    optimizer = torch.optim.SGD([b, w], lr=lr)
    losses = []
    for _ in range(epochs):
        loss = ((b + w * x_train - y_train) ** 2).mean()
        losses.append(loss.item())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return _result("torch optim.SGD", b, w, losses[-1], x_val, y_val, losses)


def train_linear(data: LinRegData, lr=LEARNING_RATE, epochs=EPOCHS, dtype=torch.float32) -> LinRegResult:
    """``nn.Linear(1, 1)`` started at the book's values, ``nn.MSELoss``, ``optim.SGD``."""
    x_train, y_train, x_val, y_val = _tensors(data, dtype)
    b0, w0 = initial_parameters()
    model = torch.nn.Linear(1, 1).to(dtype)
    with torch.no_grad():
        model.weight.fill_(w0)
        model.bias.fill_(b0)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    criterion = torch.nn.MSELoss()
    losses = []
    for _ in range(epochs):
        model.train()
        loss = criterion(model(x_train), y_train)
        losses.append(loss.item())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return _result("torch nn.Linear + optim.SGD", model.bias, model.weight, losses[-1], x_val, y_val, losses)


TORCH_TRAINERS = (train_manual, train_backward, train_sgd, train_linear)


def run_all(dtype=torch.float32) -> list[LinRegResult]:
    """The four PyTorch variants on the book's data."""
    from functional_gan.linreg import make_data

    data = make_data()
    return [trainer(data, dtype=dtype) for trainer in TORCH_TRAINERS]
