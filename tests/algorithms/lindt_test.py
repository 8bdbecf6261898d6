"""LINDT's dual model: the attaching module, one exact round, what is sent."""

import collections
import dataclasses

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tests import test_utils
from tests.algorithms.fedavg_test import batches_dataset, client_batches, run_next
from tff_personal.aggregators import dp
from tff_personal.algorithms import common
from tff_personal.algorithms import lindt
from tff_personal.models import dual
from tff_personal.nfl import detector
from tff_personal.tasks import cifar100

LEARNING_RATE = 0.1
MODEL = test_utils.tiny_model_spec(hidden=3)  # Blocks: [hidden], [logits].
ModelWeights = tff.learning.models.ModelWeights


def sigmoid(z):
  return 1 / (1 + np.exp(-z))


def test_attaching_module_numbers():
  g = np.array([[1.0, 2.0], [0.0, 1.0]], np.float32)
  l = np.array([[2.0, 0.0], [1.0, 1.0]], np.float32)
  h = dual.AttachingModule()([tf.constant(g), tf.constant(l)]).numpy()
  score = np.array([2.0 / (2.0 * np.sqrt(2)), 1.0 / (np.sqrt(2) * np.sqrt(2))])
  np.testing.assert_allclose(h, l + sigmoid(score)[:, None] * g, rtol=1e-6)
  learned = dual.AttachingModule(learn_offset=True)
  assert learned([tf.constant(g), tf.constant(l)]).numpy() == pytest.approx(h)  # b starts at 0.
  learned.offset.assign(-1.5)
  h = learned([tf.constant(g), tf.constant(l)]).numpy()
  np.testing.assert_allclose(h, l + sigmoid(score - 1.5)[:, None] * g, rtol=1e-6)
  assert dual.AttachingModule().weights == []
  # G rescaled to L's norm: rows ||l|| / ||g|| = 2 / sqrt(5) and sqrt(2) / 1.
  h = dual.AttachingModule(match_scale=True)([tf.constant(g), tf.constant(l)]).numpy()
  scale = np.array([2.0 / np.sqrt(5.0), np.sqrt(2.0)])
  np.testing.assert_allclose(h, l + (sigmoid(score) * scale)[:, None] * g, rtol=1e-6)
  assert dual.AttachingModule(match_scale=True).weights == []


def test_matched_scale_bounds_what_a_huge_global_representation_adds():
  l = tf.constant([[3.0, 4.0]])
  for factor in (1.0, 1e3, 1e6):
    g = tf.constant([[0.0, 1.0]]) * factor
    with tf.GradientTape() as tape:
      tape.watch(g)
      h = dual.AttachingModule(match_scale=True)([g, l])
    # ||h - l|| = gate * ||l|| <= 5, and the gradient into G shrinks as 1 / ||G||.
    assert 0.0 < np.linalg.norm(h.numpy() - l.numpy()) <= 5.0
    assert np.abs(tape.gradient(h, g).numpy()).max() < 10.0 / factor


Arrangement = collections.namedtuple(
    'Arrangement', 'attach_logits learn_gates match_scale detach_global'
)
# Ours by default, the paper's, ours with learned gates, with G at L's scale,
# with G detached from L's loss.
ARRANGEMENTS = {
    'attach_logits': Arrangement(True, False, False, False),
    'hidden_only': Arrangement(False, False, False, False),
    'learned_gates': Arrangement(True, True, False, False),
    'matched_scale': Arrangement(True, False, True, False),
    'detached_global': Arrangement(True, False, False, True),
}


@pytest.fixture(scope='module', params=list(ARRANGEMENTS))
def arrangement(request):
  return ARRANGEMENTS[request.param]


@pytest.fixture(scope='module')
def process(arrangement):
  return lindt.build(
      MODEL, lindt.Hparams(**arrangement._asdict()),
      common.Common(client_learning_rate=LEARNING_RATE, seed=6),
  )


def num_gates(arrangement):
  return (1 + arrangement.attach_logits) if arrangement.learn_gates else 0


def attach(g, l, offset=0.0, match_scale=False):
  """The attaching module in NumPy: l + sigmoid(<g, l> / (||l|| sqrt(d)) + b) g,
  per row; g first rescaled to ||l|| with match_scale."""
  norm = lambda h: np.maximum(np.linalg.norm(h, axis=1), 1e-6)
  score = np.sum(g * l, axis=1) / (norm(l) * np.sqrt(l.shape[1]))
  scale = norm(l) / norm(g) if match_scale else 1.0
  return l + (sigmoid(score + offset) * scale)[:, None] * g


def test_only_the_global_model_is_sent(process, arrangement):
  signature = process.next.type_signature
  weights = '<trainable=<float32[2,3],float32[3],float32[3,2],float32[2]>,non_trainable=<>>'
  # v: L's weights, then one scalar gate offset per attaching module if learned.
  personal = weights.replace('float32[2]>', 'float32[2]' + ',float32' * num_gates(arrangement) + '>')
  assert str(signature.parameter[2]) == '{' + personal + '}@CLIENTS'
  state = str(signature.result[0])
  assert 'global_model_weights=' + weights in state
  # The personal (local) model appears nowhere in the server state or metrics.
  assert str(signature.result[1]) == '{' + personal + '}@CLIENTS'


def reference_step(w, v, x, y, arrangement, local_loss=True):
  """One SGD step of the dual loss, written from the formulas directly
  (of G's loss alone without `local_loss`)."""
  w = [tf.Variable(p, dtype=tf.float64) for p in w]
  v = [tf.Variable(p, dtype=tf.float64) for p in v]
  offsets = v[4:] if arrangement.learn_gates else [0.0, 0.0]
  x = tf.constant(x, tf.float64)

  def module(g, l, offset):
    if arrangement.detach_global:
      g = tf.stop_gradient(g)
    norm = lambda h: tf.sqrt(tf.maximum(tf.reduce_sum(h * h, axis=1), 1e-12))  # Floored.
    score = tf.reduce_sum(g * l, axis=1) / (norm(l) * np.sqrt(l.shape[1]))
    scale = norm(l) / norm(g) if arrangement.match_scale else 1.0
    return l + (tf.sigmoid(score + offset) * scale)[:, None] * g

  with tf.GradientTape() as tape:
    g1 = tf.nn.relu(x @ w[0] + w[1])
    l1 = tf.nn.relu(x @ v[0] + v[1])
    global_logits = g1 @ w[2] + w[3]
    local_logits = module(g1, l1, offsets[0]) @ v[2] + v[3]
    if arrangement.attach_logits:  # The same module on the logits (2 classes).
      local_logits = module(global_logits, local_logits, offsets[1])
    ce = lambda logits: tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)
    )
    loss = ce(global_logits) + (ce(local_logits) if local_loss else 0.0)
  grads = tape.gradient(loss, w + v, unconnected_gradients=tf.UnconnectedGradients.ZERO)
  new = [p - LEARNING_RATE * g for p, g in zip(w + v, grads)]
  return [t.numpy() for t in new[:4]], [t.numpy() for t in new[4:]]


def local_weights(w, arrangement, seed):
  """A client's v: L near G, and gate offsets away from 0 (if learned)."""
  rng = np.random.default_rng(seed)
  v = [p + rng.normal(scale=0.3, size=p.shape).astype(np.float32) for p in w]
  return v + [np.float32(b) for b in (0.4, -0.7)[:num_gates(arrangement)]]


def test_one_round_matches_the_formulas(process, arrangement):
  state = process.initialize()
  w = process.get_model_weights(state).trainable
  v = local_weights(w, arrangement, seed=3)
  (x, y), = client_batches(4, [5])
  output = run_next(
      process, state, [batches_dataset([(x, y)])],
      [ModelWeights(trainable=v, non_trainable=[])],
  )
  expected_w, expected_v = reference_step(w, v, x, y, arrangement)
  for actual, expected in zip(process.get_model_weights(output.state).trainable, expected_w):
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-6)
  assert len(output.personal_states[0].trainable) == len(expected_v)
  for actual, expected in zip(output.personal_states[0].trainable, expected_v):
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-6)
  if arrangement.detach_global:  # w took FedAvg's step: SGD on G's loss alone.
    fedavg_w, _ = reference_step(w, v, x, y, arrangement, local_loss=False)
    for actual, expected in zip(process.get_model_weights(output.state).trainable, fedavg_w):
      np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-6)
  if num_gates(arrangement):  # The offsets moved: they are trained.
    assert all(abs(b - b0) > 1e-6 for b, b0 in zip(expected_v[4:], v[4:]))
  assert output.metrics['client_work']['train']['num_examples'] == 5


def test_a_new_client_starts_from_the_global_model_and_open_gates(process, arrangement):
  weights = process.get_model_weights(process.initialize())
  start = process.initial_personal_state('new', weights)
  assert len(start.trainable) == 4 + num_gates(arrangement)
  for a, b in zip(start.trainable, weights.trainable):
    np.testing.assert_array_equal(a, b)
  assert [float(b) for b in start.trainable[4:]] == [0.0] * num_gates(arrangement)


def test_evaluate_predicts_with_the_local_logits(process, arrangement):
  weights = process.get_model_weights(process.initialize())
  w = weights.trainable
  v = [p * 0.5 + 0.1 for p in w] + [np.float32(b) for b in (0.4, -0.7)[:num_gates(arrangement)]]
  offsets = v[4:] if num_gates(arrangement) else [0.0, 0.0]
  (x, y), = client_batches(8, [6])
  result, = process.evaluate(
      weights, [batches_dataset([(x, y)])], [ModelWeights(trainable=v, non_trainable=[])]
  )
  g1 = np.maximum(x @ w[0] + w[1], 0)
  l1 = np.maximum(x @ v[0] + v[1], 0)
  logits = attach(g1, l1, offsets[0], arrangement.match_scale) @ v[2] + v[3]
  if arrangement.attach_logits:
    logits = attach(g1 @ w[2] + w[3], logits, offsets[1], arrangement.match_scale)
  assert result['sparse_categorical_accuracy'] == pytest.approx(
      np.mean(np.argmax(logits, axis=1) == y)
  )
  shifted = logits - logits.max(axis=1, keepdims=True)
  log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
  assert result['loss'] == pytest.approx(-np.mean(log_p[np.arange(len(y)), y]), rel=1e-5)


def test_intertwinement_statistics(arrangement):
  models = dual.DualModel(MODEL, dual.Intertwining(*arrangement))
  rng = np.random.default_rng(5)
  w = [rng.normal(size=p.shape).astype(np.float32) for p in models.global_model.get_weights()]
  v = [rng.normal(size=p.shape).astype(np.float32) for p in models.local_model.get_weights()]
  models.global_model.set_weights(w)
  models.local_model.set_weights(v)
  offsets = [np.float32(b) for b in (0.4, -0.7)[:num_gates(arrangement)]]
  for module, b in zip(models.attaching_modules, offsets):
    module.offset.assign(b)
  offsets = offsets or [0.0, 0.0]
  (x, _), = client_batches(2, [6])
  g1, l1 = np.maximum(x @ w[0] + w[1], 0), np.maximum(x @ v[0] + v[1], 0)
  norm = lambda h: np.linalg.norm(h, axis=1)
  gate = lambda g, l, b: sigmoid(
      np.sum(g * l, axis=1) / (np.maximum(norm(l), 1e-6) * np.sqrt(l.shape[1])) + b
  )
  expected = [(np.mean(gate(g1, l1, offsets[0])), np.mean(norm(g1)) / np.mean(norm(l1)))]
  if arrangement.attach_logits:
    g2, l2 = g1 @ w[2] + w[3], attach(g1, l1, offsets[0], arrangement.match_scale) @ v[2] + v[3]
    expected.append((np.mean(gate(g2, l2, offsets[1])), np.mean(norm(g2)) / np.mean(norm(l2))))
  np.testing.assert_allclose(models.intertwinement(x), expected, rtol=1e-5)


@pytest.fixture(scope='module')
def own_global_process():
  return lindt.build(
      MODEL, lindt.Hparams(own_global=True),
      common.Common(client_learning_rate=LEARNING_RATE, seed=6),
  )


def test_own_global_keeps_the_trained_global_model_at_the_client(own_global_process):
  process = own_global_process
  signature = process.next.type_signature
  weights = '<trainable=<float32[2,3],float32[3],float32[3,2],float32[2]>,non_trainable=<>>'
  personal = f'<model={weights},global_model={weights}>'
  assert str(signature.parameter[2]) == '{' + personal + '}@CLIENTS'
  assert str(signature.result[1]) == '{' + personal + '}@CLIENTS'
  state = process.initialize()
  w = process.get_model_weights(state).trainable
  start = process.initial_personal_state('new', process.get_model_weights(state))
  for a, b in zip(start['global_model'].trainable, w):
    np.testing.assert_array_equal(a, b)  # A new client's copy: the current G.
  v = local_weights(w, ARRANGEMENTS['attach_logits'], seed=3)
  (x, y), = client_batches(4, [5])
  stale = ModelWeights(trainable=[p + 1.0 for p in w], non_trainable=[])
  output = run_next(
      process, state, [batches_dataset([(x, y)])],
      [{'model': ModelWeights(trainable=v, non_trainable=[]), 'global_model': stale}],
  )
  expected_w, expected_v = reference_step(w, v, x, y, ARRANGEMENTS['attach_logits'])
  # Training is unchanged (the kept copy is not read) ...
  for actual, expected in zip(output.personal_states[0]['model'].trainable, expected_v):
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-6)
  # ... and the client keeps w as its steps left it (the one client's
  # update is also the server's, so the new global model equals it).
  for actual, expected in zip(output.personal_states[0]['global_model'].trainable, expected_w):
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-6)


def test_own_global_predicts_with_the_kept_global_model(own_global_process):
  process = own_global_process
  current = process.get_model_weights(process.initialize())
  own = [p * -0.7 + 0.2 for p in current.trainable]
  v = [p * 0.5 + 0.1 for p in current.trainable]
  (x, y), = client_batches(8, [6])
  personal = {'model': ModelWeights(trainable=v, non_trainable=[]),
              'global_model': ModelWeights(trainable=own, non_trainable=[])}
  result, = process.evaluate(current, [batches_dataset([(x, y)])], [personal])
  g1 = np.maximum(x @ own[0] + own[1], 0)
  l1 = np.maximum(x @ v[0] + v[1], 0)
  logits = attach(g1 @ own[2] + own[3], attach(g1, l1) @ v[2] + v[3])
  shifted = logits - logits.max(axis=1, keepdims=True)
  log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
  assert result['loss'] == pytest.approx(-np.mean(log_p[np.arange(len(y)), y]), rel=1e-5)


@pytest.mark.parametrize(
    'noise_multiplier, window, when_blind, detached',
    [(1.0, 1, True, True),  # A detector would be blind: G detached.
     (1.0, None, True, True),  # The same without the detector (one round).
     (1.0, 40, True, False),  # Averaged over 40 rounds the detector sees.
     (0.01, 1, True, False),  # It sees through this noise.
     (1.0, 1, False, False),  # The rule switched off.
     (None, 1, True, False)],  # No DP.
)
def test_g_is_detached_while_dp_noise_would_blind_the_detector(
    noise_multiplier, window, when_blind, detached
):
  config = detector.DetectorConfig(warmup_rounds=1, window=window or 1, threshold=0.1)
  setting = dp.DpSetting(noise_multiplier or 0.0, clip_norm=1.0, clients_per_round=2)
  options = common.Common(
      nfl_detector=config if window else None,
      dp_setting=setting if noise_multiplier else None,
  )
  # 1,000 weights, K = 2, C = 1 (nfl/detector.py): sqrt(2000 s^4 + 4 s^2 + (10 z / 2)^2) / 2
  # with s = z / 2, over sqrt(window): noise 6.1x the largest divergence at z = 1,
  # 0.97x over 40 rounds, 2.6% at z = 0.01.
  expected = {1.0: 6.144, 0.01: 0.0255, None: 0.0}[noise_multiplier] / np.sqrt(window or 1)
  assert options.noise_to_signal(1000) == pytest.approx(expected, rel=2e-3)
  for paper in (lindt.Hparams(), lindt.Hparams(attach_logits=False, match_scale=True)):
    paper = dataclasses.replace(paper, detach_when_blind=when_blind)
    resolved = lindt.resolve_intertwining(paper, options, 1000)
    assert resolved == dual.Intertwining(
        paper.attach_logits, paper.learn_gates, paper.match_scale, detach_global=detached
    )
  # Detached by its own flag, it stays detached.
  always = lindt.Hparams(detach_global=True, detach_when_blind=when_blind)
  assert lindt.resolve_intertwining(always, options, 1000) == dual.Intertwining(detach_global=True)


def test_a_model_with_skip_connections_across_blocks_is_refused():
  with pytest.raises(ValueError, match='no place for attaching modules'):
    lindt.build(
      cifar100.resnet_spec(), lindt.Hparams(),
      common.Common(client_learning_rate=0.1),
  )
  with pytest.raises(ValueError, match='at least two blocks'):
    lindt.build(
      test_utils.tiny_model_spec(), lindt.Hparams(),
      common.Common(client_learning_rate=0.1),
  )


def on_detection_process(stop, threshold, learn_gates=False, own_global=False):
  from tff_personal.nfl import detector  # pylint: disable=g-import-not-at-top

  return lindt.build(
      MODEL,
      lindt.Hparams(
          mode='on_detection', stop=stop, learn_gates=learn_gates, own_global=own_global
      ),
      common.Common(
          client_learning_rate=LEARNING_RATE,
          seed=6,
          nfl_detector=detector.DetectorConfig(warmup_rounds=0, window=1, threshold=threshold),
      ),
  )


@pytest.fixture(scope='module')
def flagging_processes():
  """Threshold 0: the flag rises after round 1, so round 2 trains dual."""
  return {stop: on_detection_process(stop, 0.0) for stop in lindt.STOPS}


def test_before_the_flag_clients_run_fedavg(flagging_processes):
  from tff_personal.algorithms import fedavg  # pylint: disable=g-import-not-at-top

  process = flagging_processes['persist']
  reference = fedavg.build(
      MODEL, fedavg.Hparams(),
      common.Common(client_learning_rate=LEARNING_RATE, seed=6),
  )
  state = process.initialize()
  weights = process.get_model_weights(state)
  data = [batches_dataset(client_batches(i, [4, 3])) for i in (1, 2)]
  start = [process.initial_personal_state(c, weights) for c in 'ab']
  output = run_next(process, state, data, start)
  expected = run_next(reference, reference.initialize(), data, [{}, {}])
  for a, b in zip(process.get_model_weights(output.state).trainable,
                  reference.get_model_weights(expected.state).trainable):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
  assert [int(p['dual_rounds']) for p in output.personal_states] == [0, 0]
  assert output.metrics['nfl']['flagged'] == 1
  # Before its first dual round a client's L is the global model it received.
  for a, b in zip(output.personal_states[0]['model'].trainable, weights.trainable):
    np.testing.assert_array_equal(a, b)


def rounds_of_one_client(process, num_rounds):
  """[(the global weights a round sent, the client's P after it)] of one client."""
  state = process.initialize()
  personal = [process.initial_personal_state('a', process.get_model_weights(state))]
  history = []
  for round_num in range(num_rounds):
    received = process.get_model_weights(state)
    output = run_next(
        process, state, [batches_dataset(client_batches(round_num, [4, 3]))], personal
    )
    state, personal = output.state, list(output.personal_states)
    history.append((received, personal[0]))
  return history


@pytest.mark.parametrize('stop, expected_dual_rounds', [('persist', 2), ('after_one_round', 1)])
def test_after_the_flag_dual_training_and_its_stop(flagging_processes, stop, expected_dual_rounds):
  history = rounds_of_one_client(flagging_processes[stop], 3)
  assert [int(p['dual_rounds']) for _, p in history] == [0, 1, expected_dual_rounds]


def test_learned_gates_stay_at_zero_until_the_first_dual_round():
  history = rounds_of_one_client(on_detection_process('persist', 0.0, learn_gates=True), 2)
  offsets = [[float(b) for b in p['model'].trainable[4:]] for _, p in history]
  assert offsets[0] == [0.0, 0.0]  # FedAvg round: L follows G, gates untouched.
  assert all(b != 0.0 for b in offsets[1])  # The dual round trained them.


def test_on_detection_own_global_follows_g_until_the_first_dual_round():
  # FedAvg, then dual (the flag is up), then FedAvg again (one dual round each).
  history = rounds_of_one_client(on_detection_process('after_one_round', 0.0, own_global=True), 3)
  assert int(history[-1][1]['dual_rounds']) == 1
  received = [weights.trainable for weights, _ in history]
  kept = [p['global_model'].trainable for _, p in history]
  for a, b in zip(kept[0], received[0]):  # Before the first dual round: the G received.
    np.testing.assert_array_equal(a, b)
  assert any(not np.array_equal(a, b) for a, b in zip(kept[1], received[1]))  # Trained.
  for a, b in zip(kept[2], kept[1]):  # After its one dual round: kept, not replaced.
    np.testing.assert_array_equal(a, b)


def test_clients_without_a_dual_round_are_evaluated_with_the_global_model(flagging_processes):
  from tff_personal.algorithms import fedavg  # pylint: disable=g-import-not-at-top

  process = flagging_processes['persist']
  weights = process.get_model_weights(process.initialize())
  (x, y), = client_batches(8, [6])
  never = {'model': ModelWeights(trainable=[p * 0.5 + 0.1 for p in weights.trainable],
                                 non_trainable=[]), 'dual_rounds': np.int32(0)}
  result, = process.evaluate(weights, [batches_dataset([(x, y)])], [never])
  reference = fedavg.build(
      MODEL, fedavg.Hparams(),
      common.Common(client_learning_rate=LEARNING_RATE, seed=6),
  )
  expected, = reference.evaluate(weights, [batches_dataset([(x, y)])], [{}])
  assert result['loss'] == pytest.approx(expected['loss'], rel=1e-6)


def test_on_detection_needs_the_detector():
  with pytest.raises(ValueError, match='needs the NFL detector'):
    lindt.build(
      MODEL, lindt.Hparams(mode='on_detection'),
      common.Common(client_learning_rate=0.1),
  )


def test_a_sequence_model_takes_attaching_modules():
  """Shakespeare's char RNN (time dimension unknown): embedding and GRU outputs
  [batch, time, units] are intertwined per example over all steps."""
  from tff_personal.tasks import shakespeare  # pylint: disable=g-import-not-at-top

  spec = shakespeare.build_shakespeare_model_spec(sequence_length=5)
  dual.check_chain(spec)  # Raised "mixed types" before: input shape (None, None).
  models = dual.DualModel(spec)
  tokens = tf.constant([[1, 5, 9, 0, 0], [3, 3, 2, 7, 1]], tf.int64)
  global_logits, local_logits = models.dual(tokens)
  assert global_logits.shape == local_logits.shape == (2, 5, shakespeare.VOCAB_SIZE)
  # G's branch is the global model itself.
  np.testing.assert_allclose(global_logits, models.global_model(tokens), atol=1e-6)
