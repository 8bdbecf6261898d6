"""NumPy references for the tiny linear softmax model of tests/test_utils.py."""

import numpy as np


def softmax(logits):
  shifted = logits - logits.max(axis=1, keepdims=True)
  e = np.exp(shifted)
  return e / e.sum(axis=1, keepdims=True)


def loss_and_gradients(kernel, bias, x, y):
  """Mean sparse cross-entropy of softmax(x @ kernel + bias) and its gradients."""
  x = x.astype(np.float64)
  probabilities = softmax(x @ kernel + bias)
  n = x.shape[0]
  loss = -np.mean(np.log(probabilities[np.arange(n), y]))
  d_logits = probabilities.copy()
  d_logits[np.arange(n), y] -= 1.0
  d_logits /= n
  return loss, x.T @ d_logits, d_logits.sum(axis=0)


def mean_loss(kernel, bias, batches):
  """The example-weighted mean loss at (kernel, bias) over `batches` of (x, y)."""
  losses = [loss_and_gradients(kernel, bias, x, y)[0] * len(y) for x, y in batches]
  return sum(losses) / sum(len(y) for _, y in batches)


def sgd(kernel, bias, batches, learning_rate):
  """Plain SGD over `batches` of (x, y); returns the trained (kernel, bias)."""
  kernel, bias = kernel.astype(np.float64), bias.astype(np.float64)
  for x, y in batches:
    _, d_kernel, d_bias = loss_and_gradients(kernel, bias, x, y)
    kernel = kernel - learning_rate * d_kernel
    bias = bias - learning_rate * d_bias
  return kernel, bias


def proximal_sgd(kernel, bias, batches, learning_rate, strength):
  """SGD on F(w) + strength/2 ||w - w0||^2 from w0 = (kernel, bias) (FedProx)."""
  anchor = kernel.astype(np.float64), bias.astype(np.float64)
  kernel, bias = anchor
  for x, y in batches:
    _, d_kernel, d_bias = loss_and_gradients(kernel, bias, x, y)
    kernel = kernel - learning_rate * (d_kernel + strength * (kernel - anchor[0]))
    bias = bias - learning_rate * (d_bias + strength * (bias - anchor[1]))
  return kernel, bias


def accuracy(kernel, bias, x, y):
  return float(np.mean(np.argmax(x @ kernel + bias, axis=1) == y))


def mlp_loss_and_gradients(params, x, y):
  """Mean cross-entropy of softmax(relu(x W1 + b1) W2 + b2) and its gradients.

  `params` = [W1, b1, W2, b2] (the tiny model with a hidden layer).
  """
  w1, b1, w2, b2 = [p.astype(np.float64) for p in params]
  x = x.astype(np.float64)
  pre = x @ w1 + b1
  hidden = np.maximum(pre, 0.0)
  loss, d_w2, d_b2 = loss_and_gradients(w2, b2, hidden, y)
  probabilities = softmax(hidden @ w2 + b2)
  n = x.shape[0]
  d_logits = probabilities.copy()
  d_logits[np.arange(n), y] -= 1.0
  d_logits /= n
  d_pre = (d_logits @ w2.T) * (pre > 0)
  return loss, [x.T @ d_pre, d_pre.sum(axis=0), d_w2, d_b2]


def mlp_sgd(params, batches, learning_rate, trainable=(0, 1, 2, 3)):
  """SGD over `batches` on the parameters at positions `trainable` only."""
  params = [p.astype(np.float64) for p in params]
  for x, y in batches:
    _, gradients = mlp_loss_and_gradients(params, x, y)
    params = [
        p - learning_rate * g if i in trainable else p
        for i, (p, g) in enumerate(zip(params, gradients))
    ]
  return params
