"""The TFF execution context and the processes it owns."""
