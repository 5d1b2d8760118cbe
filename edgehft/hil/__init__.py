"""Hardware-in-the-loop tests: the checks a bundle is held to on its board (``checks``), where they run
(``target``: this machine or a box) and the pytest plugin that puts them in a test session (``plugin``,
registered as the ``pytest11`` entry point ``edgehft``). No TensorFlow: this runs on the board."""
