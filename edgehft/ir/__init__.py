"""The IR: the int8 TFLite flatbuffer, read with the TFLite schema (``tflite_model``; ground floor, imports
nothing of ours), checked before anything runs it (``validate``), and the vendors' own formats around it:
the Edge TPU compiler's package inside ``edgetpu-custom-op`` (``edgetpu_package``) and TensorRT's engine
inspector output (``tensorrt_inspector``)."""
from edgehft.ir.tflite_model import OpInfo, QuantParams, SubgraphInfo, TensorInfo, TFLiteModel

__all__ = ["OpInfo", "QuantParams", "SubgraphInfo", "TensorInfo", "TFLiteModel"]
