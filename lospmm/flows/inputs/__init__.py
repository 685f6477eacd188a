"""Readers of what a run is given: safetensors checkpoints (weights), ONNX graphs (onnx_model) and
the run's sources, a zoo model or a file with its content hash (sources)."""
