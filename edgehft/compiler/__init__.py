"""The compiler front end (host only, needs ``edgehft[compile]``): load -> quantize -> lower to the
TFLite IR -> golden vectors and drift check -> bundle. TensorFlow runs only in an isolated worker."""
