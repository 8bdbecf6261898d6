"""tff_personal: personalized federated learning on TensorFlow Federated.

Importing this package has no side effects; call
`tff_personal.runtime.context.install_local_context()` (the binaries do) before
running any TFF computation.
"""
