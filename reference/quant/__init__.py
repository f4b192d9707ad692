"""Quantization formats built from the element codecs: MXFP4 first."""
