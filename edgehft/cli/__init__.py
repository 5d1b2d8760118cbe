"""The ``edgehft`` command line, one module per command group, all on the ``main`` group of
:mod:`edgehft.cli.common` (``--json`` on each for machines; exit codes as in :mod:`edgehft.errors`):

- :mod:`~edgehft.cli.compile`: ``compile``
- :mod:`~edgehft.cli.run`: ``run``, ``bench``
- :mod:`~edgehft.cli.inspect`: ``report``, ``boards``
- a backend's own commands, added from its ``commands`` (:mod:`edgehft.backends`): ``build-engine``
  (:mod:`~edgehft.cli.engine_jetson`)
- :mod:`~edgehft.cli.deploy`: ``deploy``, ``status``, ``rollback``
- :mod:`~edgehft.cli.sign`: ``sign``

The command modules import :mod:`edgehft.cli.common`, never this package, so there is no import cycle.
"""
from edgehft.cli.common import add_backend_commands, drop_clashing_board_options, main
from edgehft.cli import compile, deploy, inspect, run, serve, sign  # noqa: F401,E402  (each registers its commands)

add_backend_commands(main)            # a backend's own commands (jetson: build-engine)
drop_clashing_board_options(main)     # a backend's option may not shadow edgehft's own or an earlier backend's

__all__ = ["main"]
