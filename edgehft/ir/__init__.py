"""The IR: the int8 TFLite flatbuffer, read with the TFLite schema (ground floor, imports nothing of ours)."""
from edgehft.ir.tflite_model import OpInfo, QuantParams, SubgraphInfo, TensorInfo, TFLiteModel

__all__ = ["OpInfo", "QuantParams", "SubgraphInfo", "TensorInfo", "TFLiteModel"]
