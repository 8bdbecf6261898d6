"""The compute floor of a round: its SGD steps in plain TensorFlow, without TFF.

`bin/benchmark.py` compares each algorithm's round with the same clients' SGD
steps run by plain TensorFlow in one `tf.function`. The floor runs in its own
process, one per variant, because TensorFlow's thread pool sizes can only be
set before TensorFlow starts (one variant runs clients side by side with one
thread an op), and so that nothing TFF sets up in a process (its worker, its
contexts) shares it. This module imports only NumPy and TensorFlow, and
refuses to report if TFF got loaded. (Measured: importing TFF beside it did
not change the FEMNIST floor, 2.9-3.0 s either way; the same floor measured
1.3-2.9 s at different times of one hour on this shared 2-core machine, so
compare only times measured in one run.)

  python -m tff_personal.reports.compute_floor DIR --mode=parallel --intra_op_threads=1

DIR (written by `write_round`): `model.json` (Keras architecture),
`weights.npz` (the global weights), `round.json` (loss, learning rate,
batch size, timed rounds) and `clients.npz` (each client's examples in
training order; batched in order they give exactly the round's batches).
Prints one JSON line: {"seconds": median round, "steps": SGD steps a round,
"checksum": sum of |w| after the rounds (equal across modes)}.

With --serve the process stays up after its warm-up round: it prints
{"ready": true}, then runs one round for each line it reads on stdin and
prints {"seconds": ..., "cpu_seconds": ...} (wall and process CPU time of
that round), and prints the JSON line above at end of input. So
`bin/benchmark.py` can alternate floor rounds with TFF rounds and compare
rounds measured next to each other (this VM's speed drifts within minutes).

Modes: `sequential` (one model, clients one after the other), `parallel`
(a model per client in the same `tf.function`; the automatic control
dependencies of `tf.function` may still order their variable updates) and
`threads` (a model and a `tf.function` per client, called from one Python
thread per core, so clients really run side by side, as they do in TFF's
runtime; the mean update is applied after them). Thread pool sizes are set
before TensorFlow starts.
"""

import argparse
import concurrent.futures
import json
import os
import statistics
import sys
import time

import numpy as np


def write_round(folder: str, model, loss, learning_rate: float, batch_size: int,
                rounds: int, client_examples) -> None:
  """Writes a round for `main`: a built Keras `model` (its weights are the
  round's start), a Keras `loss`, and [(x, y)] per client in training order."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  with open(os.path.join(folder, 'model.json'), 'w') as f:
    f.write(model.to_json())
  np.savez(os.path.join(folder, 'weights.npz'), *model.get_weights())
  with open(os.path.join(folder, 'round.json'), 'w') as f:
    json.dump({
        'loss': tf.keras.losses.serialize(loss),
        'learning_rate': learning_rate,
        'batch_size': batch_size,
        'rounds': rounds,
        'num_clients': len(client_examples),
    }, f)
  arrays = {}
  for i, (x, y) in enumerate(client_examples):
    arrays[f'x{i}'], arrays[f'y{i}'] = x, y
  np.savez(os.path.join(folder, 'clients.npz'), **arrays)


def _read_round(folder: str):
  """(spec, model architecture JSON, initial weights, clients' (x, y)) of a round."""
  with open(os.path.join(folder, 'round.json')) as f:
    spec = json.load(f)
  with open(os.path.join(folder, 'model.json')) as f:
    architecture = f.read()
  with np.load(os.path.join(folder, 'weights.npz')) as w:
    weights = [w[f'arr_{i}'] for i in range(len(w.files))]
  with np.load(os.path.join(folder, 'clients.npz')) as c:
    examples = [(c[f'x{i}'], c[f'y{i}']) for i in range(spec['num_clients'])]
  return spec, architecture, weights, examples


def _measure(folder: str, mode: str, serve: bool = False) -> dict:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  spec, architecture, weights, examples = _read_round(folder)
  # tf.data's autotuning off, as for the clients in TFF's worker
  # (`runtime.client_datasets.without_autotuning`, not imported: it imports TFF).
  options = tf.data.Options()
  options.autotune.enabled = False
  datasets = tuple(
      tf.data.Dataset.from_tensor_slices((x, y)).batch(spec['batch_size']).with_options(options)
      for x, y in examples
  )
  models = []
  for _ in (datasets[:1] if mode == 'sequential' else datasets):
    model = tf.keras.models.model_from_json(architecture)
    model.set_weights(weights)
    models.append(model)
  loss_fn = tf.keras.losses.deserialize(spec['loss'])
  learning_rate = spec['learning_rate']
  global_weights = [tf.Variable(v) for v in models[0].trainable_variables]

  def train_client(model, dataset):
    """SGD over the client's batches from the global weights; returns its
    example count and its model's change."""
    for variable, start in zip(model.trainable_variables, global_weights):
      variable.assign(start)
    num_examples = tf.constant(0.0)
    steps = tf.constant(0)
    # Over an iterator, as the clients loop (`client_training.reduce_batches`):
    # autograph makes `for x in dataset` a `dataset.reduce`, whose body
    # function costs about 45 ms of CPU a client each time it runs (measured
    # on the FEMNIST and Fashion-MNIST CNNs), which is not SGD work.
    for x, y in iter(dataset):
      with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
      gradients = tape.gradient(loss, model.trainable_variables)
      for variable, gradient in zip(model.trainable_variables, gradients):
        variable.assign_sub(learning_rate * gradient)
      num_examples += tf.cast(tf.shape(y)[0], tf.float32)
      steps += 1
    deltas = [v - s for v, s in zip(model.trainable_variables, global_weights)]
    return num_examples, steps, deltas

  def apply_mean(results):
    total = tf.add_n([n for n, _, _ in results])
    for i, start in enumerate(global_weights):
      start.assign_add(tf.add_n([n * d[i] for n, _, d in results]) / total)
    return tf.add_n([s for _, s, _ in results])

  if mode == 'threads':
    # One tf.function per client model, called from a thread per core: the
    # calls run in TensorFlow's C++ runtime outside the GIL, side by side.
    client_fns = [
        tf.function(lambda dataset, model=model: train_client(model, dataset))
        for model in models
    ]
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1)

    def round_fn(datasets):
      results = list(pool.map(lambda i: client_fns[i](datasets[i]), range(len(datasets))))
      return apply_mean(results)

    for client_fn, dataset in zip(client_fns, datasets):
      client_fn(dataset)  # Traces one at a time, before threads call them.
    graphs = [f.get_concrete_function(d).graph for f, d in zip(client_fns, datasets)]

  else:

    @tf.function
    def round_fn(datasets):
      return apply_mean(
          [train_client(models[i % len(models)], d) for i, d in enumerate(datasets)]
      )

  steps = int(round_fn(datasets))  # Warm-up: traces.
  if mode != 'threads':
    graphs = [round_fn.get_concrete_function(datasets).graph]
  per_client_functions = sorted(_dataset_function_ops(graphs))
  if per_client_functions:
    sys.exit(f'compute_floor: error: the round runs {", ".join(per_client_functions)}; a'
             ' function a client that is not SGD work would slow the floor.')
  times = []

  def timed_round():
    started, cpu_started = time.monotonic(), time.process_time()
    round_fn(datasets)
    times.append(time.monotonic() - started)
    return {'seconds': times[-1], 'cpu_seconds': time.process_time() - cpu_started}

  if serve:
    print(json.dumps({'ready': True}), flush=True)
    for _ in sys.stdin:
      print(json.dumps(timed_round()), flush=True)
  else:
    for _ in range(spec['rounds']):
      timed_round()
  # The same steps in every mode give the same weights (up to float order).
  checksum = float(sum(tf.reduce_sum(tf.abs(w)) for w in global_weights))
  return {'seconds': statistics.median(times), 'steps': steps, 'checksum': checksum}


def _dataset_function_ops(graphs) -> set:
  """The ops of `graphs` (and their functions) that run a function over a dataset."""
  found = set()
  for graph in graphs:
    graph_def = graph.as_graph_def()
    nodes = list(graph_def.node)
    for function in graph_def.library.function:
      nodes.extend(function.node_def)
    found.update(n.op for n in nodes if n.op in ('ReduceDataset', 'ScanDataset'))
  return found


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('folder')
  parser.add_argument('--mode', choices=['sequential', 'parallel', 'threads'], default='sequential')
  parser.add_argument('--intra_op_threads', type=int, default=0)
  parser.add_argument('--inter_op_threads', type=int, default=0)
  parser.add_argument('--serve', action='store_true',
                      help='run a round per line of stdin (module docstring)')
  args = parser.parse_args(argv)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  tf.config.threading.set_intra_op_parallelism_threads(args.intra_op_threads)
  tf.config.threading.set_inter_op_parallelism_threads(args.inter_op_threads)
  result = _measure(args.folder, args.mode, args.serve)
  if 'tensorflow_federated' in sys.modules:
    sys.exit('compute_floor: error: tensorflow_federated was imported; the floor would be slow.')
  print(json.dumps(result), flush=True)


if __name__ == '__main__':
  main()
