"""pytest plugin (entry point `pytest11`): placeholder until issue 4 lands."""
