"""What runs the acting forward: the `Actor` seam (`actor`) and, behind it, ONNX Runtime
(`onnx_backend`, with its graph rewrites in `onnx_graph`). Nothing outside this folder knows
about ONNX."""
