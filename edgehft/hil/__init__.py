"""Hardware-in-the-loop tests: the checks a bundle is held to on its board (``checks``, over the golden and
window checks of :mod:`edgehft.bundle_checks` that ``run`` and ``bench`` use too), where they run (``target``:
this machine or a box), the plugin's options (``options``), the words for their results (``summary``) and the
pytest plugin that puts them in a test session (``plugin``, registered as the ``pytest11`` entry point
``edgehft``) with its pytest-xdist side (``workers``). No TensorFlow: this runs on the board."""
