"""The compiler front end (host only, needs ``edgehft[compile]``): load -> quantize -> lower to the
TFLite IR -> golden vectors and drift check -> the board's stage -> bundle. TensorFlow runs only in an
isolated worker (``worker``, ``isolate``).

``pipeline.compile_model`` is the same for every board; the board-specific part is its backend's compiler
stage (the contract in ``stage``; ``stage_<backend>.py`` each, over ``coral``, ``pynq``, ``jetson`` and the
cpu board's plans: ``plans``, ``native``, ``native_moves``), found by name through :mod:`edgehft.backends`."""
