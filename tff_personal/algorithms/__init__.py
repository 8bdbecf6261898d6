"""Federated algorithms, one module each, all `PersonalizedProcess`es."""
