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


def sgd(kernel, bias, batches, learning_rate):
  """Plain SGD over `batches` of (x, y); returns the trained (kernel, bias)."""
  kernel, bias = kernel.astype(np.float64), bias.astype(np.float64)
  for x, y in batches:
    _, d_kernel, d_bias = loss_and_gradients(kernel, bias, x, y)
    kernel = kernel - learning_rate * d_kernel
    bias = bias - learning_rate * d_bias
  return kernel, bias


def accuracy(kernel, bias, x, y):
  return float(np.mean(np.argmax(x @ kernel + bias, axis=1) == y))
