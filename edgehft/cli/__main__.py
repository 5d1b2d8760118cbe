"""``python -m edgehft.cli``: the same command line as ``edgehft``."""
from edgehft.cli import main

main()
