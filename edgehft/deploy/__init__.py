"""Deploy bundles to boxes over SSH and check what they run.

- :mod:`edgehft.deploy.ssh` — the OpenSSH transport (strict host keys, no shell injection);
- :mod:`edgehft.deploy.agent` — the program that runs on the box (``python -m edgehft.deploy.agent``);
- :mod:`edgehft.deploy.store` — the box's install directory (versions, atomic ``current`` switch);
- :mod:`edgehft.deploy.probe` — what a box is, and whether it is the board a bundle needs (each backend's
  rules in :mod:`edgehft.deploy.probe_rules`, one module per backend);
- :mod:`edgehft.deploy.remote` — the agent's steps, called from the host;
- :mod:`edgehft.deploy.deploy` — the host side of deploy, status and rollback;
- :mod:`edgehft.deploy.inventory` — ``--hosts FILE``.
"""
