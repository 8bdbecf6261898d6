"""Simulated malicious clients: data poisoning and update attacks."""
