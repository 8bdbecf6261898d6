"""Federated tasks: client data + model + default personalization split."""
