"""`--device`: the worker's device report, its environment and the checks."""

import mmap
import os

import pytest
import tensorflow as tf

from tff_personal.runtime import context
from tff_personal.runtime import devices

# As TFF 0.87's worker logs it on this machine (session_provider.cc).
CPU_ONLY_LOG = (
    '2026-12-02 00:26:42.174637: I external/org_tensorflow/tensorflow/core/platform/'
    'cpu_feature_guard.cc:182] This TensorFlow binary is optimized ...\n'
    '2026-12-02 00:26:42.194945: I tensorflow_federated/cc/core/impl/executors/'
    'session_provider.cc:108] Found devices: [/physical_device:CPU:0]\n'
    '2026-12-02 00:26:42.195002: I tensorflow_federated/cc/core/impl/executors/'
    'session_provider.cc:127] Found:\n\t0 GPUs\n\t0 TPUS\nin total\n'
)
# The same report from a worker with two GPUs (absl::StrJoin with ",").
TWO_GPU_LOG = (
    'I session_provider.cc:108] Found devices:'
    ' [/physical_device:CPU:0,/physical_device:GPU:0,/physical_device:GPU:1]\n'
)


def test_parse_device_report():
  assert devices.parse_device_report(CPU_ONLY_LOG) == ('/physical_device:CPU:0',)
  found = devices.parse_device_report(TWO_GPU_LOG)
  assert found == ('/physical_device:CPU:0', '/physical_device:GPU:0', '/physical_device:GPU:1')
  assert devices.gpus(found) == ('/physical_device:GPU:0', '/physical_device:GPU:1')
  assert devices.describe(found) == 'GPU:0, GPU:1 (and the CPU)'
  assert devices.describe(devices.parse_device_report(CPU_ONLY_LOG)) == 'CPU only'
  assert devices.parse_device_report('TFF ExecutorService started\n') is None
  # A restarted worker appends a new report: the last one counts.
  assert devices.parse_device_report(TWO_GPU_LOG + CPU_ONLY_LOG) == ('/physical_device:CPU:0',)


def test_worker_environment():
  env = {'PATH': '/bin', 'TF_CPP_MIN_LOG_LEVEL': '2'}
  assert devices.worker_environment(env, 'auto') == {'PATH': '/bin', 'TF_CPP_MIN_LOG_LEVEL': '0'}
  assert devices.worker_environment(env, 'gpu') == {'PATH': '/bin', 'TF_CPP_MIN_LOG_LEVEL': '0'}
  assert devices.worker_environment(env, 'cpu') == {
      'PATH': '/bin', 'TF_CPP_MIN_LOG_LEVEL': '0', 'CUDA_VISIBLE_DEVICES': '-1'
  }
  assert env == {'PATH': '/bin', 'TF_CPP_MIN_LOG_LEVEL': '2'}  # Not changed.
  with pytest.raises(ValueError, match="unknown device 'tpu'; allowed: auto, cpu, gpu"):
    devices.worker_environment(env, 'tpu')


def test_check():
  cpu_only = ('/physical_device:CPU:0',)
  with_gpu = cpu_only + ('/physical_device:GPU:0',)
  for device in ('auto', 'cpu'):
    devices.check(device, cpu_only, '/w')
  for device in ('auto', 'gpu'):
    devices.check(device, with_gpu, '/w')
  with pytest.raises(devices.DeviceError) as excinfo:
    devices.check('gpu', cpu_only, '/w')
  message = str(excinfo.value)
  assert message.startswith('--device=gpu: the TFF worker (/w) found no GPU, only [/physical_device:CPU:0].')
  assert '--config=cuda' in message and '--worker_binary' in message
  with pytest.raises(devices.DeviceError, match='--device=cpu: the TFF worker .* still found GPU:0'):
    devices.check('cpu', with_gpu, '/w')


def test_unused_gpus_warning():
  cpu_only = ('/physical_device:CPU:0',)
  warning = devices.unused_gpus_warning(cpu_only, ['/physical_device:GPU:0'], '/w')
  assert warning.startswith(
      'TensorFlow sees 1 GPU(s) but the TFF worker (/w) found none: client training runs on the CPU.'
  )
  assert '--worker_binary' in warning
  assert devices.unused_gpus_warning(cpu_only, [], '/w') is None
  assert devices.unused_gpus_warning(
      cpu_only + ('/physical_device:GPU:0',), ['/physical_device:GPU:0'], '/w') is None


def _contains(path: str, text: bytes) -> bool:
  with open(path, 'rb') as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
    return data.find(text) >= 0


def test_the_pip_worker_binary_has_no_gpu_device_code():
  """What README "GPU" states; fails when a TFF release ships a CUDA worker."""
  framework = os.path.join(os.path.dirname(tf.__file__), 'libtensorflow_framework.so.2')
  for symbol in (b'GPUDeviceFactory', b'cuda_gpu_executor'):
    assert _contains(framework, symbol)  # TensorFlow's CUDA wheel has them.
    assert not _contains(context.worker_binary_path(), symbol)


@pytest.mark.parametrize('device', ['auto', 'cpu'])
def test_a_worker_reports_its_devices(device):
  worker = context.WorkerProcess(device=device)
  worker.start()
  try:
    with open(f'/proc/{worker.pid}/environ', 'rb') as f:
      environment = f.read().split(b'\0')
    assert (b'CUDA_VISIBLE_DEVICES=-1' in environment) == (device == 'cpu')
    # The worker's log is an unlinked temporary file: nothing is left behind.
    assert os.readlink(f'/proc/{worker.pid}/fd/2').endswith('.log (deleted)')
    found = context.probe_devices(worker)
    assert found == worker.devices
    assert '/physical_device:CPU:0' in found
    if device == 'cpu':
      assert not devices.gpus(found)
  finally:
    worker.stop()


def test_gpu_fails_at_start_up_with_the_pip_worker():
  worker = context.WorkerProcess(device='gpu')
  worker.start()
  try:
    with pytest.raises(devices.DeviceError, match='--device=gpu: the TFF worker .* found no GPU'):
      context.probe_devices(worker)
  finally:
    worker.stop()


def test_bad_worker_binary(tmp_path):
  with pytest.raises(ValueError, match=f'no TFF worker binary at {tmp_path}/absent'):
    context.WorkerProcess(binary=str(tmp_path / 'absent'))
  not_executable = tmp_path / 'worker'
  not_executable.write_text('')
  with pytest.raises(ValueError, match='is not executable'):
    context.WorkerProcess(binary=str(not_executable))


def test_the_installed_worker_cannot_switch_device(tff_context):
  del tff_context  # This process's local worker (device auto).
  with pytest.raises(RuntimeError, match='already installed; cannot switch to .* device cpu'):
    context.install_local_context(device='cpu')
  with pytest.raises(devices.DeviceError, match='--device=gpu'):
    context.install_local_context(device='gpu')
  assert context.install_local_context(device='auto').devices == ('/physical_device:CPU:0',)


def test_a_named_worker_log_is_appended_to(tmp_path, monkeypatch):
  log = tmp_path / 'worker.log'
  log.write_text('an earlier run: Found devices: [/physical_device:GPU:7]\n')
  monkeypatch.setenv('TFF_PERSONAL_WORKER_LOG', str(log))
  worker = context.WorkerProcess()
  worker.start()
  try:
    assert context.probe_devices(worker) == ('/physical_device:CPU:0',)  # Not the earlier run's.
  finally:
    worker.stop()
  assert log.read_text().startswith('an earlier run')
  assert 'Found devices: [/physical_device:CPU:0]' in log.read_text()
