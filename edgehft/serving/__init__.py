"""Serving on the box (issue 17): :func:`edgehft.serve` returns an in-process :class:`Server` that answers
``predict`` from the install directory's active version and hot-swaps new versions after a shadow run
(:mod:`edgehft.serving.server`; the directory watch: :mod:`edgehft.serving.watch`)."""
from edgehft.serving.server import Server, ShadowPolicy, serve

__all__ = ["Server", "ShadowPolicy", "serve"]
