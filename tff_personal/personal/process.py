"""The personalized iterative process shared by every algorithm.

TFF's `tff.learning.templates.LearningProcess` has `next(state, data)`: it
cannot keep a client's variables from one round to the next. FedPer, Ditto,
LINDT, APFL and Local all need that, so every algorithm of tff_personal is a
`PersonalizedProcess` (in the spirit of TFF's `examples/stateful_clients`):

  initialize: ( -> S@SERVER)
  next: (<state=S@SERVER, client_data={C}@CLIENTS, personal_states={P}@CLIENTS>
         -> <state=S@SERVER, personal_states={P}@CLIENTS, metrics=M@SERVER>)
  get_model_weights: (S -> W)  the shared (global) model weights in the state
  evaluate: (<model_weights=W@SERVER, client_data={D*}@CLIENTS,
              personal_states={P}@CLIENTS> -> {E}@CLIENTS)
     each client's metrics of its own model (shared part + its personal part)
     on its own data, left at CLIENTS (the program reads them per client).
  finetuned_evaluation(learning_rate): the same clients' models fine-tuned
     on their own training data first (`evaluation.per_client`).

Composed processes (`personal.compose`: every algorithm) also offer `split_round`:
the same round as two calls, for runtimes that would otherwise train the
clients twice (`SplitRound`, `build_round`).

C, a client's input, is its dataset D* or, for processes that simulate
update attacks, <data=D*, role, seed> (`client_input` builds it).

Personal states P appear only at CLIENTS: `check_personal_states_stay_at_clients`
verifies the placements on the type signatures for every process. Algorithms
without personal state (FedAvg) use the empty struct `<>` for P.
"""

import collections
from typing import Any, Callable, NamedTuple, Optional

import tensorflow as tf
import tensorflow_federated as tff


InitialPersonalStateFn = Callable[[str, Any], Any]
ClientInputFn = Callable[[Any, int, int], Any]


class PersonalizedProcessOutput(NamedTuple):
  """The result of `PersonalizedProcess.next`."""

  state: Any
  personal_states: Any
  metrics: Any


PERSONAL_STATE = 'personal_state'


def sent_to_server_type(client_result_type: tff.StructType) -> tff.StructType:
  """A client result <personal_state=P, ...> without its personal state."""
  return tff.StructWithPythonType(
      [(name, t) for name, t in tff.structure.iter_elements(client_result_type)
       if name != PERSONAL_STATE],
      collections.OrderedDict,
  )


class SplitRound(NamedTuple):
  """`next` as two calls: the clients' work, then the server's.

    client_phase: (<S@SERVER, {C}@CLIENTS, {P}@CLIENTS> -> {R}@CLIENTS),
      R = <personal_state=P, update, ...> (the client's whole result)
    server_phase: (<S@SERVER, {R without personal_state}@CLIENTS>
                   -> <S@SERVER, M@SERVER>)

  Same results as `next`. For TFF's mergeable context (several workers):
  TFF 0.87 compiles `next` into a pass up to the aggregation and one after
  it, and the pass after it computes the client-placed results (personal
  states) again, so every client trains twice; the client phase has no
  aggregation and runs once on each worker. The clients' results (their
  updates) then travel to the program, which runs the server phase on its
  own machine's worker (`context.call_on_local_worker`): behind 1 Gbit/s
  links, sending them back to the workers cost more than the second
  training pass (docs/results_scale.md).
  """

  client_phase: tff.Computation
  server_phase: tff.Computation


def build_round(state_type, client_data_type, personal_states_type, client_result_type,
                client_part, server_part) -> tuple[tff.Computation, SplitRound]:
  """`next` and its `SplitRound`, both built from the round's two parts.

  Args:
    state_type, client_data_type, personal_states_type: `next`'s parameter
      types (S@SERVER, {C}@CLIENTS, {P}@CLIENTS).
    client_result_type: R, a client's result, with a `personal_state` P.
    client_part: `(state, client_data, personal_states) -> {R}@CLIENTS`, in
      a federated computation.
    server_part: `(state, client results) -> (S@SERVER, M@SERVER)`; reads
      no personal state.
  """

  @tff.federated_computation(state_type, client_data_type, personal_states_type)
  def next_fn(state, client_data, personal_states):
    client_results = client_part(state, client_data, personal_states)
    new_state, metrics = server_part(state, client_results)
    return PersonalizedProcessOutput(new_state, client_results.personal_state, metrics)

  @tff.federated_computation(state_type, client_data_type, personal_states_type)
  def client_phase(state, client_data, personal_states):
    return client_part(state, client_data, personal_states)

  @tff.federated_computation(
      state_type, tff.FederatedType(sent_to_server_type(client_result_type), tff.CLIENTS)
  )
  def server_phase(state, client_results):
    return server_part(state, client_results)

  return next_fn, SplitRound(client_phase, server_phase)


def run_split_round(split: SplitRound, state, client_data, personal_states,
                    run_client_phase=None, run_server_phase=None) -> 'PersonalizedProcessOutput':
  """`next(state, client_data, personal_states)` as the two calls of `split`.

  `run_client_phase(client_phase, arg)` calls the first (default: directly),
  e.g. with the clients' results matched to them by key;
  `run_server_phase(server_phase, arg)` the second, e.g. on another context.
  """
  arg = (state, client_data, personal_states)
  if run_client_phase is None:
    results = split.client_phase(*arg)
  else:
    results = run_client_phase(split.client_phase, arg)
  sent = [
      collections.OrderedDict((k, v) for k, v in r.items() if k != PERSONAL_STATE)
      for r in results
  ]
  if run_server_phase is None:
    new_state, metrics = split.server_phase(state, sent)
  else:
    new_state, metrics = run_server_phase(split.server_phase, (state, sent))
  return PersonalizedProcessOutput(new_state, [r[PERSONAL_STATE] for r in results], metrics)


class PersonalizedProcess(tff.templates.IterativeProcess):
  """An iterative process whose clients keep personal state between rounds.

  See the module docstring for the type signatures.
  """

  def __init__(
      self,
      initialize_fn: tff.Computation,
      next_fn: tff.Computation,
      get_model_weights: tff.Computation,
      evaluate_fn: tff.Computation,
      initial_personal_state_fn: InitialPersonalStateFn,
      client_input_fn: Optional[ClientInputFn] = None,
      finetuned_evaluation_fn: Optional[Callable[[float], tff.Computation]] = None,
      sends_updates: bool = True,
      split_round: Optional[SplitRound] = None,
      takes_whole_client_data: bool = False,
      clients_train_independently: bool = False,
  ):
    """Builds the process from its computations.

    Args:
      initialize_fn: `( -> S@SERVER)`.
      next_fn: see the module docstring.
      get_model_weights: `(S -> W)`.
      evaluate_fn: see the module docstring.
      initial_personal_state_fn: `(client_id, W) -> P` in NumPy, the state of
        a client seen for the first time (given the current shared weights W);
        runs in the program, like the client's own set-up would on a device.
      client_input_fn: `(dataset, role, seed) -> ` a client's `next` input;
        None: the dataset alone (the process takes no attack role).
      finetuned_evaluation_fn: `learning_rate -> ` the fine-tuning
        evaluation computation; None: the process has none.
      sends_updates: False for processes whose clients send the server
        nothing (Local): update attacks then have nothing to act on.
      split_round: `next` as two calls (`SplitRound`); None: not offered.
      takes_whole_client_data: whether a client's `next` input is its whole
        round data (all its `--client_epochs`), of which the process itself
        trains on the first `--client_steps` batches (Ditto's lambda grid
        validates on the whole held-out tenth); False: the program truncates.
      clients_train_independently: `next` returns the server state it was
        given and a client's result depends on its own data and personal
        state only (Local): a client's consecutive rounds may then run as one
        `next` on their batches in sequence (`TrainingConfig.rounds_per_call`).
    """
    super().__init__(initialize_fn, next_fn)
    self._get_model_weights = get_model_weights
    self._evaluate = evaluate_fn
    self._initial_personal_state_fn = initial_personal_state_fn
    self._client_input_fn = client_input_fn
    self._finetuned_evaluation_fn = finetuned_evaluation_fn
    self._finetuned_evaluations = {}
    self._sends_updates = sends_updates
    self._split_round = split_round
    self._takes_whole_client_data = takes_whole_client_data
    self._clients_train_independently = clients_train_independently
    parameter = next_fn.type_signature.parameter
    if len(parameter) != 3:
      raise TypeError(
          'next must take <state@SERVER, client_data@CLIENTS,'
          f' personal_states@CLIENTS>, got {parameter}.'
      )
    self._personal_state_type = parameter[2]
    check_personal_states_stay_at_clients(self)

  @property
  def personal_state_type(self) -> tff.FederatedType:
    """The type `{P}@CLIENTS` of the clients' personal states."""
    return self._personal_state_type

  @property
  def has_personal_state(self) -> bool:
    """Whether P holds any tensor (FedAvg's and FedPer K_P=0's do not)."""
    return tff.types.contains(
        self._personal_state_type.member, lambda t: isinstance(t, tff.TensorType)
    )

  def initial_personal_state(self, client_id: str, model_weights: Any) -> Any:
    """The personal state P of a client seen for the first time."""
    return self._initial_personal_state_fn(client_id, model_weights)

  @property
  def takes_client_roles(self) -> bool:
    """Whether `next` takes each client's attack role (update attacks)."""
    return self._client_input_fn is not None

  def client_input(self, dataset, role: int = 0, seed: int = 0) -> Any:
    """A client's input to `next`: its dataset and, if taken, its role."""
    if self._client_input_fn is None:
      return dataset
    return self._client_input_fn(dataset, role, seed)

  @property
  def split_round(self) -> Optional[SplitRound]:
    """`next` as two calls, or None (`SplitRound`)."""
    return self._split_round

  @property
  def takes_whole_client_data(self) -> bool:
    """Whether the program passes the whole round data, not --client_steps batches."""
    return self._takes_whole_client_data

  @property
  def clients_train_independently(self) -> bool:
    """Whether a client's rounds depend on nothing but its own (Local)."""
    return self._clients_train_independently

  @property
  def sends_updates(self) -> bool:
    """Whether clients send the server an update (not so for Local)."""
    return self._sends_updates

  def finetuned_evaluation(self, learning_rate: float) -> tff.Computation:
    """The fine-tuning evaluation with `learning_rate` (built once per rate)."""
    if self._finetuned_evaluation_fn is None:
      raise ValueError('This process has no fine-tuning evaluation.')
    if learning_rate not in self._finetuned_evaluations:
      self._finetuned_evaluations[learning_rate] = self._finetuned_evaluation_fn(learning_rate=learning_rate)
    return self._finetuned_evaluations[learning_rate]

  @property
  def get_model_weights(self) -> tff.Computation:
    return self._get_model_weights

  @property
  def evaluate(self) -> tff.Computation:
    return self._evaluate


def check_personal_states_stay_at_clients(process: PersonalizedProcess) -> None:
  """Raises `TypeError` unless the signature keeps personal states at CLIENTS.

  `next` must take and return personal states of one type `{P}@CLIENTS` and
  return its state and metrics at SERVER. That no personal *value* reaches the
  server is a property of the body, tested by canary tests.
  """
  personal = process.personal_state_type
  if personal.placement is not tff.CLIENTS or personal.all_equal:
    raise TypeError(f'Personal states must be {{P}}@CLIENTS, got {personal}.')
  result = process.next.type_signature.result
  if not result[1].is_equivalent_to(personal):
    raise TypeError(
        f'next returns personal states of type {result[1]}, expected {personal}.'
    )
  for name, part in (('state', result[0]), ('metrics', result[2])):
    if part.placement is not tff.SERVER:
      raise TypeError(f'next must return its {name} at SERVER, got {part}.')


def empty_personal_states(num_clients: int) -> list[collections.OrderedDict]:
  """The personal states of clients of an algorithm without any (FedAvg)."""
  return [collections.OrderedDict() for _ in range(num_clients)]


def from_learning_process(
    learning_process: tff.learning.templates.LearningProcess,
    initial_model_weights: tff.learning.models.ModelWeights,
    evaluate_fn: tff.Computation,
    finetuned_evaluation_fn: Optional[Callable[[float], tff.Computation]] = None,
) -> PersonalizedProcess:
  """Wraps a `LearningProcess` without personal state (personal P = `<>`).

  `initialize` is the learning process's with its model weights replaced by
  `initial_model_weights` (TFF's initializers are not seeded), and `next`
  passes the (empty) personal states through untouched; everything else is
  the learning process's own computation.
  """
  state_type = learning_process.initialize.type_signature.result
  data_type = learning_process.next.type_signature.parameter[1]
  personal_type = tff.FederatedType(tff.StructType([]), tff.CLIENTS)
  initial_weights_fn = constant_computation(initial_model_weights)

  @tff.federated_computation
  def initialize_fn():
    return tff.federated_map(
        learning_process.set_model_weights,
        (learning_process.initialize(), tff.federated_eval(initial_weights_fn, tff.SERVER)),
    )

  @tff.federated_computation(state_type, data_type, personal_type)
  def next_fn(state, client_data, personal_states):
    output = learning_process.next(state, client_data)
    return PersonalizedProcessOutput(output.state, personal_states, output.metrics)

  return PersonalizedProcess(
      initialize_fn,
      next_fn,
      learning_process.get_model_weights,
      evaluate_fn,
      initial_personal_state_fn=lambda client_id, model_weights: (
          collections.OrderedDict()
      ),
      finetuned_evaluation_fn=finetuned_evaluation_fn,
  )


def constant_computation(value: Any) -> tff.Computation:
  """A no-argument TF computation returning the NumPy structure `value`."""

  @tff.tensorflow.computation
  def constant():
    return tf.nest.map_structure(tf.constant, value)

  return constant
