"""edgehft's version (a module of its own, so box-side modules can name it without importing the package)."""
VERSION = "0.3.0"
