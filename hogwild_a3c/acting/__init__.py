"""What runs the acting forward: the `Actor` seam (`actor`) and, behind it, ONNX Runtime
(`onnx_backend`). Nothing outside this folder knows about ONNX."""
