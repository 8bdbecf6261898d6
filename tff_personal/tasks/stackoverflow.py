"""Stack Overflow next-word and tag prediction, as TFF's baseline tasks.

Data: the real `tff.simulation.datasets.stackoverflow.load_data`, one client
per Stack Overflow user (Reddi et al. 2021, https://arxiv.org/abs/2003.00295).
It reads `<cache_dir>/stackoverflow.sqlite` and would download it when
missing; we check first and raise `base.DataUnavailableError` instead, so a
run never touches the network.

Clients: TFF's `train` and `test` splits hold different periods of the same
users (`heldout` holds other users and is not used). A task's clients are the
users with examples in both `train` and `test`, so every client has its own
test split.

Tasks (`TaskOptions.stackoverflow_task`), preprocessed with TFF's baseline
code (`tff.simulation.baselines.stackoverflow`) after a seeded shuffle (TFF's
shuffle is unseeded; runs must be reproducible):
  * `word`: next-word prediction. The 10,000 most frequent words, ids
    `1..10000`, pad 0, oov 10001, bos 10002, eos 10003; each post is
    `[bos, first 20 words, eos]` (no eos when truncated), padded to 21, input
    = first 20, target = last 20. Model: a small LSTM
    (`tff_personal.models.rnn.build_word_lstm`). Metrics, as TFF: `accuracy`
    (pad masked, the task's accuracy), `accuracy_without_out_of_vocab` and
    `accuracy_without_out_of_vocab_or_end_of_sentence` (also masking oov,
    and eos).
  * `tag`: the 500 most frequent tags from a bag of words of body + title
    (counts of the 10,000 words, divided by the number of in-vocabulary
    words), multi-hot targets; logistic regression
    (`tff_personal.models.linear`), binary cross-entropy averaged over tags
    and examples (TFF sums over examples), metrics `recall_at_5`
    (`Recall(top_k=5)`, the task's accuracy) and `precision`.

Vocabularies (`TaskOptions.stackoverflow_vocab_source`):
  * `count_files`: TFF's count files, as `load_word_counts`/`load_tag_counts`
    cache them: `<cache_dir>/datasets/stackoverflow.{word,tag}_count.tar.bz2`
    (Keras' `get_file`, subfolder `datasets`) extracted next to it as
    `stackoverflow.word_count` (`<word> <count>` lines, most frequent first)
    and `stackoverflow.tag_count` (JSON `{tag: count}`). When the archive is
    TFF's own (its SHA-256 matches) we call TFF's loader, which then cannot
    download; otherwise we read the extracted file, same format, same parsing.
  * `clients`: counted from the `train` split of the first
    `MAX_VOCAB_CLIENTS` (1,000) task clients in sorted id order, as TFF's
    files count: the number of users using a word (tag), ties broken by total
    occurrences, then alphabetically.
  * `auto`: the count files when cached, else `clients`.
"""

import collections
import hashlib
import json
import os
from typing import Iterable, Sequence

from absl import logging
import tensorflow as tf
import tensorflow_federated as tff

from tff_personal.models import linear
from tff_personal.models import model_spec
from tff_personal.models import rnn
from tff_personal.tasks import base
from tff_personal.tasks import options as task_options

_BASELINE = tff.simulation.baselines.stackoverflow
_WORD_PREPROCESSING = _BASELINE.word_prediction_preprocessing
_TAG_PREPROCESSING = _BASELINE.tag_prediction_preprocessing
_KERAS_METRICS = tff.simulation.baselines.keras_metrics

WORD_VOCAB_SIZE = _BASELINE.DEFAULT_WORD_VOCAB_SIZE  # 10,000
TAG_VOCAB_SIZE = _BASELINE.DEFAULT_TAG_VOCAB_SIZE  # 500
DEFAULT_SEQUENCE_LENGTH = _BASELINE.DEFAULT_SEQUENCE_LENGTH  # 20
SHUFFLE_BUFFER_SIZE = 1000  # TFF's default.
MAX_VOCAB_CLIENTS = 1000

# Origins and archive hashes as in `tff.simulation.datasets.stackoverflow`.
_URL_PREFIX = 'https://storage.googleapis.com/tff-datasets-public/'
SQLITE_URL = _URL_PREFIX + 'stackoverflow.sqlite.lzma'
WORD_COUNT_URL = _URL_PREFIX + 'stackoverflow.word_count.tar.bz2'
TAG_COUNT_URL = _URL_PREFIX + 'stackoverflow.tag_count.tar.bz2'
_WORD_COUNT_SHA256 = '1dc00256d6e527c54b9756d968118378ae14e6692c0b3b6cad470cdd3f0c519c'
_TAG_COUNT_SHA256 = '6fe281cec490d9384a290d560072438e7e2b377bbb823876ce7bd6f82696772d'

TASKS = ('word', 'tag')
VOCAB_SOURCES = ('auto', 'count_files', 'clients')


def sqlite_path(cache_dir: str) -> str:
  """The database TFF's `load_data` reads (and would download)."""
  return os.path.join(cache_dir, 'stackoverflow.sqlite')


def count_file_paths(cache_dir: str, kind: str) -> tuple[str, str]:
  """`(archive, extracted file)` of TFF's `word` or `tag` counts."""
  extracted = os.path.join(cache_dir, 'datasets', f'stackoverflow.{kind}_count')
  return extracted + '.tar.bz2', extracted


def check_sqlite(cache_dir: str) -> str:
  """The database path; `DataUnavailableError` (one line) if it is missing."""
  path = sqlite_path(cache_dir)
  if not os.path.isfile(path):
    raise base.DataUnavailableError(
        f'StackOverflow data not found: {path} is missing. Download'
        f' {SQLITE_URL}, decompress it with `unlzma stackoverflow.sqlite.lzma`'
        ' (or `xz -d --format=lzma`) into that folder, or pass'
        ' --cache_dir=<folder holding stackoverflow.sqlite>.'
    )
  return path


def _is_tff_archive(path: str, sha256: str) -> bool:
  """True if `path` is TFF's archive, so that TFF's loader will not download.

  Keras' `get_file` downloads again when the hash differs, and caches under
  `/tmp/.keras` instead when the cache folder is not writable.
  """
  cache_dir = os.path.dirname(os.path.dirname(path))
  if not os.path.isfile(path) or not os.access(cache_dir, os.W_OK):
    return False
  digest = hashlib.sha256()
  with open(path, 'rb') as f:
    for chunk in iter(lambda: f.read(1 << 20), b''):
      digest.update(chunk)
  return digest.hexdigest() == sha256


def _count_file_source(cache_dir: str, kind: str) -> str:
  """`tff` (TFF's archive), `extracted` (the extracted file) or `` (none)."""
  archive, extracted = count_file_paths(cache_dir, kind)
  sha256 = _WORD_COUNT_SHA256 if kind == 'word' else _TAG_COUNT_SHA256
  if _is_tff_archive(archive, sha256):
    return 'tff'
  return 'extracted' if os.path.isfile(extracted) else ''


def count_files_available(cache_dir: str, kind: str) -> bool:
  """Whether TFF's `word` or `tag` counts are cached under `cache_dir`."""
  return bool(_count_file_source(cache_dir, kind))


def _check_count_file(cache_dir: str, kind: str) -> str:
  source = _count_file_source(cache_dir, kind)
  if not source:
    archive, extracted = count_file_paths(cache_dir, kind)
    url = WORD_COUNT_URL if kind == 'word' else TAG_COUNT_URL
    raise base.DataUnavailableError(
        f'StackOverflow {kind} counts not found: {archive} (TFF\'s archive) or'
        f' its extracted {extracted} is missing. Download {url} into that'
        ' folder (`tar -xjf` it there, optional), pass --cache_dir=<folder'
        ' holding datasets/>, or count the vocabulary from the clients'
        ' (stackoverflow_vocab_source=clients).'
    )
  return source


def load_word_vocab_from_count_file(
    cache_dir: str, vocab_size: int = WORD_VOCAB_SIZE
) -> list[str]:
  """The `vocab_size` most frequent words of TFF's word count file."""
  _, extracted = count_file_paths(cache_dir, 'word')
  if _check_count_file(cache_dir, 'word') == 'tff':
    counts = tff.simulation.datasets.stackoverflow.load_word_counts(
        cache_dir=cache_dir, vocab_size=vocab_size
    )
    return list(counts)[:vocab_size]
  logging.info('Reading word counts from %s.', extracted)
  words = []
  with open(extracted) as f:
    for line in f:
      if len(words) >= vocab_size:
        break
      word, _ = line.split()
      words.append(word)
  return words


def load_tag_vocab_from_count_file(
    cache_dir: str, vocab_size: int = TAG_VOCAB_SIZE
) -> list[str]:
  """The `vocab_size` most frequent tags of TFF's tag count file."""
  _, extracted = count_file_paths(cache_dir, 'tag')
  if _check_count_file(cache_dir, 'tag') == 'tff':
    counts = tff.simulation.datasets.stackoverflow.load_tag_counts(cache_dir=cache_dir)
    return list(counts)[:vocab_size]
  logging.info('Reading tag counts from %s.', extracted)
  with open(extracted) as f:
    counts = json.load(f)
  # A stable sort, as TFF's loader: ties keep the file's order.
  return sorted(counts, key=lambda tag: counts[tag], reverse=True)[:vocab_size]


def _most_frequent(
    users: collections.Counter, occurrences: collections.Counter, size: int
) -> list[str]:
  ranked = sorted(users, key=lambda item: (-users[item], -occurrences[item], item))
  return ranked[:size]


def count_vocabs_from_clients(
    train_data: tff.simulation.datasets.ClientData,
    client_ids: Sequence[str],
    word_vocab_size: int = WORD_VOCAB_SIZE,
    tag_vocab_size: int = TAG_VOCAB_SIZE,
    max_clients: int = MAX_VOCAB_CLIENTS,
) -> tuple[list[str], list[str]]:
  """Word and tag vocabularies counted from clients' raw examples.

  Counts the clients using each word of `tokens` (split on spaces) and each
  tag of `tags` (split on `|`), over the first `max_clients` of
  `sorted(client_ids)`; ranks by that count, then by total occurrences, then
  alphabetically.
  """
  counted_ids = sorted(client_ids)[:max_clients]
  logging.info('Counting words and tags of %d clients.', len(counted_ids))
  word_users, word_occurrences = collections.Counter(), collections.Counter()
  tag_users, tag_occurrences = collections.Counter(), collections.Counter()
  for cid in counted_ids:
    words, tags = collections.Counter(), collections.Counter()
    dataset = train_data.create_tf_dataset_for_client(cid)
    dataset = dataset.map(lambda e: (e['tokens'], e['tags'])).batch(4096)
    for tokens_batch, tags_batch in dataset.as_numpy_iterator():
      for tokens, example_tags in zip(tokens_batch, tags_batch):
        words.update(w for w in tokens.decode().split(' ') if w)
        tags.update(t for t in example_tags.decode().split('|') if t)
    word_users.update(words.keys())
    word_occurrences.update(words)
    tag_users.update(tags.keys())
    tag_occurrences.update(tags)
  return (
      _most_frequent(word_users, word_occurrences, word_vocab_size),
      _most_frequent(tag_users, tag_occurrences, tag_vocab_size),
  )


def _use_count_files(cache_dir: str, vocab_source: str, kinds: Iterable[str]) -> bool:
  if vocab_source not in VOCAB_SOURCES:
    raise ValueError(
        f'Unknown stackoverflow_vocab_source {vocab_source!r}; allowed:'
        f' {", ".join(VOCAB_SOURCES)}.'
    )
  if vocab_source == 'count_files':
    for kind in kinds:
      _check_count_file(cache_dir, kind)
    return True
  if vocab_source == 'auto':
    return all(count_files_available(cache_dir, kind) for kind in kinds)
  return False


def load_clients(
    cache_dir: str,
) -> tuple[tff.simulation.datasets.ClientData, tff.simulation.datasets.ClientData]:
  """TFF's `train` and `test` splits, restricted to clients that have both."""
  check_sqlite(cache_dir)
  train, _, test = tff.simulation.datasets.stackoverflow.load_data(cache_dir=cache_dir)
  client_ids = sorted(set(train.client_ids) & set(test.client_ids))
  if not client_ids:
    raise ValueError(
        f'No client of {sqlite_path(cache_dir)} has both train and test examples.'
    )
  logging.info(
      'StackOverflow: %d clients with train and test examples (of %d train and'
      ' %d test clients).',
      len(client_ids), len(train.client_ids), len(test.client_ids),
  )
  from_fn = tff.simulation.datasets.ClientData.from_clients_and_tf_fn
  return (
      from_fn(client_ids, train.serializable_dataset_fn),
      from_fn(client_ids, test.serializable_dataset_fn),
  )


def _shuffle_repeat(dataset, epochs, seed):
  return base.shuffled_epochs(dataset, epochs, seed, SHUFFLE_BUFFER_SIZE)


def _eval_spec(batch_size):
  return tff.simulation.baselines.ClientSpec(
      num_epochs=1, batch_size=batch_size, shuffle_buffer_size=1
  )


def create_word_preprocess_fns(
    vocab: Sequence[str], sequence_length: int = DEFAULT_SEQUENCE_LENGTH
):
  """`(preprocess_train, preprocess_eval)` of next-word prediction.

  Batches of `(x, y)` int64 `[batch, sequence_length]`; training shuffles
  the posts with `seed` (reshuffled each epoch) and repeats them `epochs`
  times, then both apply TFF's `word_prediction_preprocessing`.
  """
  vocab = list(vocab)

  def tff_preprocess(batch_size):
    return _WORD_PREPROCESSING.create_preprocess_fn(
        _eval_spec(batch_size), vocab, sequence_length=sequence_length
    )

  def preprocess_train(dataset, epochs, batch_size, seed):
    return tff_preprocess(batch_size)(_shuffle_repeat(dataset, epochs, seed))

  def preprocess_eval(dataset, batch_size):
    return tff_preprocess(batch_size)(dataset)

  return preprocess_train, preprocess_eval


def create_tag_preprocess_fns(word_vocab: Sequence[str], tag_vocab: Sequence[str]):
  """`(preprocess_train, preprocess_eval)` of tag prediction.

  Batches of `(x, y)`: float32 `[batch, len(word_vocab)]` normalized word
  counts of body and title, float32 `[batch, len(tag_vocab)]` multi-hot
  tags, by TFF's `tag_prediction_preprocessing`, after a seeded shuffle and
  repeat for training.
  """
  word_vocab, tag_vocab = list(word_vocab), list(tag_vocab)

  def tff_preprocess(batch_size):
    return _TAG_PREPROCESSING.create_preprocess_fn(
        _eval_spec(batch_size), word_vocab, tag_vocab
    )

  def preprocess_train(dataset, epochs, batch_size, seed):
    return tff_preprocess(batch_size)(_shuffle_repeat(dataset, epochs, seed))

  def preprocess_eval(dataset, batch_size):
    return tff_preprocess(batch_size)(dataset)

  return preprocess_train, preprocess_eval


def build_word_model_spec(
    vocab_size: int, sequence_length: int = DEFAULT_SEQUENCE_LENGTH
) -> model_spec.ModelSpec:
  """The word LSTM over `vocab_size` words + 4 special tokens, TFF's metrics."""
  special = _WORD_PREPROCESSING.get_special_tokens(vocab_size)
  pad, oov, eos = special.padding, special.out_of_vocab, special.end_of_sentence
  extended_vocab_size = vocab_size + special.get_number_of_special_tokens()
  spec = tf.TensorSpec([None, sequence_length], tf.int64)
  masked_accuracy = _KERAS_METRICS.MaskedCategoricalAccuracy
  return model_spec.ModelSpec(
      build=lambda: rnn.build_word_lstm(extended_vocab_size),
      blocks=[list(b) for b in rnn.WORD_LSTM_BLOCKS],
      loss=lambda: tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      metrics=lambda: [
          masked_accuracy(masked_tokens=[pad], name='accuracy'),
          masked_accuracy(
              masked_tokens=[pad] + oov, name='accuracy_without_out_of_vocab'
          ),
          masked_accuracy(
              masked_tokens=[pad, eos] + oov,
              name='accuracy_without_out_of_vocab_or_end_of_sentence',
          ),
      ],
      input_spec=(spec, spec),
  )


def build_tag_model_spec(word_vocab_size: int, tag_vocab_size: int) -> model_spec.ModelSpec:
  """Logistic regression from bags of words to tags, recall@5 first."""
  return model_spec.ModelSpec(
      build=lambda: linear.build_logistic_regression(word_vocab_size, tag_vocab_size),
      blocks=[list(b) for b in linear.LOGISTIC_REGRESSION_BLOCKS],
      loss=tf.keras.losses.BinaryCrossentropy,
      metrics=lambda: [
          tf.keras.metrics.Recall(top_k=5, name='recall_at_5'),
          tf.keras.metrics.Precision(name='precision'),
      ],
      input_spec=(
          tf.TensorSpec([None, word_vocab_size], tf.float32),
          tf.TensorSpec([None, tag_vocab_size], tf.float32),
      ),
  )


def build_stackoverflow_task(
    options: task_options.TaskOptions,
    *,
    word_vocab_size: int = WORD_VOCAB_SIZE,
    tag_vocab_size: int = TAG_VOCAB_SIZE,
) -> base.Task:
  """The `word` or `tag` task from `task_options.TaskOptions`.

  Uses `options.cache_dir`, `options.stackoverflow_task`,
  `options.stackoverflow_vocab_source` and `options.sequence_length`
  (`word` only; 0: TFF's 20). Smaller vocabularies are for tests. Raises
  `base.DataUnavailableError` when a needed file is missing.
  """
  if options.stackoverflow_task not in TASKS:
    raise ValueError(
        f'Unknown stackoverflow_task {options.stackoverflow_task!r}; allowed:'
        f' {", ".join(TASKS)}.'
    )
  cache_dir = options.cache_dir
  check_sqlite(cache_dir)
  is_word = options.stackoverflow_task == 'word'
  kinds = ('word',) if is_word else ('word', 'tag')
  use_count_files = _use_count_files(
      cache_dir, options.stackoverflow_vocab_source, kinds
  )
  train_data, test_data = load_clients(cache_dir)

  if use_count_files:
    word_vocab = load_word_vocab_from_count_file(cache_dir, word_vocab_size)
    tag_vocab = []
    if not is_word:
      tag_vocab = load_tag_vocab_from_count_file(cache_dir, tag_vocab_size)
  else:
    word_vocab, tag_vocab = count_vocabs_from_clients(
        train_data, train_data.client_ids, word_vocab_size, tag_vocab_size
    )
  logging.info(
      'StackOverflow %s: %d words, %d tags, from %s.', options.stackoverflow_task,
      len(word_vocab), len(tag_vocab), 'count files' if use_count_files else 'clients',
  )

  if is_word:
    sequence_length = options.sequence_length or DEFAULT_SEQUENCE_LENGTH
    model = build_word_model_spec(len(word_vocab), sequence_length)
    preprocess_train, preprocess_eval = create_word_preprocess_fns(
        word_vocab, sequence_length
    )
  else:
    model = build_tag_model_spec(len(word_vocab), len(tag_vocab))
    preprocess_train, preprocess_eval = create_tag_preprocess_fns(word_vocab, tag_vocab)
  return base.Task(
      name=f'stackoverflow_{options.stackoverflow_task}',
      train_data=train_data,
      test_data=test_data,
      model=model,
      preprocess_train=preprocess_train,
      preprocess_eval=preprocess_eval,
      # The classifier: word logits, or the whole logistic regression.
      default_personal_blocks=1,
  )
