"""Adversaries are chosen once per run: a fixed, seeded fraction."""

import pytest

from tff_personal.attacks import roles

POPULATION = [f'c{i:03d}' for i in range(100)]


def test_fraction_of_the_population_seeded():
  chosen = roles.choose_adversaries(POPULATION, 0.2, seed=4)
  assert len(chosen) == 20 and chosen <= set(POPULATION)
  assert chosen == roles.choose_adversaries(POPULATION, 0.2, seed=4)
  assert chosen != roles.choose_adversaries(POPULATION, 0.2, seed=5)
  assert roles.choose_adversaries(POPULATION, 0.0, seed=4) == frozenset()


@pytest.mark.parametrize('fraction', [-0.1, 1.0, 1.5])
def test_fraction_out_of_range(fraction):
  with pytest.raises(ValueError, match=r'in \[0, 1\)'):
    roles.choose_adversaries(POPULATION, fraction, seed=0)


def test_update_roles():
  assert roles.update_role('random_update') == roles.RANDOM_UPDATE
  assert roles.update_role('model_replacement') == roles.MODEL_REPLACEMENT
  assert roles.update_role('label_poison') == roles.HONEST
