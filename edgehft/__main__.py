"""``python -m edgehft ...`` is the ``edgehft`` command."""
from edgehft.cli import main

main()
