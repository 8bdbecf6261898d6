"""Tests of the Stack Overflow tasks on tiny files in TFF's exact formats."""

import collections
import dataclasses
import io
import json
import os
import tarfile

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_personal.tasks import base
from tff_personal.tasks import options as task_options
from tff_personal.tasks import registry
from tff_personal.tasks import sqlite_format
from tff_personal.tasks import stackoverflow

# (split, client, tokens, title, tags). `carol` has no test examples, `dave`
# no train examples, `erin` is a held-out user: none of them is a task client.
_POSTS = (
    ('train', 'alice', 'the cat sat', 'cats', 'python|pets'),
    ('train', 'alice', 'the dog', 'dogs', 'python'),
    ('test', 'alice', 'the cat ate the dog', 'x', 'java|pets'),
    ('train', 'bob', 'a cat', 'cats', 'java'),
    ('test', 'bob', 'the end', 'y', 'python'),
    ('train', 'carol', 'zebra zebra zebra', 'z', 'zoo'),
    ('test', 'dave', 'dog', 'd', 'pets'),
    ('heldout', 'erin', 'cat', 'c', 'pets'),
)
# Counts in TFF's formats, ranked differently from the clients' words/tags.
_WORD_COUNTS = (('the', 100), ('dog', 50), ('cat', 20), ('zebra', 10))
_TAG_COUNTS = {'pets': 5, 'java': 9, 'python': 7}


def _write_database(cache_dir):
  def rows():
    for i, (split, client, tokens, title, tags) in enumerate(_POSTS):
      yield split, client, sqlite_format.serialize_example({
          'creation_date': f'2010-01-0{i + 1} 00:00:00 UTC',
          'score': i - 2,
          'tags': tags,
          'title': title,
          'tokens': tokens,
          'type': 'question' if i % 2 else 'answer',
      })

  sqlite_format.write_client_data(os.path.join(cache_dir, 'stackoverflow.sqlite'), rows())


def _write_count_files(cache_dir, archives=True):
  """TFF's cached count files: `datasets/<name>` and `datasets/<name>.tar.bz2`."""
  folder = os.path.join(cache_dir, 'datasets')
  os.makedirs(folder, exist_ok=True)
  contents = {
      'stackoverflow.word_count': ''.join(f'{w} {c}\n' for w, c in _WORD_COUNTS),
      'stackoverflow.tag_count': json.dumps(_TAG_COUNTS),
  }
  for name, text in contents.items():
    with open(os.path.join(folder, name), 'w') as f:
      f.write(text)
    if archives:
      with tarfile.open(os.path.join(folder, name + '.tar.bz2'), 'w:bz2') as tar:
        data = text.encode()
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


@pytest.fixture(scope='module')
def clients_dir(tmp_path_factory):
  """A cache with the database only."""
  cache_dir = str(tmp_path_factory.mktemp('so_clients'))
  _write_database(cache_dir)
  return cache_dir


@pytest.fixture(scope='module')
def counts_dir(tmp_path_factory):
  """A cache with the database and the extracted count files."""
  cache_dir = str(tmp_path_factory.mktemp('so_counts'))
  _write_database(cache_dir)
  _write_count_files(cache_dir, archives=False)
  return cache_dir


def _options(cache_dir, task='word', vocab_source='auto', **kwargs):
  return task_options.TaskOptions(
      cache_dir=cache_dir, stackoverflow_task=task,
      stackoverflow_vocab_source=vocab_source, **kwargs,
  )


def _batches(dataset):
  return list(dataset.as_numpy_iterator())


def _train_batches(task, client_id):
  """A client's train split, preprocessed as for evaluation (no shuffle)."""
  raw = task.train_data.create_tf_dataset_for_client(client_id)
  return _batches(task.preprocess_eval(raw, 8))


def test_tiny_database_through_tff_loader(clients_dir):
  train, heldout, test = tff.simulation.datasets.stackoverflow.load_data(cache_dir=clients_dir)
  assert train.client_ids == ['alice', 'bob', 'carol']
  assert heldout.client_ids == ['erin']
  first = next(train.create_tf_dataset_for_client('alice').as_numpy_iterator())
  assert first == collections.OrderedDict(
      creation_date=b'2010-01-01 00:00:00 UTC', score=-2, tags=b'python|pets',
      title=b'cats', tokens=b'the cat sat', type=b'answer',
  )


def test_clients_have_train_and_test(clients_dir):
  train, test = stackoverflow.load_clients(clients_dir)
  assert train.client_ids == test.client_ids == ['alice', 'bob']
  tokens = [e['tokens'] for e in test.create_tf_dataset_for_client('bob').as_numpy_iterator()]
  assert tokens == [b'the end']


def test_vocabularies_counted_from_clients(clients_dir):
  train, _ = stackoverflow.load_clients(clients_dir)
  words, tags = stackoverflow.count_vocabs_from_clients(train, train.client_ids)
  # `cat`: 2 users; `the`: 1 user, 2 uses; then alphabetical. `zebra` is carol's.
  assert words == ['cat', 'the', 'a', 'dog', 'sat']
  assert tags == ['python', 'java', 'pets']
  # Only the first client in sorted order: alice.
  words, tags = stackoverflow.count_vocabs_from_clients(
      train, ['bob', 'alice'], 2, 1, max_clients=1
  )
  assert (words, tags) == (['the', 'cat'], ['python'])


def test_vocabularies_from_count_files(counts_dir):
  assert stackoverflow.load_word_vocab_from_count_file(counts_dir, 3) == ['the', 'dog', 'cat']
  assert stackoverflow.load_tag_vocab_from_count_file(counts_dir, 2) == ['java', 'python']
  assert stackoverflow.load_tag_vocab_from_count_file(counts_dir) == ['java', 'python', 'pets']


def test_count_files_through_tff_loaders(tmp_path, monkeypatch):
  """Our tiny count files load with TFF's own loaders, as our code reads them.

  TFF's loaders accept only their archives (a SHA-256 check); the check is
  bypassed here, and downloading made to fail.
  """
  from keras.src.utils import data_utils  # pylint: disable=g-import-not-at-top

  def no_download(*args):
    raise AssertionError(f'Tried to download {args[0]}')

  monkeypatch.setattr(data_utils, 'validate_file', lambda *args, **kwargs: True)
  monkeypatch.setattr(data_utils, 'urlretrieve', no_download)
  cache_dir = str(tmp_path)
  _write_count_files(cache_dir)
  loaders = tff.simulation.datasets.stackoverflow
  assert loaders.load_word_counts(cache_dir=cache_dir, vocab_size=3) == collections.OrderedDict(
      [('the', 100), ('dog', 50), ('cat', 20)]
  )
  assert loaders.load_tag_counts(cache_dir=cache_dir) == collections.OrderedDict(
      [('java', 9), ('python', 7), ('pets', 5)]
  )
  # Our reader goes through TFF's loader for TFF's archives (which re-extract).
  word_archive, word_file = stackoverflow.count_file_paths(cache_dir, 'word')
  tag_archive, tag_file = stackoverflow.count_file_paths(cache_dir, 'tag')
  monkeypatch.setattr(stackoverflow, '_is_tff_archive', lambda path, sha: True)
  os.remove(word_file)
  os.remove(tag_file)
  assert stackoverflow.load_word_vocab_from_count_file(cache_dir, 2) == ['the', 'dog']
  assert stackoverflow.load_tag_vocab_from_count_file(cache_dir, 1) == ['java']
  assert os.path.isfile(word_file) and os.path.isfile(tag_file)


def test_other_archives_need_their_extracted_file(tmp_path):
  cache_dir = str(tmp_path)
  _write_count_files(cache_dir)
  archive, extracted = stackoverflow.count_file_paths(cache_dir, 'word')
  assert not stackoverflow._is_tff_archive(archive, stackoverflow._WORD_COUNT_SHA256)
  assert stackoverflow.count_files_available(cache_dir, 'word')
  os.remove(extracted)  # Only an archive that is not TFF's: unusable.
  assert not stackoverflow.count_files_available(cache_dir, 'word')
  with pytest.raises(base.DataUnavailableError, match='stackoverflow.word_count.tar.bz2'):
    stackoverflow.load_word_vocab_from_count_file(cache_dir)


def test_missing_database_raises_data_unavailable(tmp_path):
  with pytest.raises(base.DataUnavailableError) as error:
    stackoverflow.build_stackoverflow_task(_options(str(tmp_path)))
  message = str(error.value)
  assert os.path.join(str(tmp_path), 'stackoverflow.sqlite') in message
  assert stackoverflow.SQLITE_URL in message
  assert 'tff-datasets-public/stackoverflow.sqlite.lzma' in message
  assert 'unlzma' in message and '--cache_dir' in message
  assert '\n' not in message
  assert not os.listdir(tmp_path)


@pytest.mark.parametrize('task', ['word', 'tag'])
def test_missing_count_files_raise_data_unavailable(clients_dir, task):
  with pytest.raises(base.DataUnavailableError) as error:
    stackoverflow.build_stackoverflow_task(_options(clients_dir, task, 'count_files'))
  message = str(error.value)
  assert os.path.join(clients_dir, 'datasets', 'stackoverflow.word_count.tar.bz2') in message
  assert os.path.join(clients_dir, 'datasets', 'stackoverflow.word_count') in message
  assert stackoverflow.WORD_COUNT_URL in message
  assert '--cache_dir' in message and '\n' not in message


def test_missing_tag_counts_raise_data_unavailable(tmp_path):
  cache_dir = str(tmp_path)
  _write_database(cache_dir)
  _write_count_files(cache_dir, archives=False)
  os.remove(stackoverflow.count_file_paths(cache_dir, 'tag')[1])
  with pytest.raises(base.DataUnavailableError, match='stackoverflow.tag_count.tar.bz2'):
    stackoverflow.build_stackoverflow_task(_options(cache_dir, 'tag', 'count_files'))
  # The word task needs no tag counts.
  task = stackoverflow.build_stackoverflow_task(_options(cache_dir, 'word', 'count_files'))
  assert task.client_ids == ['alice', 'bob']


def test_word_task_with_vocab_from_clients(clients_dir):
  task = stackoverflow.build_stackoverflow_task(_options(clients_dir, sequence_length=4))
  assert task.name == 'stackoverflow_word'
  assert task.client_ids == task.test_data.client_ids == ['alice', 'bob']
  # Vocabulary cat, the, a, dog, sat = 1..5; oov 6, bos 7, eos 8, pad 0.
  [(x, y)] = _batches(task.test_dataset('alice', batch_size=8))
  np.testing.assert_array_equal(x, [[7, 2, 1, 6]])  # Truncated: no eos.
  np.testing.assert_array_equal(y, [[2, 1, 6, 2]])
  [(x, y)] = _train_batches(task, 'alice')
  np.testing.assert_array_equal(x, [[7, 2, 1, 5], [7, 2, 4, 8]])
  np.testing.assert_array_equal(y, [[2, 1, 5, 8], [2, 4, 8, 0]])
  model = task.model.build()
  assert model(x).shape == (2, 4, 5 + 4)
  assert [b[0] for b in task.model.blocks] == ['embedding', 'lstm', 'dense', 'logits']
  assert {l.name for l in model.layers if l.weights} == {b[0] for b in task.model.blocks}
  assert task.model.tff_model_fn().input_spec == task.model.input_spec


def test_word_task_with_count_files(counts_dir):
  for source in ('auto', 'count_files'):
    task = stackoverflow.build_stackoverflow_task(
        _options(counts_dir, 'word', source, sequence_length=4), word_vocab_size=3
    )
    # Vocabulary the, dog, cat = 1..3; oov 4, bos 5, eos 6.
    (x, y), = _train_batches(task, 'alice')
    np.testing.assert_array_equal(x, [[5, 1, 3, 4], [5, 1, 2, 6]])
    np.testing.assert_array_equal(y, [[1, 3, 4, 6], [1, 2, 6, 0]])
    assert task.model.build().output_shape == (None, None, 3 + 4)
  # Explicitly from clients, although count files are there.
  task = stackoverflow.build_stackoverflow_task(
      _options(counts_dir, 'word', 'clients', sequence_length=4)
  )
  (x, _), = _batches(task.test_dataset('alice', batch_size=8))
  np.testing.assert_array_equal(x, [[7, 2, 1, 6]])


def test_word_task_default_sequence_length_and_metrics(clients_dir):
  task = stackoverflow.build_stackoverflow_task(_options(clients_dir))
  x, y = next(iter(task.test_dataset('alice', batch_size=8)))
  assert x.shape == y.shape == (1, 20)
  np.testing.assert_array_equal(y[0, :6], [2, 1, 6, 2, 4, 8])
  assert task.model.input_spec[0].shape.as_list() == [None, 20]
  metrics = task.model.metrics()
  assert [m.name for m in metrics] == [
      'accuracy', 'accuracy_without_out_of_vocab',
      'accuracy_without_out_of_vocab_or_end_of_sentence',
  ]
  # Targets: cat, oov, eos, pad; predictions: right, right, right, pad.
  target = tf.constant([[1, 6, 8, 0]])
  prediction = tf.one_hot([[1, 6, 8, 0]], 9)
  assert [float(m(target, prediction)) for m in metrics] == [1.0, 1.0, 1.0]
  prediction = tf.one_hot([[1, 2, 2, 0]], 9)
  values = [float(m(target, prediction)) for m in task.model.metrics()]
  assert values == pytest.approx([1 / 3, 1 / 2, 1.0])


def test_tag_task_with_count_files(counts_dir):
  task = stackoverflow.build_stackoverflow_task(
      _options(counts_dir, 'tag', 'count_files'), word_vocab_size=3, tag_vocab_size=2
  )
  assert task.name == 'stackoverflow_tag'
  # Words the, dog, cat; tags java, python. Body + title, oov words ignored.
  (x, y), = _train_batches(task, 'alice')
  np.testing.assert_allclose(x, [[0.5, 0.0, 0.5], [0.5, 0.5, 0.0]])
  np.testing.assert_array_equal(y, [[0, 1], [0, 1]])
  (x, y), = _batches(task.test_dataset('alice', batch_size=8))
  np.testing.assert_allclose(x, [[0.5, 0.25, 0.25]])  # the cat ate the dog x: 4 known
  np.testing.assert_array_equal(y, [[1, 0]])  # java|pets
  spec = task.model
  assert [s.shape.as_list() for s in spec.input_spec] == [[None, 3], [None, 2]]
  assert spec.blocks == [['classifier']]
  assert [m.name for m in spec.metrics()] == ['recall_at_5', 'precision']
  model = spec.build()
  assert model(x).shape == (1, 2)
  assert isinstance(spec.loss(), tf.keras.losses.BinaryCrossentropy)
  assert spec.tff_model_fn().input_spec == spec.input_spec


def test_tag_task_with_vocab_from_clients(clients_dir):
  task = stackoverflow.build_stackoverflow_task(_options(clients_dir, 'tag'))
  # Words cat, the, a, dog, sat; tags python, java, pets.
  (x, y), = _batches(task.test_dataset('bob', batch_size=8))
  np.testing.assert_allclose(x, [[0.0, 1.0, 0.0, 0.0, 0.0]])  # the end y
  np.testing.assert_array_equal(y, [[1, 0, 0]])
  assert task.model.build().output_shape == (None, 3)


def test_seeded_shuffle_gives_the_same_batches(clients_dir):
  task = stackoverflow.build_stackoverflow_task(_options(clients_dir, sequence_length=4))

  def batches(seed):
    dataset = task.train_dataset('alice', epochs=3, batch_size=1, seed=seed)
    return np.concatenate([x for x, _ in dataset.as_numpy_iterator()])

  first = batches(5)
  assert first.shape == (6, 4)
  np.testing.assert_array_equal(first, batches(5))
  orders = {tuple(batches(seed)[:, 3]) for seed in range(4)}
  assert len(orders) > 1


def test_unknown_task_is_rejected(clients_dir):
  with pytest.raises(ValueError, match='stackoverflow_task'):
    stackoverflow.build_stackoverflow_task(_options(clients_dir, 'title'))
  with pytest.raises(ValueError, match='stackoverflow_vocab_source'):
    stackoverflow.build_stackoverflow_task(_options(clients_dir, 'word', 'files'))


def test_registry_builds_stackoverflow(clients_dir):
  task = registry.build_task('stackoverflow', dataclasses.replace(_options(clients_dir), seed=3))
  assert task.client_ids == ['alice', 'bob']
