"""edgehft: put trained Keras models on low-latency trading boards.

Importing edgehft never imports TensorFlow: the runtime (:mod:`edgehft.runtime`) runs on boards that
only have numpy and a TFLite interpreter. The compiler (:mod:`edgehft.compiler`) needs
``pip install 'edgehft[compile]'``.
"""
__version__ = "0.3.0"
