"""edgehft: put trained Keras models on low-latency trading boards.

Importing edgehft never imports TensorFlow: the runtime (:mod:`edgehft.runtime`) runs on boards that
only have numpy and a TFLite interpreter. The compiler (:mod:`edgehft.compiler`) needs
``pip install 'edgehft[compile]'``.
"""
from edgehft.version import VERSION as __version__  # noqa: E402 (pyproject.toml says it too)


def serve(install_dir, **options):
    """``edgehft.serve(install_dir)``: an in-process server of the box's active version with hot swap after a
    shadow run (:func:`edgehft.serving.serve`, whose docstring lists ``options``)."""
    from edgehft.serving import serve as _serve
    return _serve(install_dir, **options)
